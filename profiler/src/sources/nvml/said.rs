//! Problems of one GPU, reported when they begin and when they end.

use std::collections::BTreeMap;

/// Problems reported by [`super::NvmlGpus`]: a failure is a line when it
/// begins and when it ends.
pub(super) struct Said<'a> {
    pub(super) index: u32,
    pub(super) failing: &'a mut BTreeMap<&'static str, String>,
    pub(super) out: &'a mut Vec<(u32, String)>,
}

impl Said<'_> {
    /// `what` fails now with `line` (`None`: it works).
    pub(super) fn set(&mut self, what: &'static str, line: Option<String>) {
        match line {
            Some(line) => {
                if !self.failing.contains_key(what) {
                    self.out.push((self.index, line.clone()));
                }
                self.failing.insert(what, line);
            }
            None => {
                if self.failing.remove(what).is_some() {
                    self.out.push((self.index, format!("{what} reads again")));
                }
            }
        }
    }
}
