//! Any datagrams sent to the window socket, one per line, applied to the
//! window state machine in order with rising timestamps, then the profile's
//! end: no panic, and every window that ends has a consistent span.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wattprof::profile::windows::{Windows, parse};

fuzz_target!(|data: &[u8]| {
    let Some((&sender, messages)) = data.split_first() else {
        return;
    };
    let mut windows = Windows::default();
    let mut at_ns = 1_000_000_000u64;
    for (i, line) in messages.split(|b| *b == b'\n').enumerate() {
        at_ns += 1_000 + (i as u64 % 7) * 1_000_000;
        match parse(&String::from_utf8_lossy(line), u32::from(sender) + 1) {
            Ok(cmd) => match windows.apply(cmd, at_ns) {
                Ok(Some(w)) => assert!(w.end_ns >= w.begin_ns, "{w:?}"),
                Ok(None) => {}
                Err(e) => windows.error(e),
            },
            Err(e) => {
                assert!(!e.is_empty());
                windows.error(e);
            }
        }
    }
    let (ended, _errors) = windows.finish(at_ns + 1);
    for w in ended {
        assert!(w.end_ns >= w.begin_ns, "{w:?}");
    }
});
