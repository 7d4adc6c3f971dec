//! Hash maps for the integer keys the kernel and the process table hand
//! out (tids, pids, task pointers, consumer ids, cgroup ids): every live
//! thread and process is looked up every interval, and SipHash's DoS
//! resistance buys nothing for such keys.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hasher for integer keys (FxHash's step).
#[derive(Clone, Copy, Debug, Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` keyed by integers.
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// A `HashSet` of integers.
pub type IntSet<K> = HashSet<K, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_keys_spread_over_the_table() {
        let mut m: IntMap<u64, u64> = IntMap::default();
        for k in 0..10_000 {
            m.insert(k * 4096, k);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(&(4096 * 77)), Some(&77));
        let low_bits: IntSet<u64> = (0..1000u64)
            .map(|k| {
                let mut h = IntHasher::default();
                h.write_u64(k * 4096);
                h.finish() >> 57
            })
            .collect();
        // The top 7 bits (what hashbrown probes by) take many values.
        assert!(low_bits.len() > 64, "{}", low_bits.len());
    }
}
