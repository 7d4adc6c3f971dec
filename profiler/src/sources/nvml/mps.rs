//! MPS (the Multi-Process Service, which shared inference servers use):
//! the clients run their work through one server process, which holds the
//! GPU's context. NVML lists the server in the compute list and the
//! clients only through `nvmlDeviceGetMPSComputeRunningProcesses_v3`,
//! which nvml-wrapper 0.11 does not wrap: it goes through the raw library
//! ([`Raw`]). The clients are holders like any other process (weighed by
//! their samples), and so is the server (its context's held power is
//! shared with the clients; it does no work of its own).

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlProcessInfo_t};

use super::mig::Raw;

/// At most this many clients are read: a garbage count does not make a
/// huge buffer (MPS allows 48 clients per GPU on Volta, 60 on later ones).
const MAX_CLIENTS: u32 = 1024;

impl Raw {
    /// The MPS clients of the GPU `device`: (pid, GPU memory in bytes).
    /// Where the driver has no such call, or MPS is not running, empty.
    /// `v2`: the driver writes `_v3` entries of another size than the
    /// header's (535.43–535.86), so the `_v2` call is made, whose entries
    /// are the 24 bytes this buffer holds.
    pub(crate) fn mps_clients(
        &self,
        device: nvmlDevice_t,
        v2: bool,
    ) -> Result<Vec<(u32, u64)>, NvmlError> {
        let sym = if v2 {
            self.lib.nvmlDeviceGetMPSComputeRunningProcesses_v2.as_ref()
        } else {
            self.lib.nvmlDeviceGetMPSComputeRunningProcesses_v3.as_ref()
        };
        let call = match nvml_sym(sym) {
            Ok(c) => c,
            // An older driver without the call: no MPS clients to list.
            Err(NvmlError::FailedToLoadSymbol(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        // The count first, then the list; a client that arrives between
        // the two is a count race, tried again.
        for _ in 0..3 {
            let mut count = 0u32;
            // SAFETY: a device handle from NVML; a null buffer asks the count.
            let rc = unsafe { call(device, &mut count, std::ptr::null_mut()) };
            match nvml_try(rc) {
                Ok(()) => return Ok(Vec::new()),
                Err(NvmlError::InsufficientSize(_)) => {}
                Err(NvmlError::NotSupported) => return Ok(Vec::new()),
                Err(e) => return Err(e),
            }
            let n = count.min(MAX_CLIENTS);
            // SAFETY: plain data, zeroed, filled by the call.
            let mut buf: Vec<nvmlProcessInfo_t> = vec![unsafe { std::mem::zeroed() }; n as usize];
            let mut got = n;
            // SAFETY: a buffer of `got` entries.
            let rc = unsafe { call(device, &mut got, buf.as_mut_ptr()) };
            match nvml_try(rc) {
                Ok(()) => {
                    buf.truncate(got.min(n) as usize);
                    return Ok(buf
                        .iter()
                        .map(|p| {
                            // NVML's "not available" is u64::MAX.
                            let mem = if p.usedGpuMemory == u64::MAX {
                                0
                            } else {
                                p.usedGpuMemory
                            };
                            (p.pid, mem)
                        })
                        .collect());
                }
                Err(NvmlError::InsufficientSize(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Err(NvmlError::InsufficientSize(None))
    }
}
