//! `wattprof top`: `monitor` with the live screen (`render::top`,
//! `sink/top.rs`): the same session, the same outputs, and keys.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::rc::Rc;

use super::Fatal;
use super::monitor::{MonitorArgs, session};
use crate::render::top::{Grouping, Top};
use crate::sink::top::TopScreen;

/// Arguments of `wattprof top`: those of `monitor`, and what the rows
/// are at the start.
#[derive(clap::Args, Debug)]
#[command(after_help = top_help())]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) monitor: MonitorArgs,

    /// What the rows are at the start: processes, containers and systemd
    /// units, cgroups, or batch jobs (Slurm) (`g` goes round them).
    #[arg(long, value_enum, default_value = "process")]
    pub(crate) by: Grouping,
}

fn top_help() -> String {
    format!(
        "Keys (htop's where htop has one):\n{}\n\nExamples:\n  sudo wattprof top\n  \
         sudo wattprof top --interval 2s --jsonl /var/log/wattprof.jsonl\n\n\
         Every figure on screen is the interval's, as --jsonl streams it. Quitting \
         (q, F10, Ctrl-C) or SIGTERM ends it and prints the summary, as `monitor` does.",
        crate::render::top::keys_help()
    )
}

/// Runs `wattprof top`.
pub(crate) fn execute(args: TopArgs) -> anyhow::Result<i32> {
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        return Err(Fatal::usage(
            "wattprof top needs a terminal for its input and output (for a stream, \
             `wattprof monitor --jsonl FILE`)",
        )
        .into());
    }
    let m = &args.monitor;
    // NO_COLOR (no-color.org): set and not empty.
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let top = Top::new(
        m.interval.as_millis() as u64,
        args.by,
        color,
        crate::process::ProcFs::real(),
    );
    let screen = Rc::new(RefCell::new(TopScreen::open(top).map_err(|e| {
        Fatal::profiler(format!("cannot take the terminal for `top`: {e}"))
    })?));
    session(args.monitor, Some(screen))
}
