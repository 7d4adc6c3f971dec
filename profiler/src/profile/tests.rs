//! The profile hub without root: a scripted [`CpuSampler`], a powercap
//! fixture whose counter the test advances, and a cgroup fixture whose
//! directories name the cgroup ids. Pids are above the kernel's largest
//! (2^22), so no lookup in /proc can find a real process.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::*;
use serde_json::Value;

use crate::model::{ProcessReport, ProfilerReport, RunReport};
use crate::sink::jsonl::Jsonl;
use crate::sink::recording::{Keep, Recording};
use crate::tracker::{CpuSample, CpuTimes, EventRing, TaskTime};

const WINDOW_NS: u64 = 1_000_000_000;
const START_NS: u64 = 5_000_000_000;
const DOCKER_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Samples given in advance.
struct Script {
    samples: VecDeque<CpuSample>,
}

impl CpuSampler for Script {
    fn begin(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        at_read();
        Ok(START_NS)
    }

    fn sample(
        &mut self,
        _last: bool,
        at_read: &mut dyn FnMut(),
    ) -> Result<CpuSample, TrackerError> {
        at_read();
        self.samples
            .pop_front()
            .ok_or_else(|| TrackerError::Load("the script has no more samples".into()))
    }
}

impl EventRing for Script {
    fn ring_fd(&self) -> Option<RawFd> {
        None
    }

    fn drain(&mut self) {}
}

/// A profile on fixtures: one package of two CPUs.
struct Rig {
    dir: PathBuf,
    energy_uj: u64,
    at_ns: u64,
    script: Script,
    profile: Profile,
    /// cgroup ids by path.
    cgroups: HashMap<&'static str, u64>,
    /// The package counter cannot be read in the next intervals.
    unreadable: bool,
    /// These pids exit at the end of the next interval.
    exiting: Vec<u32>,
    /// Time the kernel counts busy on each CPU beyond its tasks'
    /// (interrupts, waking from idle), up to the CPU's idle time.
    kernel_extra_ns: u64,
}

fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("wattprof-profile-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("fixture file");
}

impl Rig {
    fn new(tag: &str, scope: Scope, keep: Option<Keep>, filter: Filter) -> Self {
        let dir = temp_dir(tag);
        let zone = dir.join("sys/class/powercap/intel-rapl:0");
        std::fs::create_dir_all(&zone).expect("zone");
        write(&zone.join("name"), "package-0\n");
        write(&zone.join("enabled"), "1\n");
        write(&zone.join("max_energy_range_uj"), "262143328850\n");
        write(&zone.join("energy_uj"), "1000\n");
        let mut cgroups = HashMap::new();
        for path in ["system.slice", "system.slice/cron.service", "user.slice"]
            .into_iter()
            .chain(std::iter::once(
                format!("system.slice/docker-{DOCKER_ID}.scope").leak() as &str,
            ))
        {
            let d = dir.join("cgroup").join(path);
            std::fs::create_dir_all(&d).expect("cgroup dir");
            cgroups.insert(path, std::fs::metadata(&d).expect("cgroup").ino());
        }
        let readers = Readers::open(&ReaderConfig {
            sys: Some(dir.join("sys")),
            no_gpu: true,
            ..ReaderConfig::default()
        })
        .expect("fixture readers");
        assert_eq!(readers.used()[0].name, "powercap", "{:?}", readers.used());
        let table = ProcessTable::new(ProcFs::real(), 1, 4_000_000);
        let mut profile = Profile::new(
            table,
            readers,
            vec![0],
            ProfileConfig {
                carbon: CarbonIntensity {
                    g_per_kwh: 100.0,
                    source: "test".into(),
                },
                scope,
                filter,
                runtimes: crate::process::names::RuntimeSockets {
                    docker: dir.join("no-docker.sock"),
                    podman: dir.join("no-podman.sock"),
                    containerd: dir.join("no-containerd"),
                },
                cgroupfs: Some(dir.join("cgroup")),
                statics: Default::default(),
            },
            std::iter::once(
                Box::new(Jsonl::create(&dir.join("stream.jsonl")).expect("stream"))
                    as Box<dyn Sink>,
            )
            .chain(keep.map(|keep| {
                Box::new(Recording::create(&dir.join("recording.json"), keep).expect("recording"))
                    as Box<dyn Sink>
            }))
            .collect(),
            HostReport::default(),
        );
        let mut script = Script {
            samples: VecDeque::new(),
        };
        assert_eq!(profile.begin(&mut script).expect("begin"), START_NS);
        Self {
            dir,
            energy_uj: 1000,
            at_ns: START_NS,
            script,
            profile,
            cgroups,
            unreadable: false,
            kernel_extra_ns: 0,
            exiting: Vec::new(),
        }
    }

    /// A `monitor` rig (top 10), and its Docker container's cgroup id.
    fn machine(tag: &str, keep: Option<Keep>) -> (Self, u64) {
        let scope = Scope::Machine {
            top: 10,
            pids: Vec::new(),
            memory_top: 10,
        };
        let rig = Self::new(tag, scope, keep, Filter::default());
        let docker = rig
            .cgroups
            .iter()
            .find(|(k, _)| k.contains("docker-"))
            .map(|(_, id)| *id)
            .expect("docker cgroup");
        (rig, docker)
    }

    fn cgroup(&self, path: &str) -> u64 {
        self.cgroups[path]
    }

    /// One second in which the package used `joules` and `tasks` ran
    /// (pid, cgroup id, ns); the busy time fills CPU 0, then CPU 1.
    fn interval(&mut self, joules: f64, tasks: &[(u32, u64, u64)], last: bool) {
        self.energy_uj += (joules * 1e6) as u64;
        let counter = self.dir.join("sys/class/powercap/intel-rapl:0/energy_uj");
        if self.unreadable {
            // The counter runs on, but cannot be read in this interval.
            let _ = std::fs::remove_file(&counter);
        } else {
            write(&counter, &format!("{}\n", self.energy_uj));
        }
        self.at_ns += WINDOW_NS;
        let busy: u64 = tasks.iter().map(|t| t.2).sum();
        assert!(busy <= 2 * WINDOW_NS);
        let extra = self.kernel_extra_ns;
        let cpu = |cpu: u32, busy_ns: u64| CpuTimes {
            cpu,
            package: 0,
            busy_ns,
            idle_ns: WINDOW_NS - busy_ns,
            idle_task_ns: (WINDOW_NS - busy_ns).saturating_sub(extra),
            lost_ns: 0,
            switches: 0,
            window_ns: WINDOW_NS,
            carried_ns: 0,
            over_ns: 0,
        };
        self.script.samples.push_back(CpuSample {
            at_ns: self.at_ns,
            cpus: vec![
                cpu(0, busy.min(WINDOW_NS)),
                cpu(1, busy.saturating_sub(WINDOW_NS)),
            ],
            tasks: tasks
                .iter()
                .map(|(pid, cgroup_id, ns)| TaskTime {
                    tid: *pid,
                    tgid: *pid,
                    cgroup_id: *cgroup_id,
                    comm: crate::tracker::comm_bytes(&format!("p{pid}")),
                    on_cpu_ns: crate::tracker::PackageNs::from_slice(&[*ns]),
                    exit_ns: self.exiting.contains(pid).then_some(self.at_ns - 1),
                })
                .collect(),
            ..CpuSample::default()
        });
        let at = self
            .profile
            .tick(&mut self.script, last)
            .expect("scripted sample");
        assert_eq!(at, self.at_ns);
    }

    fn finish(self) -> (RunReport, Vec<Value>) {
        let (report, stream, _) = self.finish_with_recording();
        (report, stream)
    }

    /// As [`Rig::finish`], and whether a recording file was written.
    fn finish_with_recording(self) -> (RunReport, Vec<Value>, bool) {
        let finished = self.profile.finish(Ending {
            mode: "run",
            command: None,
            start_unix_ns: 0,
            profiler: ProfilerReport {
                tracker: crate::tracker::TrackerKind::Iter,
                tracker_fallback: None,
                task_walk: None,
                task_walk_fallback: None,
                task_walk_ring_full: 0,
                filter_overflow: 0,
                settled_from_exit: 0,
                vanished_threads: 0,
                on_cpu_ns: 0,
                kernel_memory_bytes: 0,
                exit_tracking: crate::tracker::ExitTracking::FreeEvent,
                task_clock: crate::tracker::TaskClock::SumExecRuntime,
                flush_supported: true,
                max_tasks: 0,
                interval_ns: WINDOW_NS,
                samples: 0,
                map_read_syscalls: 0,
                events_lost: 0,
                discarded_ns: 0,
                unmatched_forks: 0,
                ended_unseen: 0,
                output_errors: Vec::new(),
            },
        });
        assert!(finished.failed.is_empty(), "{:?}", finished.failed);
        let mut report = finished.report;
        // The intervals, as the recording (if one was asked for) holds
        // them.
        let recorded = self.dir.join("recording.json").exists();
        if let Ok(text) = std::fs::read_to_string(self.dir.join("recording.json")) {
            let back: RunReport = serde_json::from_str(&text).expect("the recording parses");
            report.intervals = back.intervals;
        }
        let text = std::fs::read_to_string(self.dir.join("stream.jsonl")).expect("stream");
        let stream = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every stream line parses"))
            .collect();
        let _ = std::fs::remove_dir_all(&self.dir);
        (report, stream, recorded)
    }
}

fn process(report: &RunReport, pid: u32) -> &ProcessReport {
    report
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not reported"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn every_joule_is_attributed_idle_or_unattributed_and_shares_follow_cpu_time() {
    let mut rig = Rig::new("conserve", Scope::Tree, Some(Keep::All), Filter::default());
    rig.profile.table.set_root(5001001);
    let user = rig.cgroup("user.slice");
    // 5001001 (the tree) ran 600 ms, 5002002 (another program) 300 ms, of 2 s.
    rig.interval(
        40.0,
        &[(5001001, user, 600_000_000), (5002002, user, 300_000_000)],
        false,
    );
    // 5001001 alone, 1.5 s of 2 s.
    rig.interval(20.0, &[(5001001, user, 1_500_000_000)], true);
    let (report, stream) = rig.finish();

    let pkg = &report.energy.domains[0];
    assert!(close(pkg.measured_j, 60.0), "{pkg:?}");
    assert!(
        close(
            pkg.attributed_j + pkg.idle_j + pkg.unattributed_j,
            pkg.measured_j
        ),
        "{pkg:?}"
    );
    // Each interval divides its energy by CPU time: 40 J x 0.6/2 + 20 J x
    // 1.5/2 for 5001001; idle is the idle time's share.
    assert!(close(
        process(&report, 5001001).energy.package_j,
        12.0 + 15.0
    ));
    assert!(close(report.energy.groups.other.package_j, 6.0));
    assert!(
        close(pkg.idle_j, 40.0 * 1.1 / 2.0 + 20.0 * 0.5 / 2.0),
        "{pkg:?}"
    );
    // 5002002 is not in the tree: in `other`, not among the processes.
    assert!(report.processes.iter().all(|p| p.pid != 5002002));

    // The stream: two intervals, then the summary; each interval's
    // figures add up too.
    let kinds: Vec<&str> = stream.iter().filter_map(|r| r["type"].as_str()).collect();
    assert_eq!(kinds, ["interval", "interval", "summary"]);
    let iv = &stream[0];
    assert_eq!(iv["duration_ns"], WINDOW_NS);
    assert_eq!(iv["busy_ns"], 900_000_000);
    assert!(close(
        iv["domains"][0]["power_w"].as_f64().unwrap_or(0.0),
        40.0
    ));
    assert!(close(
        iv["groups"]["tree"]["energy_j"].as_f64().unwrap_or(0.0),
        12.0
    ));
    assert_eq!(iv["processes"][0]["pid"], 5001001);
    // The recording keeps every interval as streamed.
    assert_eq!(report.intervals.len(), 2);
    let kept: Value =
        serde_json::from_str(report.intervals.first().expect("one").get()).expect("kept interval");
    assert_eq!(&kept, iv);
}

#[test]
fn a_failed_read_s_energy_goes_to_the_processes_of_its_own_interval() {
    let mut rig = Rig::new(
        "failed-read",
        Scope::Tree,
        Some(Keep::All),
        Filter::default(),
    );
    rig.profile.table.set_root(5001001);
    let user = rig.cgroup("user.slice");
    rig.interval(10.0, &[(5001001, user, 500_000_000)], false);
    // The counter cannot be read while another program, 5002002, runs...
    rig.unreadable = true;
    rig.interval(30.0, &[(5002002, user, 1_000_000_000)], false);
    rig.unreadable = false;
    // ... and the next read covers both intervals: 30 + 10 J over 4 s of
    // CPU time, of which 5002002 ran 1.0 s, and the root 0.2 s.
    rig.interval(10.0, &[(5001001, user, 200_000_000)], true);
    let (report, stream) = rig.finish();
    let pkg = &report.energy.domains[0];
    assert!(close(pkg.measured_j, 50.0), "{pkg:?}");
    // The first interval's 10 W is the lowest power seen, all static: 10
    // J x 0.5/2. The read that covers the failed interval is divided over
    // both: 10 W of static power x 2 s = 20 J by each one's CPU time over
    // the span's 4 s of capacity, the dynamic 20 J by its busy time over
    // the span's 1.2 s (not 40 J over this interval's time alone, as if
    // the failed interval's energy were the next interval's).
    assert!(
        close(
            process(&report, 5001001).energy.package_j,
            2.5 + 20.0 * 0.2 / 4.0 + 20.0 * 0.2 / 1.2
        ),
        "{:?}",
        process(&report, 5001001).energy
    );
    assert!(
        close(
            report.energy.groups.other.package_j,
            20.0 * 1.0 / 4.0 + 20.0 * 1.0 / 1.2
        ),
        "{:?}",
        report.energy.groups
    );
    assert!(
        close(pkg.idle_j, 10.0 * 1.5 / 2.0 + 20.0 * 2.8 / 4.0),
        "{pkg:?}"
    );
    let ivs: Vec<&Value> = stream.iter().filter(|r| r["type"] == "interval").collect();
    assert_eq!(ivs.len(), 3, "no interval is missing");
    assert_eq!(
        ivs[1]["domains"].as_array().map(Vec::len),
        Some(0),
        "{}",
        ivs[1]
    );
    let d = &ivs[2]["domains"][0];
    assert_eq!(d["covers_ns"], 2 * WINDOW_NS, "{d}");
    assert!(close(d["power_w"].as_f64().unwrap_or(0.0), 20.0), "{d}");
    for iv in &ivs {
        for d in iv["domains"].as_array().into_iter().flatten() {
            let f = |k: &str| d[k].as_f64().unwrap_or(f64::NAN);
            assert!(
                close(
                    f("attributed_j") + f("idle_j") + f("unattributed_j"),
                    f("measured_j")
                ),
                "{d}"
            );
        }
    }
    assert!(
        report
            .energy
            .problems
            .iter()
            .any(|p| p.contains("energy_uj")),
        "{:?}",
        report.energy.problems
    );
}

#[test]
fn caught_up_energy_of_a_process_forgotten_meanwhile_goes_to_its_container() {
    let (mut rig, docker) = Rig::machine("held-origin", None);
    let user = rig.cgroup("user.slice");
    rig.interval(10.0, &[(5001001, user, 100_000_000)], false);
    // The container's process runs 1 s and exits while the counter cannot
    // be read; the table forgets it three intervals later.
    rig.unreadable = true;
    rig.exiting = vec![5005005];
    rig.interval(10.0, &[(5005005, docker, 1_000_000_000)], false);
    rig.exiting.clear();
    for _ in 0..4 {
        rig.interval(10.0, &[(5001001, user, 100_000_000)], false);
    }
    assert!(
        rig.profile.table.processes().all(|p| p.pid != 5005005),
        "forgotten"
    );
    rig.unreadable = false;
    rig.interval(10.0, &[(5001001, user, 100_000_000)], true);
    // 60 J over 12 CPU-s: its 1 s is 5 J, in its container.
    let c = rig
        .profile
        .totals()
        .container_reports(None)
        .into_iter()
        .find(|c| c.id == DOCKER_ID)
        .expect("the container");
    assert!(close(c.energy.package_j, 5.0), "{c:?}");
    let _ = rig.finish();
}

#[test]
fn a_window_gets_the_energy_of_the_intervals_between_its_messages() {
    let mut rig = Rig::new("window", Scope::Tree, Some(Keep::All), Filter::default());
    rig.profile.table.set_root(5001001);
    let user = rig.cgroup("user.slice");
    rig.interval(40.0, &[(5001001, user, 1_000_000_000)], false);
    let began = rig
        .profile
        .window_messages([("begin step pid=5001001", 5001001)], rig.at_ns);
    assert!(matches!(began[..], [WindowAnswer::Began]), "{began:?}");
    rig.interval(30.0, &[(5001001, user, 500_000_000)], false);
    let mut ended = rig.profile.window_messages(
        [("end step pid=5001001", 5001001), ("bogus", 5001001)],
        rig.at_ns,
    );
    assert!(
        matches!(&ended[1], WindowAnswer::Refused(e) if e.contains("unknown verb")),
        "{ended:?}"
    );
    let Some(WindowAnswer::Ended(answered)) = ended.drain(..1).next() else {
        panic!("the end was not answered with the window: {ended:?}");
    };
    rig.interval(10.0, &[(5001001, user, 500_000_000)], true);
    let (report, stream) = rig.finish();

    assert_eq!(report.windows.len(), 1);
    let w = &report.windows[0];
    // The sender is told exactly what the recording holds.
    assert_eq!(
        serde_json::to_value(&*answered).expect("json"),
        serde_json::to_value(w).expect("json")
    );
    assert_eq!(w.name, "step");
    assert_eq!((w.begin_ns, w.end_ns), (WINDOW_NS, 2 * WINDOW_NS));
    assert_eq!(w.on_cpu_ns, 500_000_000);
    assert!(close(w.energy.package_j, 30.0 * 0.5 / 2.0), "{w:?}");
    assert!(close(w.machine[0].measured_j, 30.0), "{w:?}");
    assert_eq!(report.window_errors.len(), 1, "{:?}", report.window_errors);
    assert!(
        stream
            .iter()
            .any(|r| r["type"] == "window" && r["name"] == "step")
    );
}

#[test]
fn filters_choose_the_reported_processes_and_energy_still_divides_over_all() {
    let filter = Filter {
        cgroup: Some("/system.slice".into()),
        container: None,
    };
    let scope = Scope::Machine {
        top: 10,
        pids: Vec::new(),
        memory_top: 10,
    };
    let mut rig = Rig::new("filter", scope, Some(Keep::All), filter);
    let cron = rig.cgroup("system.slice/cron.service");
    let user = rig.cgroup("user.slice");
    rig.interval(
        40.0,
        &[(5003003, cron, 500_000_000), (5004004, user, 1_000_000_000)],
        true,
    );
    let (report, stream) = rig.finish();

    let pids: Vec<u32> = report.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, [5003003]);
    // 40 J x 0.5 s / 2 CPU-seconds.
    assert!(close(process(&report, 5003003).energy.package_j, 10.0));
    // 5004004's share is attributed (to `other`, with 5003003's) though it is
    // not shown.
    assert!(close(report.energy.groups.other.package_j, 10.0 + 20.0));
    let rows = stream[0]["processes"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
}

#[test]
fn cgroup_and_container_sums_follow_their_processes() {
    let (mut rig, docker) = Rig::machine("cgroups", Some(Keep::All));
    let cron = rig.cgroup("system.slice/cron.service");
    rig.interval(
        40.0,
        &[
            (5005005, docker, 400_000_000),
            (5005006, docker, 200_000_000),
            (5003003, cron, 200_000_000),
        ],
        false,
    );
    rig.interval(20.0, &[(5005005, docker, 1_000_000_000)], true);
    let containers = rig.profile.totals().container_reports(None);
    let cgroups = rig.profile.totals().cgroup_reports(None);
    let snapshot = crate::sink::snapshot::snapshot(
        &rig.profile.totals(),
        rig.profile.last.as_ref(),
        rig.profile.readers.used(),
        10,
        u64::MAX,
    );
    let (report, _) = rig.finish();

    let c = containers
        .iter()
        .find(|c| c.id == DOCKER_ID)
        .unwrap_or_else(|| panic!("the docker container in {containers:?}"));
    assert_eq!(c.on_cpu_ns, 1_600_000_000);
    assert!(
        close(c.energy.package_j, 40.0 * 0.6 / 2.0 + 20.0 * 0.5),
        "{c:?}"
    );
    let cron_sum = cgroups
        .iter()
        .find(|g| g.path == "/system.slice/cron.service")
        .unwrap_or_else(|| panic!("cron in {cgroups:?}"));
    assert_eq!(cron_sum.on_cpu_ns, 200_000_000);
    assert!(close(cron_sum.energy.package_j, 4.0));
    assert_eq!(report.containers.len(), containers.len());
    // The exporter's view has the same sums.
    let (_, series) = snapshot
        .families
        .iter()
        .find(|(m, _)| m.name == "wattprof_container_cpu")
        .expect("container CPU family");
    assert!(
        series
            .iter()
            .any(|(l, v)| l.iter().any(|(_, x)| x == DOCKER_ID) && close(*v, 1.6)),
        "{series:?}"
    );
}

#[test]
fn cgroups_idle_for_two_minutes_are_pruned_into_their_path_and_sums_stay() {
    let (mut rig, docker) = Rig::machine("prune", None);
    let user = rig.cgroup("user.slice");
    let cron = rig.cgroup("system.slice/cron.service");
    // The container's process runs, then exits; cron's process runs and
    // sleeps from then on (a process still alive keeps its cgroup).
    rig.exiting = vec![5005005];
    rig.interval(
        20.0,
        &[
            (5005005, docker, 1_000_000_000),
            (5003003, cron, 10_000_000),
        ],
        false,
    );
    rig.exiting.clear();
    let cpu_series = |rig: &Rig| -> Option<f64> {
        let snap = crate::sink::snapshot::snapshot(
            &rig.profile.totals(),
            rig.profile.last.as_ref(),
            rig.profile.readers.used(),
            10,
            u64::MAX,
        );
        let (_, series) = snap
            .families
            .iter()
            .find(|(m, _)| m.name == "wattprof_container_cpu")?;
        series
            .iter()
            .find(|(l, _)| l.iter().any(|(_, x)| x == DOCKER_ID))
            .map(|(_, v)| *v)
    };
    // Only user.slice runs for 130 s: the container's cgroup is pruned.
    for _ in 0..130 {
        rig.interval(1.0, &[(5001001, user, 100_000_000)], false);
    }
    assert!(!rig.profile.sums.cgroups.holds(&docker), "pruned");
    assert!(
        rig.profile.sums.cgroups.holds(&cron),
        "a live process's cgroup is kept"
    );
    assert!(
        rig.profile
            .sums
            .cgroups
            .pruned_paths()
            .any(|p| p.contains(DOCKER_ID))
    );
    let container = |rig: &Rig| {
        rig.profile
            .totals()
            .container_reports(None)
            .into_iter()
            .find(|c| c.id == DOCKER_ID)
            .expect("the container is still reported")
    };
    assert_eq!(container(&rig).on_cpu_ns, 1_000_000_000);
    assert!(close(container(&rig).energy.package_j, 20.0 * 1.0 / 2.0));
    assert_eq!(cpu_series(&rig), Some(1.0), "the counter keeps its value");
    // A new process runs in it (same cgroup): its sums go on from there.
    rig.interval(20.0, &[(5005007, docker, 500_000_000)], true);
    assert_eq!(container(&rig).on_cpu_ns, 1_500_000_000);
    // Its sums go on by what the new process got in that interval (how
    // much that is, the static and dynamic split decides).
    let new_j = rig
        .profile
        .last
        .as_ref()
        .and_then(|r| r.process_rows().iter().find(|p| p.pid == 5005007))
        .map_or(0.0, |p| p.package_j);
    assert!(new_j > 0.0);
    assert!(close(container(&rig).energy.package_j, 10.0 + new_j));
    assert_eq!(cpu_series(&rig), Some(1.5), "monotonic");
    let rows: Vec<_> = rig
        .profile
        .totals()
        .cgroup_reports(None)
        .into_iter()
        .filter(|g| g.path.contains(DOCKER_ID))
        .collect();
    assert_eq!(rows.len(), 1, "one row per path: {rows:?}");
    assert_eq!(rows[0].on_cpu_ns, 1_500_000_000);
    let (report, _) = rig.finish();
    assert!(
        report
            .containers
            .iter()
            .any(|c| c.id == DOCKER_ID && c.on_cpu_ns == 1_500_000_000)
    );
}

#[test]
fn the_keep_policy_decides_what_the_recording_holds() {
    let scope = || Scope::Machine {
        top: 10,
        pids: Vec::new(),
        memory_top: 10,
    };
    for (keep, want) in [
        (Some(Keep::All), Some(true)),
        (Some(Keep::MachineOnly), Some(false)),
        (None, None),
    ] {
        let mut rig = Rig::new("keep", scope(), keep, Filter::default());
        let user = rig.cgroup("user.slice");
        rig.interval(10.0, &[(5006006, user, 100_000_000)], false);
        rig.interval(10.0, &[(5006006, user, 100_000_000)], true);
        let (report, stream, recorded) = rig.finish_with_recording();
        assert_eq!(recorded, keep.is_some(), "{keep:?}");
        // The stream always has everything.
        assert!(stream[0]["processes"].is_array());
        match want {
            None => assert!(report.intervals.is_empty(), "{keep:?}"),
            Some(with_processes) => {
                assert_eq!(report.intervals.len(), 2, "{keep:?}");
                let kept: Value = serde_json::from_str(report.intervals.get(1).expect("two").get())
                    .expect("kept interval");
                assert_eq!(kept["type"], "interval");
                assert_eq!(kept.get("processes").is_some(), with_processes, "{keep:?}");
                assert!(close(
                    kept["domains"][0]["measured_j"].as_f64().unwrap_or(0.0),
                    10.0
                ));
            }
        }
    }
}

#[test]
fn monitor_rows_are_the_top_processes_by_energy_in_order() {
    let scope = Scope::Machine {
        top: 2,
        pids: Vec::new(),
        memory_top: 2,
    };
    let mut rig = Rig::new("top", scope, Some(Keep::All), Filter::default());
    let user = rig.cgroup("user.slice");
    // Five processes, more than `top`: the unordered selection path.
    let tasks: Vec<(u32, u64, u64)> = [
        (5007001, 100),
        (5007002, 400),
        (5007003, 200),
        (5007004, 300),
        (5007005, 50),
    ]
    .iter()
    .map(|(pid, ms)| (*pid, user, ms * 1_000_000))
    .collect();
    rig.interval(40.0, &tasks, false);
    let rows = rig
        .profile
        .last
        .as_ref()
        .expect("an interval")
        .process_rows()
        .to_vec();
    let pids: Vec<u32> = rows.iter().map(|r| r.pid).collect();
    assert_eq!(pids, [5007002, 5007004]);
    assert!(close(rows[0].package_j, 40.0 * 0.4 / 2.0), "{rows:?}");
    rig.interval(40.0, &tasks, true);
    let (report, stream) = rig.finish();
    assert_eq!(stream[1]["processes"].as_array().map(Vec::len), Some(2));
    assert!(report.processes.len() >= 2);
}

#[test]
fn static_power_is_learned_against_the_kernel_s_busy_time_not_task_time() {
    // A package of 10 W + 5 W per busy CPU, where the kernel counts 5% of
    // each CPU busy beyond the tasks (interrupts, waking from idle) unless
    // the tasks fill it: task time alone would put the intercept at
    // 10.5 W.
    let mut rig = Rig::new(
        "kernel-busy",
        Scope::Tree,
        Some(Keep::All),
        Filter::default(),
    );
    rig.kernel_extra_ns = WINDOW_NS / 20;
    let user = rig.cgroup("user.slice");
    let loads = [200_000_000u64, 1_000_000_000, 1_800_000_000, 600_000_000];
    for i in 0..16 {
        let busy = loads[i % loads.len()];
        let kernel = |b: u64| (b + WINDOW_NS / 20).min(WINDOW_NS);
        let busy_cpus = (kernel(busy.min(WINDOW_NS)) + kernel(busy.saturating_sub(WINDOW_NS)))
            as f64
            / WINDOW_NS as f64;
        let seconds = WINDOW_NS as f64 / 1e9;
        rig.interval(
            (10.0 + 5.0 * busy_cpus) * seconds,
            &[(5001001, user, busy)],
            i == 15,
        );
    }
    let (report, _) = rig.finish();
    let pkg = &report.energy.domains[0];
    let w = pkg.static_w.expect("a learned figure");
    assert!((w - 10.0).abs() < 0.05, "{w} W: {pkg:?}");
}
