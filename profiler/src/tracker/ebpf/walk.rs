//! The open-coded walk's kfunc calls. aya 0.14 cannot relocate a kfunc
//! call, so the object carries each as a raw `call` instruction
//! (`src_reg` 2, `BPF_PSEUDO_KFUNC_CALL`) with a placeholder `imm`
//! ([`KFUNC_PLACEHOLDERS`]); this puts in each kfunc's id from the running
//! kernel's BTF before aya reads the object.

use profiler_common::iter::KFUNC_PLACEHOLDERS;

/// The first kernel whose walk is safe: 6.7 brought the kfuncs, but its
/// `bpf_iter_task_next` follows `next_thread()` without a lock, which can
/// loop forever when a thread execs during the walk (fixed in 6.8 with
/// `__next_thread()`).
const FIRST_SAFE: (u32, u32) = (6, 8);

/// `(major, minor)` of a kernel release string (`6.18.44-fc`).
fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The kfunc ids in the running kernel (`release`: its release string),
/// in [`KFUNC_PLACEHOLDERS`]' order; an error says why the walk is not
/// tried: a kernel before 6.8, or the first kfunc it lacks.
pub(super) fn kfunc_ids(
    release: &str,
    func_id: impl Fn(&str) -> Option<u32>,
) -> Result<[u32; 3], String> {
    match release_version(release) {
        Some(v) if v >= FIRST_SAFE => {}
        _ => {
            return Err(format!(
                "Linux {} is older than {}.{} (the open-coded task walk)",
                release.trim(),
                FIRST_SAFE.0,
                FIRST_SAFE.1
            ));
        }
    }
    let mut ids = [0; 3];
    for (id, (_, name)) in ids.iter_mut().zip(KFUNC_PLACEHOLDERS) {
        *id = func_id(name).ok_or_else(|| {
            format!("this kernel has no {name} kfunc (the open-coded task iterator is Linux 6.8+)")
        })?;
    }
    Ok(ids)
}

/// A copy of `object` with every placeholder call replaced by its kfunc's
/// id. Instructions sit at 8-byte offsets in the file (a BPF section is
/// 8-byte aligned), so only those are looked at. An error when a
/// placeholder is missing: an object built without the walk.
pub(super) fn patch_kfuncs(object: &[u8], ids: [u32; 3]) -> Result<Vec<u8>, String> {
    let mut out = object.to_vec();
    let mut found = [0usize; 3];
    for insn in out.chunks_exact_mut(8) {
        // `call` (0x85) with src_reg 2 and dst_reg 0, offset 0.
        if insn[..4] != [0x85, 0x20, 0, 0] {
            continue;
        }
        let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        if let Some(i) = KFUNC_PLACEHOLDERS.iter().position(|(p, _)| *p == imm) {
            insn[4..].copy_from_slice(&ids[i].to_le_bytes());
            found[i] += 1;
        }
    }
    match found.iter().position(|n| *n == 0) {
        Some(i) => Err(format!(
            "the eBPF object has no call of {} to patch (built without the open-coded walk)",
            KFUNC_PLACEHOLDERS[i].1
        )),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(imm: u32) -> [u8; 8] {
        let mut insn = [0x85, 0x20, 0, 0, 0, 0, 0, 0];
        insn[4..].copy_from_slice(&imm.to_le_bytes());
        insn
    }

    #[test]
    fn every_placeholder_call_gets_its_kfunc_id_and_nothing_else_changes() {
        let mut object = vec![0xAAu8; 16];
        for (imm, _) in KFUNC_PLACEHOLDERS {
            object.extend_from_slice(&call(imm));
        }
        object.extend_from_slice(&call(KFUNC_PLACEHOLDERS[1].0));
        // A helper call (src_reg 0) with a placeholder's value, and the
        // pattern straddling an 8-byte boundary: both left alone.
        let mut helper = call(KFUNC_PLACEHOLDERS[0].0);
        helper[1] = 0;
        object.extend_from_slice(&helper);
        object.extend_from_slice(&[0; 4]);
        object.extend_from_slice(&call(KFUNC_PLACEHOLDERS[2].0));
        object.extend_from_slice(&[0; 4]);
        let patched = patch_kfuncs(&object, [101, 102, 103]).expect("patched");
        let mut want = object.clone();
        for (at, id) in [(16, 101u32), (24, 102), (32, 103), (40, 102)] {
            want[at + 4..at + 8].copy_from_slice(&id.to_le_bytes());
        }
        assert_eq!(patched, want);
    }

    #[test]
    fn an_object_without_a_placeholder_is_refused_by_name() {
        let object: Vec<u8> =
            [call(KFUNC_PLACEHOLDERS[0].0), call(KFUNC_PLACEHOLDERS[2].0)].concat();
        let err = patch_kfuncs(&object, [1, 2, 3]).expect_err("no next call");
        assert!(err.contains("bpf_iter_task_next"), "{err}");
    }

    #[test]
    fn a_kernel_without_the_kfuncs_is_named() {
        let err = kfunc_ids("6.18.44-fc", |name| {
            (name == "bpf_iter_task_new").then_some(7)
        })
        .expect_err("lacks next");
        assert!(
            err.contains("bpf_iter_task_next") && err.contains("6.8"),
            "{err}"
        );
        let ids = kfunc_ids("6.8.0", |name| Some(name.len() as u32)).expect("all there");
        assert_eq!(ids, [17, 18, 21]);
    }

    #[test]
    fn kernels_before_6_8_are_not_walked_even_with_the_kfuncs() {
        let all = |name: &str| Some(name.len() as u32);
        for old in ["6.7.12", "5.15.0-91-generic", "4.19.0", "garbage", ""] {
            let err = kfunc_ids(old, all).expect_err(old);
            assert!(err.contains("older than 6.8"), "{old}: {err}");
        }
        for new in ["6.8.0", "6.18.44-fc-v669", "7.0.1+", "10.2"] {
            assert!(kfunc_ids(new, all).is_ok(), "{new}");
        }
    }
}
