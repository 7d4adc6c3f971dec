//! Hash maps for the integer keys the kernel and the process table hand
//! out (tids, pids, task pointers, consumer ids, cgroup ids): every live
//! thread and process is looked up every interval, and SipHash's DoS
//! resistance buys nothing for such keys.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hasher for integer keys (FxHash's step, rustc-hash
/// 2's constant).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IntHasher(u64);

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
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0xf135_7aea_2e62_a9c5);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits of an aligned key (a task
        // pointer, a multiple of 64) zero, and hashbrown picks the bucket
        // from the low bits: rotate the well-mixed high bits down (as
        // rustc-hash 2 does, with its constant; 20 spreads pids, 64-byte
        // and 4 KiB aligned keys over 80-90% of the buckets a random hash
        // would fill).
        self.0.rotate_left(20)
    }
}

/// A `HashMap` keyed by integers.
pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// A `HashSet` of integers.
pub(crate) type IntSet<K> = HashSet<K, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(k: u64) -> u64 {
        let mut h = IntHasher::default();
        h.write_u64(k);
        h.finish()
    }

    #[test]
    fn aligned_keys_spread_over_buckets_and_tags() {
        // Pids and ids count up; task pointers are 64-byte aligned or
        // more; pages are 4,096.
        for align in [1u64, 64, 4096] {
            let keys: Vec<u64> = (1..=1000u64)
                .map(|k| 0xffff_8880_0000_0000 + k * align)
                .collect();
            // hashbrown's bucket index: the low bits (1,024 buckets here).
            let buckets: IntSet<u64> = keys.iter().map(|k| hash(*k) & 1023).collect();
            assert!(
                buckets.len() > 500,
                "align {align}: {} buckets",
                buckets.len()
            );
            // Its tag: the top 7 bits.
            let tags: IntSet<u64> = keys.iter().map(|k| hash(*k) >> 57).collect();
            assert!(tags.len() > 64, "align {align}: {} tags", tags.len());
        }
        let mut m: IntMap<u64, u64> = IntMap::default();
        for k in 0..10_000 {
            m.insert(k * 4096, k);
        }
        assert_eq!(m.get(&(4096 * 77)), Some(&77));
    }
}
