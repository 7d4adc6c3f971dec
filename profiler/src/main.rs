//! The `wattprof` binary: parse arguments, run, map errors to exit codes.

use clap::Parser;
use wattprof::cli::{self, EXIT_PROFILER_FAILED, EXIT_USAGE, Fatal};

fn main() {
    let parsed = match cli::Cli::try_parse() {
        Ok(p) => p,
        // Help and version go to stdout as clap writes them.
        Err(e) if !e.use_stderr() => e.exit(),
        // A bad command line: the same `wattprof:` line as every other
        // error (clap's own starts with `error:`), then its usage and tip.
        Err(e) => {
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            eprint!("wattprof: {text}");
            std::process::exit(EXIT_USAGE);
        }
    };
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
