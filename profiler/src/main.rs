//! The `wattprof` binary: parse arguments, run, map errors to exit codes.

use clap::Parser;
use wattprof::cli::{self, EXIT_PROFILER_FAILED, Fatal};

fn main() {
    let parsed = cli::Cli::parse();
    let code = match cli::main(parsed) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("wattprof: {err:#}");
            err.downcast_ref::<Fatal>()
                .map_or(EXIT_PROFILER_FAILED, |f| f.code)
        }
    };
    std::process::exit(code);
}
