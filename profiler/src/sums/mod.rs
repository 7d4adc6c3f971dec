//! What a profile adds up as it runs: per-CPU time, each VM's energy.

pub(crate) mod machine;
pub(crate) mod vms;
