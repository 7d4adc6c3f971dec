//! `--stacks` and its outputs, shared by `run` and `monitor`.

use std::path::PathBuf;

use super::Fatal;
use crate::profile::Profile;
use crate::profile::stacks::{DEFAULT_MAX_ENTRIES, StackProfile};
use crate::sink::flamegraph::FlameGraph;
use crate::sink::recording::PendingOutput;
use crate::tracker::stacks::{MAX_HZ, StackSampler};

/// Energy flame graphs: options shared by `run` and `monitor`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct StackArgs {
    /// Sample user and kernel stacks on every CPU (software cpu-clock
    /// event: works in VMs) and divide each process's energy over its
    /// stacks by their samples, interval by interval. Implied by
    /// --stacks-out and --flamegraph. User stacks need frame pointers
    /// (see docs/flamegraphs.md).
    #[arg(long, help_heading = "Energy flame graphs")]
    pub(crate) stacks: bool,

    /// Stack samples per second per CPU (1 to 10000; default 99, whose
    /// cost is in BENCHMARKS.md). Implies --stacks.
    #[arg(long, value_name = "HZ", value_parser = parse_hz,
          help_heading = "Energy flame graphs")]
    pub(crate) stack_hz: Option<u32>,

    /// Write folded stacks weighted in microjoules to FILE, one line per
    /// domain, process and stack: `package;python3;main;train 123456`
    /// (flamegraph.pl, inferno, speedscope read it; keep one domain with
    /// `grep '^package;' FILE | cut -d';' -f2-`).
    #[arg(long, value_name = "FILE", help_heading = "Energy flame graphs")]
    pub(crate) stacks_out: Option<PathBuf>,

    /// Draw an interactive SVG energy flame graph to FILE (width = energy;
    /// hover for joules, click to zoom, Ctrl-F to search).
    #[arg(long, value_name = "FILE.svg", help_heading = "Energy flame graphs")]
    pub(crate) flamegraph: Option<PathBuf>,

    /// The domain the flame graph shows (default: package where it has
    /// energy, else the first domain that has). Implies --stacks.
    #[arg(long, value_name = "DOMAIN", value_parser = ["package", "core", "dram", "gpu", "wall"],
          help_heading = "Energy flame graphs")]
    pub(crate) flamegraph_domain: Option<String>,

    /// Most distinct (process, stack) entries kept (default 100000); past
    /// it new stacks are merged into one `[other stacks]` frame per
    /// process and counted. About 300 bytes each with typical stacks.
    /// Implies --stacks.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=10_000_000),
          help_heading = "Energy flame graphs")]
    pub(crate) stacks_max: Option<u64>,
}

/// Stack samples per second per CPU by default: off the beat of periodic
/// work at 100 Hz, the usual choice of `perf record -F 99`.
pub(crate) const DEFAULT_HZ: u32 = 99;

fn parse_hz(s: &str) -> Result<u32, String> {
    let hz: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number of samples per second"))?;
    if hz == 0 || hz > MAX_HZ {
        return Err(format!(
            "{hz} Hz is out of range: give 1 to {MAX_HZ} (99 is the usual choice)"
        ));
    }
    Ok(hz)
}

/// The stack outputs, opened before anything starts.
pub(super) struct StackOutputs {
    folded: Option<PendingOutput>,
    svg: Option<PendingOutput>,
    domain: Option<String>,
    hz: u32,
    max: usize,
}

impl StackArgs {
    /// Whether stacks are sampled.
    pub(crate) fn enabled(&self) -> bool {
        self.stacks
            || self.stacks_out.is_some()
            || self.flamegraph.is_some()
            || self.stack_hz.is_some()
            || self.stacks_max.is_some()
            || self.flamegraph_domain.is_some()
    }

    /// Opens the outputs (an unwritable one fails here, before anything
    /// runs); `None` without `--stacks`. `output` is the recording's path,
    /// which no stack output may share.
    pub(super) fn open(
        &self,
        output: Option<&std::path::Path>,
    ) -> Result<Option<StackOutputs>, Fatal> {
        if !self.enabled() {
            return Ok(None);
        }
        let paths = [
            ("--output", output),
            ("--stacks-out", self.stacks_out.as_deref()),
            ("--flamegraph", self.flamegraph.as_deref()),
        ];
        for (i, (a, pa)) in paths.iter().enumerate() {
            for (b, pb) in &paths[i + 1..] {
                if let (Some(pa), Some(pb)) = (pa, pb)
                    && (pa == pb || std::path::absolute(pa).ok() == std::path::absolute(pb).ok())
                {
                    return Err(Fatal::profiler(format!(
                        "{a} and {b} name the same file {}: give each its own",
                        pa.display()
                    )));
                }
            }
        }
        Ok(Some(StackOutputs {
            folded: self
                .stacks_out
                .as_deref()
                .map(|p| PendingOutput::create_for("--stacks-out", p))
                .transpose()
                .map_err(Fatal::profiler)?,
            svg: self
                .flamegraph
                .as_deref()
                .map(|p| PendingOutput::create_for("--flamegraph", p))
                .transpose()
                .map_err(Fatal::profiler)?,
            domain: self.flamegraph_domain.clone(),
            hz: self.stack_hz.unwrap_or(DEFAULT_HZ),
            max: self.stacks_max.map_or(DEFAULT_MAX_ENTRIES, |n| n as usize),
        }))
    }
}

impl StackOutputs {
    /// Starts the sampler into `profile`.
    pub(super) fn start(&self, profile: &mut Profile) -> Result<(), Fatal> {
        let sampler =
            StackSampler::start(self.hz).map_err(|e| Fatal::profiler(format!("--stacks: {e}")))?;
        if !crate::privilege::has(caps::Capability::CAP_SYS_PTRACE) {
            eprintln!(
                "wattprof: --stacks without CAP_SYS_PTRACE: other users' processes' memory maps \
                 cannot be read, so their frames stay unnamed (grant CAP_SYS_PTRACE, or run as root)"
            );
        }
        profile.set_stacks(StackProfile::new(sampler, self.max));
        Ok(())
    }

    /// The sink that writes the folded stacks and the flame graph at the
    /// end.
    pub(super) fn sink(self) -> FlameGraph {
        FlameGraph::new(self.folded, self.svg, self.domain)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_hz;

    #[test]
    fn a_rate_outside_1_to_10_khz_is_refused_with_the_range() {
        assert_eq!(parse_hz("99"), Ok(99));
        assert_eq!(parse_hz("10000"), Ok(10_000));
        assert!(parse_hz("0").expect_err("0").contains("1 to 10000"));
        assert!(parse_hz("10001").expect_err("big").contains("out of range"));
        assert!(parse_hz("fast").expect_err("word").contains("whole number"));
    }
}
