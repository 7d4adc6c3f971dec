//! The recording's stack section: energy per function (`--stacks`).

use serde::{Deserialize, Serialize};

use super::EnergyJ;
use crate::attribution::stacks::StackLedger;
use crate::carbon::CarbonIntensity;

/// The recording's stack section (`stacks`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct StackReport {
    /// Samples per second per CPU.
    pub(crate) hz: u32,
    /// CPUs sampled.
    pub(crate) cpus: usize,
    /// Samples of tasks the kernel took (all processes).
    pub(crate) samples: u64,
    /// Samples of the processes profiled (the command's tree in `run`).
    pub(crate) profiled_samples: u64,
    /// Samples of processes that came and went unseen by the tracker
    /// (their energy too is the rest of the machine's).
    pub(crate) unknown_samples: u64,
    /// Samples of idle CPUs (not reported).
    pub(crate) idle_samples: u64,
    /// Samples lost because the ring buffer was full.
    pub(crate) lost_samples: u64,
    /// Execs lost (their files may be named `[unknown]`).
    pub(crate) lost_execs: u64,
    /// Samples of stacks merged into `[other stacks]` (the bound was
    /// reached).
    pub(crate) merged_samples: u64,
    /// Distinct stacks.
    pub(crate) stacks: usize,
    /// (process, stack) entries held.
    pub(crate) entries: usize,
    /// Memory those took (bytes, estimated).
    pub(crate) memory_bytes: u64,
    /// The functions with the most energy (whole stacks: `energy`; as the
    /// innermost frame: `self_energy`).
    pub(crate) functions: Vec<FunctionReport>,
}

impl StackReport {
    /// The energy its tables show of a function: wall energy where that
    /// is the only figure (a wattmeter alone), else the measured total.
    pub(crate) fn shown_j(&self) -> impl Fn(&EnergyJ) -> f64 + use<> {
        let wall = self.wall_only();
        move |e| if wall { e.wall_j } else { e.total_j }
    }

    /// Whether its functions have wall energy only.
    pub(crate) fn wall_only(&self) -> bool {
        self.functions
            .iter()
            .any(|f| f.energy.total_j == 0.0 && f.energy.wall_j > 0.0)
    }
}

/// One function's energy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FunctionReport {
    /// The frame's name.
    pub(crate) function: String,
    /// Samples with it anywhere on the stack.
    pub(crate) samples: u64,
    /// Samples with it innermost.
    pub(crate) self_samples: u64,
    /// Energy of the stacks it is on.
    pub(crate) energy: EnergyJ,
    /// Energy of the stacks it is innermost in.
    pub(crate) self_energy: EnergyJ,
}

/// The top `top` functions of a ledger, by their own energy (as the
/// innermost frame: the code to change), then by total energy.
pub(crate) fn functions(
    ledger: &StackLedger,
    top: usize,
    span_ns: u64,
    carbon: &CarbonIntensity,
) -> Vec<FunctionReport> {
    ledger
        .functions(top, |w| w.energy.total_uj().max(w.energy.wall_uj))
        .into_iter()
        .map(|f| FunctionReport {
            function: f.function,
            samples: f.total.samples,
            self_samples: f.self_w.samples,
            energy: EnergyJ::new(&f.total.energy, span_ns, carbon),
            self_energy: EnergyJ::new(&f.self_w.energy, span_ns, carbon),
        })
        .collect()
}
