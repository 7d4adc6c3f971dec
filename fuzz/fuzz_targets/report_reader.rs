//! Any bytes read by `wattprof report` as a recording, a stream or a cut
//! stream: an error or a summary, never a panic, and a summary renders as
//! a table, metrics and JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use wattprof::report::{load_bytes, metrics};

fuzz_target!(|data: &[u8]| {
    if let Ok(loaded) = load_bytes(Path::new("fuzz.json"), data) {
        let _ = wattprof::report::render::render_summary(&loaded.summary, 10, true);
        let list = metrics::list(&loaded);
        let _ = wattprof::report::render::render_metrics("fuzz.json", &list);
        let _ = serde_json::to_string(&loaded.summary);
    }
});
