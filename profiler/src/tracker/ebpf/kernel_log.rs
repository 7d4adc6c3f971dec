//! The eBPF programs' own log lines (aya-log): full maps and rings,
//! reported by the kernel side and read here.

/// What the eBPF programs log through aya-log (`AYA_LOGS`): their own
/// account of a full map or ring, kept until the next sample hands it to
/// the profile (a bounded number per sample; the programs rate-limit
/// themselves too).
#[derive(Clone, Default)]
pub(super) struct KernelLog(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

/// Kernel-side messages kept between two samples at most.
const MAX_KERNEL_LOG: usize = 64;

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let mut v = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if v.len() < MAX_KERNEL_LOG {
            v.push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

impl KernelLog {
    pub(super) fn take(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}
