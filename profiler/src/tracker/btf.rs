//! Just enough of a BTF reader to find a struct member's offset in the
//! *running* kernel (`/sys/kernel/btf/vmlinux`).
//!
//! The eBPF program reads `task_struct.se.sum_exec_runtime` (the
//! scheduler's own run-time counter) at an offset found here at load time,
//! so one object works on every kernel that has BTF; kernels without BTF
//! fall back to timing context switches.

use profiler_common::iter::KernelOffsets;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;

/// The types of a BTF blob, indexed by type id and read on demand (a
/// kernel's BTF holds ~100,000 types; wattprof needs a dozen members).
pub(crate) struct BtfStructs {
    types: Vec<u8>,
    strings: Vec<u8>,
    /// Byte position of each type's record in `types`; index 0 is void.
    at: Vec<usize>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// A type record: kind, name offset, vlen, kind_flag, size-or-type, and
/// where its members start.
#[derive(Clone, Copy)]
struct Record {
    kind: u32,
    name_off: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
    extra_at: usize,
}

impl BtfStructs {
    /// Parses a little-endian BTF blob; `None` if it is not one.
    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        if u16::from_le_bytes(b.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
            return None;
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = b.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
        let mut at = vec![0];
        let mut pos = 0;
        while pos + 12 <= types.len() {
            let info = u32_at(types, pos + 4)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            at.push(pos);
            pos += 12
                + match kind {
                    1 | 14 | 17 => 4,             // int, var, decl_tag
                    3 => 12,                      // array
                    4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                    6 | 13 => 8 * vlen,           // enum, func_proto
                    2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type_tag
                    _ => return None,          // a kind this reader does not know
                };
        }
        Some(Self {
            types: types.to_vec(),
            strings: strings.to_vec(),
            at,
        })
    }

    fn record(&self, id: u32) -> Option<Record> {
        let pos = *self.at.get(id as usize).filter(|_| id != 0)?;
        let info = u32_at(&self.types, pos + 4)?;
        Some(Record {
            kind: (info >> 24) & 0x1f,
            name_off: u32_at(&self.types, pos)?,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 != 0,
            size_or_type: u32_at(&self.types, pos + 8)?,
            extra_at: pos + 12,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|c| *c == 0).unwrap_or(s.len());
        &s[..end]
    }

    /// Members of a struct or union: (name offset, type id, bit offset).
    fn members(&self, r: Record) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        (0..r.vlen).filter_map(move |m| {
            let at = r.extra_at + 12 * m;
            let raw = u32_at(&self.types, at + 8)?;
            let bits = if r.kind_flag { raw & 0x00ff_ffff } else { raw };
            Some((u32_at(&self.types, at)?, u32_at(&self.types, at + 4)?, bits))
        })
    }

    /// The struct or union named `name`.
    fn find(&self, name: &str) -> Option<Record> {
        (1..self.at.len() as u32).find_map(|id| {
            let r = self.record(id)?;
            ((r.kind == KIND_STRUCT || r.kind == KIND_UNION)
                && self.name(r.name_off) == name.as_bytes())
            .then_some(r)
        })
    }

    /// The struct or union a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<Record> {
        for _ in 0..16 {
            let r = self.record(id)?;
            match r.kind {
                KIND_STRUCT | KIND_UNION => return Some(r),
                // typedef, volatile, const, restrict, type_tag
                8..=11 | 18 => id = r.size_or_type,
                _ => return None,
            }
        }
        None
    }

    /// Bit offset and type of `member` in `r`, looking inside anonymous
    /// structs and unions (as C does).
    fn member(&self, r: Record, member: &str, depth: u32) -> Option<(u32, u32)> {
        if let Some((_, ty, bits)) = self
            .members(r)
            .find(|(name, ..)| self.name(*name) == member.as_bytes())
        {
            return Some((bits, ty));
        }
        if depth > 8 {
            return None;
        }
        self.members(r)
            .filter(|(name, ..)| *name == 0 || self.name(*name).is_empty())
            .find_map(|(_, inner, bits)| {
                let (b, ty) = self.member(self.resolve(inner)?, member, depth + 1)?;
                Some((bits + b, ty))
            })
    }

    /// The type id of the function named `name` (a kfunc's id, for a call
    /// instruction), if the kernel has one.
    pub(crate) fn func_id(&self, name: &str) -> Option<u32> {
        (1..self.at.len() as u32).find(|id| {
            self.record(*id)
                .is_some_and(|r| r.kind == KIND_FUNC && self.name(r.name_off) == name.as_bytes())
        })
    }

    /// Byte offset of `member` in `struct name`, if it is byte aligned.
    pub(crate) fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        self.path_offset(name, &[member])
    }

    /// Byte offset of a member path (`["se", "sum_exec_runtime"]`) in
    /// `struct name`, following nested structs by type.
    pub(crate) fn path_offset(&self, name: &str, path: &[&str]) -> Option<u32> {
        self.path_offset_in(self.find(name)?, path)
    }

    fn path_offset_in(&self, mut r: Record, path: &[&str]) -> Option<u32> {
        let mut bits = 0;
        for (i, member) in path.iter().enumerate() {
            let (at, ty) = self.member(r, member, 0)?;
            bits += at;
            if i + 1 < path.len() {
                r = self.resolve(ty)?;
            }
        }
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// The offsets the iterator tracker needs, or `None` (with the first
    /// one missing) when this kernel lacks one.
    pub(crate) fn kernel_offsets(&self) -> Result<KernelOffsets, &'static str> {
        let task_struct = self.find("task_struct").ok_or("task_struct")?;
        let task = |path: &[&str]| self.path_offset_in(task_struct, path);
        let cpu = task(&["cpu"]).or_else(|| task(&["thread_info", "cpu"]));
        // For running threads' estimate; all or none (CONFIG_SCHED_INFO,
        // CONFIG_FAIR_GROUP_SCHED).
        let running = (|| {
            Some([
                task(&["se", "exec_start"])?,
                task(&["se", "cfs_rq"])?,
                self.member_offset("cfs_rq", "rq")?,
                self.member_offset("rq", "clock")?,
                self.member_offset("rq", "clock_task")?,
                task(&["sched_info", "last_arrival"])?,
            ])
        })();
        Ok(KernelOffsets {
            sum_exec: task(&["se", "sum_exec_runtime"]).ok_or("task_struct.se.sum_exec_runtime")?,
            pid: task(&["pid"]).ok_or("task_struct.pid")?,
            tgid: task(&["tgid"]).ok_or("task_struct.tgid")?,
            start_time: task(&["start_time"]).ok_or("task_struct.start_time")?,
            comm: task(&["comm"]).ok_or("task_struct.comm")?,
            cpu: cpu.ok_or("task_struct.cpu")?,
            cgroups: task(&["cgroups"]).ok_or("task_struct.cgroups")?,
            dfl_cgrp: self
                .member_offset("css_set", "dfl_cgrp")
                .ok_or("css_set.dfl_cgrp")?,
            cgroup_kn: self.member_offset("cgroup", "kn").ok_or("cgroup.kn")?,
            kn_id: self
                .member_offset("kernfs_node", "id")
                .ok_or("kernfs_node.id")?,
            on_cpu: task(&["on_cpu"]).ok_or("task_struct.on_cpu")?,
            exec_start: running.map_or(0, |r| r[0]),
            se_cfs_rq: running.map_or(0, |r| r[1]),
            cfs_rq_rq: running.map_or(0, |r| r[2]),
            rq_clock: running.map_or(0, |r| r[3]),
            rq_clock_task: running.map_or(0, |r| r[4]),
            last_arrival: running.map_or(0, |r| r[5]),
        })
    }
}

/// The running kernel's BTF, if it has one.
pub(crate) fn running_kernel() -> Option<BtfStructs> {
    let blob = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
    BtfStructs::parse(&blob)
}

/// `offsetof(struct task_struct, se.sum_exec_runtime)` in the running
/// kernel, or `None` when the kernel has no BTF.
pub fn sum_exec_runtime_offset() -> Option<u32> {
    running_kernel()?.path_offset("task_struct", &["se", "sum_exec_runtime"])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `int`, and `struct s { int a; int b; }` where b is at
    /// byte 8, and a bitfield struct (kind_flag) with c at bit 32.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0bf\0c\0";
        let mut types = Vec::new();
        let mut push = |v: &[u32]| {
            v.iter()
                .for_each(|x| types.extend_from_slice(&x.to_le_bytes()))
        };
        push(&[1, 1 << 24, 4, 32]); // [1] int, size 4, 32 bits
        push(&[5, (KIND_STRUCT << 24) | 2, 12]); // [2] struct s
        push(&[7, 1, 0]); // a at bit 0
        push(&[9, 1, 64]); // b at bit 64
        push(&[11, (1 << 31) | (KIND_STRUCT << 24) | 1, 8]); // [3] struct bf, kind_flag
        push(&[14, 1, (3 << 24) | 32]); // c: 3-bit field at bit 32
        btf_blob(&types, strings)
    }

    /// A BTF blob of these type records and strings.
    fn btf_blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(types);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn finds_member_offsets() {
        let btf = BtfStructs::parse(&blob()).expect("parse");
        assert_eq!(btf.member_offset("s", "a"), Some(0));
        assert_eq!(btf.member_offset("s", "b"), Some(8));
        assert_eq!(btf.member_offset("bf", "c"), Some(4));
        assert_eq!(btf.member_offset("s", "z"), None);
        assert_eq!(btf.member_offset("nope", "a"), None);
    }

    #[test]
    fn finds_members_of_anonymous_unions_and_nested_paths() {
        // struct outer { int x; union { int y; struct s z; }; }
        let strings = b"\0int\0s\0a\0b\0outer\0x\0y\0z\0";
        let mut types = Vec::new();
        let mut push = |v: &[u32]| {
            v.iter()
                .for_each(|x| types.extend_from_slice(&x.to_le_bytes()))
        };
        push(&[1, 1 << 24, 4, 32]); // [1] int
        push(&[5, (KIND_STRUCT << 24) | 2, 12]); // [2] struct s
        push(&[7, 1, 0]); // a
        push(&[9, 1, 64]); // b at byte 8
        push(&[0, (KIND_UNION << 24) | 2, 12]); // [3] anonymous union
        push(&[19, 1, 0]); // y
        push(&[21, 2, 0]); // z: struct s
        push(&[11, (KIND_STRUCT << 24) | 2, 16]); // [4] struct outer
        push(&[17, 1, 0]); // x
        push(&[0, 3, 32]); // the union at byte 4
        let btf = BtfStructs::parse(&btf_blob(&types, strings)).expect("parse");
        assert_eq!(btf.member_offset("outer", "y"), Some(4));
        assert_eq!(btf.path_offset("outer", &["z", "b"]), Some(12));
        assert_eq!(btf.path_offset("outer", &["z", "nope"]), None);
    }

    #[test]
    fn finds_functions_by_name_and_kind() {
        // [1] int, [2] func_proto, [3] func f, [4] struct named g, [5] func g
        let strings = b"\0int\0f\0g\0";
        let mut types = Vec::new();
        let mut push = |v: &[u32]| {
            v.iter()
                .for_each(|x| types.extend_from_slice(&x.to_le_bytes()))
        };
        push(&[1, 1 << 24, 4, 32]);
        push(&[0, 13 << 24, 1]);
        push(&[5, KIND_FUNC << 24, 2]);
        push(&[7, KIND_STRUCT << 24, 0]);
        push(&[7, KIND_FUNC << 24, 2]);
        let btf = BtfStructs::parse(&btf_blob(&types, strings)).expect("parse");
        assert_eq!(btf.func_id("f"), Some(3));
        assert_eq!(btf.func_id("g"), Some(5), "the function, not the struct");
        assert_eq!(btf.func_id("int"), None, "not a function");
        assert_eq!(btf.func_id("h"), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(BtfStructs::parse(b"not btf at all, not at all").is_none());
        let mut truncated = blob();
        truncated.truncate(30);
        assert!(BtfStructs::parse(&truncated).is_none());
    }

    #[test]
    fn running_kernel_if_it_has_btf() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            skip_test!("this kernel has no BTF");
            return;
        }
        let off = sum_exec_runtime_offset().expect("task_struct.se.sum_exec_runtime");
        // task_struct is several KiB; se sits well inside it.
        assert!((64..16384).contains(&off), "{off}");
        let all = running_kernel()
            .expect("btf")
            .kernel_offsets()
            .expect("every offset the iterator tracker needs");
        assert_eq!(all.sum_exec, off);
        // Running threads' estimate (CONFIG_SCHED_INFO,
        // CONFIG_FAIR_GROUP_SCHED): all of its offsets or none.
        let running = [
            all.exec_start,
            all.se_cfs_rq,
            all.rq_clock,
            all.last_arrival,
        ];
        assert!(running.iter().all(|o| *o > 0) || running.iter().all(|o| *o == 0));
        assert!(all.pid > 0 && all.tgid == all.pid + 4, "{all:?}");
    }
}
