//! Just enough of a BTF reader to find a struct member's offset in the
//! *running* kernel (`/sys/kernel/btf/vmlinux`).
//!
//! The eBPF program reads `task_struct.se.sum_exec_runtime` (the
//! scheduler's own run-time counter) at an offset found here at load time,
//! so one object works on every kernel that has BTF; kernels without BTF
//! fall back to timing context switches.

use std::collections::HashMap;

use profiler_common::KernelOffsets;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// One BTF type, as much of it as offsets need.
#[derive(Clone, Debug, Default)]
struct Type {
    kind: u32,
    name: String,
    /// Struct/union members: (name, type id, bit offset).
    members: Vec<(String, u32, u32)>,
    /// Modifiers and typedefs: the type they refer to.
    refers: u32,
}

/// The structs and unions of a BTF blob, by type id and by name.
pub struct BtfStructs {
    types: Vec<Type>,
    by_name: HashMap<String, u32>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn str_at(strings: &[u8], off: u32) -> String {
    let s = strings.get(off as usize..).unwrap_or_default();
    let end = s.iter().position(|c| *c == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

impl BtfStructs {
    /// Parses a little-endian BTF blob; `None` if it is not one.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if u16::from_le_bytes(b.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
            return None;
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = b.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
        // Type ids start at 1; 0 is void.
        let mut all = vec![Type::default()];
        let mut by_name = HashMap::new();
        let mut pos = 0;
        while pos + 12 <= types.len() {
            let name_off = u32_at(types, pos)?;
            let info = u32_at(types, pos + 4)?;
            let size_or_type = u32_at(types, pos + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 != 0;
            pos += 12;
            let extra = match kind {
                1 | 14 | 17 => 4,             // int, var, decl_tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func_proto
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type_tag
                _ => return None,          // a kind this reader does not know
            };
            let mut ty = Type {
                kind,
                name: str_at(strings, name_off),
                ..Type::default()
            };
            if kind == KIND_STRUCT || kind == KIND_UNION {
                for m in 0..vlen {
                    let at = pos + 12 * m;
                    let mname = str_at(strings, u32_at(types, at)?);
                    let mtype = u32_at(types, at + 4)?;
                    let raw = u32_at(types, at + 8)?;
                    let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                    ty.members.push((mname, mtype, bits));
                }
                if !ty.name.is_empty() {
                    by_name.entry(ty.name.clone()).or_insert(all.len() as u32);
                }
            } else if matches!(kind, 8 | 9 | 10 | 11 | 18) {
                // typedef, volatile, const, restrict, type_tag
                ty.refers = size_or_type;
            }
            all.push(ty);
            pos += extra;
        }
        Some(Self {
            types: all,
            by_name,
        })
    }

    /// The struct or union a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..16 {
            let ty = self.types.get(id as usize)?;
            if ty.kind == KIND_STRUCT || ty.kind == KIND_UNION {
                return Some(ty);
            }
            if ty.refers == 0 {
                return None;
            }
            id = ty.refers;
        }
        None
    }

    /// Bit offset of `member` in `ty`, looking inside anonymous structs and
    /// unions (as C does).
    fn member_bits(&self, ty: &Type, member: &str, depth: u32) -> Option<u32> {
        if let Some((_, _, bits)) = ty.members.iter().find(|(m, ..)| m == member) {
            return Some(*bits);
        }
        if depth > 8 {
            return None;
        }
        ty.members
            .iter()
            .filter(|(m, ..)| m.is_empty())
            .find_map(|(_, inner, bits)| {
                let inner = self.resolve(*inner)?;
                Some(bits + self.member_bits(inner, member, depth + 1)?)
            })
    }

    /// Byte offset of `member` in `struct name`, if it is byte aligned.
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        let ty = self.types.get(*self.by_name.get(name)? as usize)?;
        let bits = self.member_bits(ty, member, 0)?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// Byte offset of a member path (`["se", "sum_exec_runtime"]`) in
    /// `struct name`, following nested structs by type.
    pub fn path_offset(&self, name: &str, path: &[&str]) -> Option<u32> {
        let mut ty = self.types.get(*self.by_name.get(name)? as usize)?;
        let mut bits = 0;
        for (i, member) in path.iter().enumerate() {
            let at = self.member_bits(ty, member, 0)?;
            bits += at;
            if i + 1 < path.len() {
                let id = self.member_type(ty, member, 0)?;
                ty = self.resolve(id)?;
            }
        }
        (bits % 8 == 0).then_some(bits / 8)
    }

    fn member_type(&self, ty: &Type, member: &str, depth: u32) -> Option<u32> {
        if let Some((_, id, _)) = ty.members.iter().find(|(m, ..)| m == member) {
            return Some(*id);
        }
        if depth > 8 {
            return None;
        }
        ty.members
            .iter()
            .filter(|(m, ..)| m.is_empty())
            .find_map(|(_, inner, _)| self.member_type(self.resolve(*inner)?, member, depth + 1))
    }

    /// The offsets the iterator tracker needs, or `None` (with the first
    /// one missing) when this kernel lacks one.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, &'static str> {
        let task = |path: &[&str]| self.path_offset("task_struct", path);
        let cpu = task(&["cpu"]).or_else(|| task(&["thread_info", "cpu"]));
        Ok(KernelOffsets {
            sum_exec: task(&["se", "sum_exec_runtime"]).ok_or("task_struct.se.sum_exec_runtime")?,
            pid: task(&["pid"]).ok_or("task_struct.pid")?,
            tgid: task(&["tgid"]).ok_or("task_struct.tgid")?,
            start_time: task(&["start_time"]).ok_or("task_struct.start_time")?,
            comm: task(&["comm"]).ok_or("task_struct.comm")?,
            on_cpu: task(&["on_cpu"]).ok_or("task_struct.on_cpu")?,
            cpu: cpu.ok_or("task_struct.cpu")?,
            cgroups: task(&["cgroups"]).ok_or("task_struct.cgroups")?,
            dfl_cgrp: self
                .member_offset("css_set", "dfl_cgrp")
                .ok_or("css_set.dfl_cgrp")?,
            cgroup_kn: self.member_offset("cgroup", "kn").ok_or("cgroup.kn")?,
            kn_id: self
                .member_offset("kernfs_node", "id")
                .ok_or("kernfs_node.id")?,
            pad: 0,
        })
    }
}

/// The running kernel's BTF, if it has one.
pub fn running_kernel() -> Option<BtfStructs> {
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
        b.extend_from_slice(&types);
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
        b.extend_from_slice(&types);
        b.extend_from_slice(strings);
        let btf = BtfStructs::parse(&b).expect("parse");
        assert_eq!(btf.member_offset("outer", "y"), Some(4));
        assert_eq!(btf.path_offset("outer", &["z", "b"]), Some(12));
        assert_eq!(btf.path_offset("outer", &["z", "nope"]), None);
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
            eprintln!("skipping: this kernel has no BTF");
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
        assert!(all.pid > 0 && all.tgid == all.pid + 4, "{all:?}");
    }
}
