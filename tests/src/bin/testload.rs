//! Workloads with known ground truth for wattprof's integration tests and
//! benchmarks. Each mode prints what the kernel itself says it used.
//!
//! ```text
//! wattprof-testload burn SECONDS DUTY      busy DUTY of every 10 ms for SECONDS;
//!                                          prints {"pid", "schedstat_ns"}
//! wattprof-testload short                  ~2 ms of CPU, named wp-short
//! wattprof-testload spawn N                runs `short` N times from a shell loop
//! wattprof-testload orchestrate            two burners (duty 1.0 and 0.5, 2 s) and
//!                                          `spawn 2000` at once; prints one JSON line
//!                                          per program with its wait4 rusage
//! wattprof-testload threads N SECONDS      N threads that sleep for SECONDS
//! wattprof-testload wakers N SECONDS [M]   N threads running 50 us every 10 ms for
//!                                          SECONDS, and M that run 5 ms once, at
//!                                          once, then sleep; prints {"pid",
//!                                          "rusage_ns"}
//! wattprof-testload thread-exec [MS]       runs `exec-from-thread MS` and prints its
//!                                          wait4 rusage
//! wattprof-testload cpu SECONDS            burns SECONDS of its own CPU time;
//!                                          prints {"pid", "schedstat_ns"}
//! wattprof-testload window NAME SECONDS    sends `begin NAME` to $WATTPROF_SOCKET,
//!                                          burns SECONDS of CPU, sends `end NAME`;
//!                                          prints {"pid", "begin_ns", "end_ns"}
//!                                          (CLOCK_MONOTONIC around the two sends)
//! wattprof-testload migrate ROUNDS MS      pins itself to CPU 0 and CPU 1 in turn,
//!                                          burning MS ms of its own CPU time on each,
//!                                          ROUNDS times; prints {"pid", "cpu_ns":
//!                                          [on CPU 0, on CPU 1]} by its own clock
//! wattprof-testload exec-from-thread [MS]  the leader burns 300 ms, then a second
//!                                          thread burns MS ms (100; 0: none) and execs
//!                                          `burn 0.5 1.0` (the kernel swaps the two
//!                                          threads' tids)
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).expect("name without NUL");
    // SAFETY: PR_SET_NAME with a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
}

fn spin_for(cpu: Duration) {
    let start = thread_cpu_ns();
    let mut x: u64 = 1;
    while thread_cpu_ns() - start < cpu.as_nanos() as u64 {
        for i in 0..1000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn schedstat_ns() -> u64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn burn(seconds: f64, duty: f64) {
    set_name("wp-burn");
    let period = Duration::from_millis(10);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let t0 = Instant::now();
        let busy = period.mul_f64(duty.clamp(0.0, 1.0));
        while t0.elapsed() < busy {
            std::hint::black_box(thread_cpu_ns());
        }
        if duty < 1.0 {
            std::thread::sleep(period.saturating_sub(t0.elapsed()));
        }
    }
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    println!(
        "{{\"pid\":{},\"schedstat_ns\":{},\"voluntary_switches\":{},\"involuntary_switches\":{}}}",
        std::process::id(),
        schedstat_ns(),
        ru.ru_nvcsw,
        ru.ru_nivcsw
    );
}

fn rusage_ns(ru: &libc::rusage) -> u64 {
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn wait4(pid: u32) -> (i32, u64) {
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; pid is our child.
    unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
    (status, rusage_ns(&ru))
}

fn orchestrate(me: &str) {
    let spawn = |args: &[&str]| {
        Command::new(me)
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn program")
    };
    let programs = [
        ("burn-full", spawn(&["burn", "2", "1.0"])),
        ("burn-half", spawn(&["burn", "2", "0.5"])),
        ("spawner", spawn(&["spawn", "2000"])),
    ];
    for (name, child) in programs {
        let pid = child.id();
        let (status, ns) = wait4(pid);
        // The Child handle must not reap again: forget it.
        std::mem::forget(child);
        println!("{{\"name\":\"{name}\",\"pid\":{pid},\"status\":{status},\"rusage_ns\":{ns}}}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let me = std::env::current_exe().expect("own path");
    let me = me.to_str().expect("utf-8 path");
    let num = |i: usize, d: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    match args.get(1).map(String::as_str) {
        Some("burn") => burn(num(2, 2.0), num(3, 1.0)),
        Some("cpu") => {
            set_name("wp-cpu");
            spin_for(Duration::from_secs_f64(num(2, 1.0)));
            println!(
                "{{\"pid\":{},\"schedstat_ns\":{}}}",
                std::process::id(),
                schedstat_ns()
            );
        }
        Some("window") => window(
            &args.get(2).cloned().unwrap_or_else(|| "w".into()),
            num(3, 1.0),
        ),
        Some("short") => {
            set_name("wp-short");
            spin_for(Duration::from_millis(2));
        }
        Some("spawn") => {
            let n = num(2, 2000.0) as u64;
            let script = format!("i=0; while [ $i -lt {n} ]; do '{me}' short; i=$((i+1)); done");
            let status = Command::new("sh")
                .args(["-c", &script])
                .status()
                .expect("sh");
            std::process::exit(status.code().unwrap_or(1));
        }
        Some("orchestrate") => orchestrate(me),
        Some("thread-exec") => thread_exec(me, args.get(2).map_or("100", String::as_str)),
        Some("exec-from-thread") => exec_from_thread(me, num(2, 100.0)),
        Some("migrate") => migrate(num(2, 5.0) as usize, num(3, 100.0)),
        Some("threads") => threads(num(2, 1000.0) as usize, num(3, 10.0)),
        Some("wakers") => wakers(num(2, 200.0) as usize, num(3, 1.5), num(4, 0.0) as usize),
        _ => {
            eprintln!("usage: wattprof-testload burn|short|spawn|orchestrate|threads|wakers ...");
            std::process::exit(2);
        }
    }
}

/// A window named `name` around `seconds` of CPU, sent to
/// WATTPROF_SOCKET; prints its pid and the window's bounds.
fn window(name: &str, seconds: f64) {
    let path = std::env::var_os("WATTPROF_SOCKET").expect("WATTPROF_SOCKET is set");
    let sock = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    let begin_ns = monotonic_ns();
    sock.send_to(format!("begin {name}").as_bytes(), &path)
        .expect("send begin");
    spin_for(Duration::from_secs_f64(seconds));
    sock.send_to(format!("end {name}").as_bytes(), &path)
        .expect("send end");
    let end_ns = monotonic_ns();
    println!(
        "{{\"pid\":{},\"begin_ns\":{begin_ns},\"end_ns\":{end_ns}}}",
        std::process::id()
    );
}

/// Runs `exec-from-thread THREAD_MS` and prints its wait4 CPU time.
fn thread_exec(me: &str, thread_ms: &str) {
    let child = Command::new(me)
        .args(["exec-from-thread", thread_ms])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (status, ns) = wait4(pid);
    std::mem::forget(child);
    println!(
        "{{\"name\":\"exec-from-thread\",\"pid\":{pid},\"status\":{status},\"rusage_ns\":{ns}}}"
    );
}

/// Burns 0.3 s, then a second thread burns `thread_ms` (0: it execs in
/// its first slice, before anything charged it) and execs a burner.
fn exec_from_thread(me: &str, thread_ms: f64) {
    use std::os::unix::process::CommandExt;
    spin_for(Duration::from_millis(300));
    let me = me.to_string();
    let t = std::thread::spawn(move || {
        spin_for(Duration::from_secs_f64(thread_ms / 1000.0));
        let err = Command::new(&me).args(["burn", "0.5", "1.0"]).exec();
        panic!("exec failed: {err}");
    });
    let _ = t.join();
}

/// `rounds` of `ms` ms of CPU on CPU 0 then on CPU 1; prints each CPU's
/// time as the thread's own clock read it.
fn migrate(rounds: usize, ms: f64) {
    set_name("wp-migrate");
    let mut cpu_ns = [0u64; 2];
    for _ in 0..rounds {
        for (cpu, spent) in cpu_ns.iter_mut().enumerate() {
            // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                    0,
                    "sched_setaffinity"
                );
            }
            // The move happens before the call returns.
            // SAFETY: no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() }, cpu as i32);
            let t0 = thread_cpu_ns();
            spin_for(Duration::from_secs_f64(ms / 1000.0));
            *spent += thread_cpu_ns() - t0;
        }
    }
    println!(
        "{{\"pid\":{},\"cpu_ns\":[{},{}]}}",
        std::process::id(),
        cpu_ns[0],
        cpu_ns[1]
    );
}

/// `n` threads that each spin 50 µs every 10 ms for `secs` seconds (so a
/// read finds most of them off a CPU, with more run time than the last),
/// and `once` threads that spin 5 ms at the start and sleep to the end
/// (their time is in the first reads or nowhere before the exit); then
/// the process's own run time (all threads, joined) from getrusage.
fn wakers(n: usize, secs: f64, once: usize) {
    set_name("wp-wakers");
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(f)
            .expect("thread")
    };
    let mut handles: Vec<_> = (0..n)
        .map(|_| {
            spawn(Box::new(move || {
                while Instant::now() < end {
                    spin_for(Duration::from_micros(50));
                    std::thread::sleep(Duration::from_millis(10));
                }
            }))
        })
        .collect();
    handles.extend((0..once).map(|_| {
        spawn(Box::new(move || {
            spin_for(Duration::from_millis(5));
            std::thread::sleep(end.saturating_duration_since(Instant::now()));
        }))
    }));
    for h in handles {
        let _ = h.join();
    }
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    println!(
        "{{\"pid\":{},\"rusage_ns\":{}}}",
        std::process::id(),
        rusage_ns(&ru)
    );
}

/// `n` threads that sleep `secs`; prints the pid once they are started.
fn threads(n: usize, secs: f64) {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || std::thread::sleep(Duration::from_secs_f64(secs)))
                .expect("thread")
        })
        .collect();
    println!("{{\"pid\":{},\"threads\":{n}}}", std::process::id());
    for h in handles {
        let _ = h.join();
    }
}
