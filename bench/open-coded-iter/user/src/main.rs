//! Loads the experiment's object with aya 0.14 (kfunc ids patched into
//! its raw call instructions), then times reads of the two iterators in
//! alternating rounds with N idle threads.
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use aya::programs::Iter;
use aya::{Btf, EbpfLoader};

fn patch(bytes: &mut [u8], placeholder: u32, id: u32) -> usize {
    let mut pat = vec![0x85u8, 0x20, 0, 0];
    pat.extend_from_slice(&placeholder.to_le_bytes());
    let mut n = 0;
    let mut i = 0;
    while i + 8 <= bytes.len() {
        if bytes[i..i + 8] == pat[..] {
            bytes[i + 4..i + 8].copy_from_slice(&id.to_le_bytes());
            n += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    n
}

fn read_all(link_fd: i32) -> (u64, u64, f64) {
    let attr = [link_fd as u32, 0u32];
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            33i64, /* BPF_ITER_CREATE */
            attr.as_ptr(),
            8usize,
        )
    } as i32;
    assert!(
        fd >= 0,
        "BPF_ITER_CREATE: {}",
        std::io::Error::last_os_error()
    );
    let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let t = Instant::now();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).expect("read");
    let dt = t.elapsed().as_secs_f64();
    let last = &buf[buf.len() - 16..];
    let v = u64::from_le_bytes(last[..8].try_into().unwrap());
    let c = u64::from_le_bytes(last[8..].try_into().unwrap());
    (v, c, dt)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let obj = &args[1];
    let threads: usize = args.get(2).map_or(10_000, |s| s.parse().unwrap());
    let rounds: usize = args.get(3).map_or(20, |s| s.parse().unwrap());
    let mut bytes = std::fs::read(obj).expect("object");
    let kbtf = aya_obj::btf::Btf::from_sys_fs().expect("btf");
    for (ph, name) in [
        (0x7EAD_0001u32, "bpf_iter_task_new"),
        (0x7EAD_0002, "bpf_iter_task_next"),
        (0x7EAD_0003, "bpf_iter_task_destroy"),
    ] {
        let id = kbtf
            .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let n = patch(&mut bytes, ph, id);
        eprintln!("{name}: BTF id {id}, {n} call(s) patched");
    }
    let off = wattprof::tracker::sum_exec_runtime_offset().expect("this kernel's BTF") as u64;
    let mut ebpf = EbpfLoader::new()
        .override_global("SUM_EXEC_OFFSET", &off, true)
        .load(&bytes)
        .expect("aya load");
    let btf = Btf::from_sys_fs().expect("btf");
    let mut links = Vec::new();
    for (prog, target) in [("kexp_iter_task", "task"), ("kexp_open_coded", "bpf_map")] {
        let p: &mut Iter = ebpf.program_mut(prog).unwrap().try_into().unwrap();
        if let Err(e) = p.load(target, &btf) {
            eprintln!("{prog}: load failed: {e:?}");
            if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &e {
                eprintln!("{verifier_log}");
            }
            std::process::exit(1);
        }
        let prog_fd = p.fd().expect("fd").as_fd().as_raw_fd();
        let mut attr = [
            prog_fd as u32,
            0,
            28, /* BPF_TRACE_ITER */
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                28i64, /* BPF_LINK_CREATE */
                attr.as_mut_ptr(),
                48usize,
            )
        } as i32;
        assert!(
            fd >= 0,
            "link create {prog}: {}",
            std::io::Error::last_os_error()
        );
        links.push(fd);
    }
    let raw = links;
    // Idle threads.
    let stop = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let s = stop.clone();
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    s.wait();
                })
                .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Warm: both read once (the filter filled).
    for r in &raw {
        read_all(*r);
    }
    let mut a = Vec::new();
    let mut b = Vec::new();
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (v, c, dt) = read_all(raw[i]);
            if round == 0 {
                eprintln!(
                    "{}: visited {v}, changed {c}, {:.1} us",
                    ["iter/task", "open-coded"][i],
                    dt * 1e6
                );
            }
            if i == 0 {
                a.push(dt / v as f64 * 1e9)
            } else {
                b.push(dt / v as f64 * 1e9)
            }
        }
    }
    // Paired: each round's two reads, taken one after the other.
    let mut ratio: Vec<f64> = a.iter().zip(&b).map(|(x, y)| y / x).collect();
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (ma, la, ha) = med(&mut a);
    let (mb, lb, hb) = med(&mut b);
    let (mr, lr, hr) = med(&mut ratio);
    println!("threads {threads}, rounds {rounds}: ns per task per read, median (range)");
    println!("iter/task   {ma:.1} ({la:.1}-{ha:.1})");
    println!("open-coded  {mb:.1} ({lb:.1}-{hb:.1})");
    println!("paired ratio open-coded / iter/task {mr:.3} ({lr:.3}-{hr:.3})");
    stop.wait();
    for h in hs {
        h.join().unwrap();
    }
}
