//! A GPU's energy since the last read: its counter, or power readings
//! integrated where the counter cannot be read.

use std::time::Instant;

use nvml_wrapper::error::NvmlError;

use crate::sources::counter::EnergyCounter;

#[derive(Debug)]
pub(super) enum Energy {
    Counter(EnergyCounter),
    Integrate {
        last: Option<(Instant, f64)>,
        carry_uj: f64,
    },
}

/// Why a GPU gave no energy this read.
pub(super) enum Miss {
    /// GPU_IS_LOST.
    Lost,
    /// Anything else: the next read catches up.
    Transient(String),
}

impl From<NvmlError> for Miss {
    fn from(e: NvmlError) -> Self {
        match e {
            NvmlError::GpuLost => Self::Lost,
            e => Self::Transient(e.to_string()),
        }
    }
}

/// The GPU's energy since the previous read.
pub(super) fn read_energy(
    device: &nvml_wrapper::Device<'_>,
    energy: &mut Energy,
    power: &Result<u32, NvmlError>,
) -> Result<u64, Miss> {
    match energy {
        Energy::Counter(c) => Ok(device
            .total_energy_consumption()
            .map(|mj| c.advance(mj).unwrap_or(0))?),
        Energy::Integrate { last, carry_uj } => match power {
            Ok(mw) => {
                let (now, w) = (Instant::now(), f64::from(*mw) / 1e3);
                let uj = last.map_or(0.0, |(t, w0)| {
                    (now - t).as_secs_f64() * (w0 + w) / 2.0 * 1e6
                }) + *carry_uj;
                *last = Some((now, w));
                *carry_uj = uj - uj.floor();
                Ok(uj.floor() as u64)
            }
            Err(NvmlError::GpuLost) => Err(Miss::Lost),
            Err(e) => Err(Miss::Transient(e.to_string())),
        },
    }
}
