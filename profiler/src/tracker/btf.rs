//! Just enough of a BTF reader to find a struct member's offset in the
//! *running* kernel (`/sys/kernel/btf/vmlinux`).
//!
//! The eBPF program reads `task_struct.se.sum_exec_runtime` (the
//! scheduler's own run-time counter) at an offset found here at load time,
//! so one object works on every kernel that has BTF; kernels without BTF
//! fall back to timing context switches.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

/// Member byte offsets of the structs in a BTF blob, by struct name.
pub struct BtfStructs {
    structs: HashMap<String, Vec<(String, u32, u32)>>,
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
        let mut structs = HashMap::new();
        let mut pos = 0;
        while pos + 12 <= types.len() {
            let name_off = u32_at(types, pos)?;
            let info = u32_at(types, pos + 4)?;
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
            if kind == KIND_STRUCT || kind == KIND_UNION {
                let name = str_at(strings, name_off);
                let mut members = Vec::with_capacity(vlen);
                for m in 0..vlen {
                    let at = pos + 12 * m;
                    let mname = str_at(strings, u32_at(types, at)?);
                    let mtype = u32_at(types, at + 4)?;
                    let raw = u32_at(types, at + 8)?;
                    let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                    members.push((mname, mtype, bits));
                }
                if !name.is_empty() {
                    structs.entry(name).or_insert(members);
                }
            }
            pos += extra;
        }
        Some(Self { structs })
    }

    /// Byte offset of `member` in `struct name`, if it is byte aligned.
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        let (_, _, bits) = self.structs.get(name)?.iter().find(|(m, ..)| m == member)?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

/// `offsetof(struct task_struct, se.sum_exec_runtime)` in the running
/// kernel, or `None` when the kernel has no BTF.
pub fn sum_exec_runtime_offset() -> Option<u32> {
    let blob = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
    let btf = BtfStructs::parse(&blob)?;
    Some(
        btf.member_offset("task_struct", "se")?
            + btf.member_offset("sched_entity", "sum_exec_runtime")?,
    )
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
    }
}
