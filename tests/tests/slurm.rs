//! Batch jobs from a real Slurm: Debian's `slurm-wlm` and `munge`, a
//! one-node cluster of the test's own (config, state and munge socket in
//! a temp dir, its own ports, job ids far from any real cluster's), its
//! daemons ended by pid at the end. `cargo xtask test` installs the
//! packages where they are missing; without them the test says
//! `skipping:`. Needs root; run with `--test-threads=1`.
//!
//! The epilog test adds accounting: MariaDB (Debian's
//! `mariadb-server-core`, a data directory of the test's own on its own
//! port) and `slurmdbd`, so that `sacct` shows what the shipped
//! `deploy/slurm-epilog.sh` stores.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wattprof_tests::containers::{cgroup_cpu_ns, stop_monitor};
use wattprof_tests::{
    FakeRapl, PowerLaw, f, free_port, http_get, require_ebpf, tempfile_dir, testload_bin, u,
    wait_for_stream_header, wattprof_bin,
};

const BINARIES: [&str; 5] = [
    "/usr/sbin/munged",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/bin/sbatch",
    "/usr/bin/sinfo",
];

/// How a test's cluster is set up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Slurm's cgroup plugins (proctrack, task, jobacct_gather).
    Cgroups,
    /// The same, with MariaDB, slurmdbd and the shipped epilog
    /// (`deploy/slurm-epilog.sh`, for `wattprof monitor --jobs-dir
    /// DIR/jobs`).
    Accounting,
    /// No cgroups: `proctrack/linuxproc`, `task/none`: a job's processes
    /// stay where slurmd is, and only their environment names the job.
    Linuxproc,
}

/// What the epilog test needs besides [`BINARIES`].
const ACCOUNTING: [&str; 4] = [
    "/usr/sbin/mariadbd",
    "/usr/bin/mariadb-install-db",
    "/usr/sbin/slurmdbd",
    "/usr/bin/sacctmgr",
];

/// A one-node cluster: munged, slurmctld and slurmd (and, with
/// accounting, mariadbd and slurmdbd), each a child of the test
/// (`-F`/`-D`: not daemonized), ended when dropped.
struct Cluster {
    dir: PathBuf,
    daemons: Vec<Child>,
    /// The jobs submitted, ended at the end.
    jobs: std::cell::RefCell<Vec<String>>,
}

impl Cluster {
    /// Starts the cluster in `dir`; `Err`: why it cannot run here.
    fn start(dir: &Path, mode: Mode) -> Result<Self, String> {
        let accounting = mode == Mode::Accounting;
        if let Some(missing) = BINARIES.iter().find(|b| !Path::new(b).exists()) {
            return Err(format!(
                "{missing} is not installed (apt-get install slurm-wlm munge)"
            ));
        }
        // Slurm's cgroup/v1 plugin on a host with v1 controllers (this
        // VM's hybrid layout), cgroup/v2 on a unified one.
        let plugin = if v1_host() { "cgroup/v1" } else { "cgroup/v2" };
        let systemd = std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd");
        if plugin == "cgroup/v2" && !systemd && mode != Mode::Linuxproc {
            return Err("Slurm 22.05's cgroup/v2 plugin needs systemd (dbus) for its scope, and systemd does not run here".into());
        }
        write_config(dir, plugin, mode)?;
        let d = dir.display();
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            daemons: Vec::new(),
            jobs: std::cell::RefCell::default(),
        };
        let log = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null())
        };
        let munged = Command::new("/usr/sbin/munged")
            .args(["-F", "-f"])
            .arg(format!("--key-file={d}/munge.key"))
            .arg(format!("--socket={d}/munge.sock"))
            .arg(format!("--pid-file={d}/munged.pid"))
            .arg(format!("--log-file={d}/munged.log"))
            .arg(format!("--seed-file={d}/munged.seed"))
            .stdout(log("munged.out"))
            .stderr(log("munged.err"))
            .spawn()
            .map_err(|e| format!("munged: {e}"))?;
        cluster.daemons.push(munged);
        if !wait(Duration::from_secs(10), || dir.join("munge.sock").exists()) {
            return Err(format!("munged did not start: {}", cluster.logs()));
        }
        if accounting {
            cluster.start_accounting(&log)?;
        }
        for (daemon, out) in [("/usr/sbin/slurmctld", "ctld"), ("/usr/sbin/slurmd", "d")] {
            let child = cluster
                .command(daemon)
                .arg("-D")
                .stdout(log(&format!("{out}.out")))
                .stderr(log(&format!("{out}.err")))
                .spawn()
                .map_err(|e| format!("{daemon}: {e}"))?;
            cluster.daemons.push(child);
        }
        let idle = || {
            cluster
                .command("/usr/bin/sinfo")
                .args(["-h", "-o", "%t"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        };
        if !wait(Duration::from_secs(30), idle) {
            return Err(format!("the node never became idle: {}", cluster.logs()));
        }
        Ok(cluster)
    }

    /// MariaDB in `dir/db` (its own port, root without a password on
    /// 127.0.0.1 only), then slurmdbd on it, then the cluster registered.
    fn start_accounting(&mut self, log: &dyn Fn(&str) -> Stdio) -> Result<(), String> {
        let d = self.dir.display().to_string();
        let installed = Command::new("/usr/bin/mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg("--auth-root-authentication-method=normal")
            .arg(format!("--datadir={d}/db"))
            .stdout(log("install-db.out"))
            .stderr(log("install-db.err"))
            .status()
            .map_err(|e| format!("mariadb-install-db: {e}"))?;
        if !installed.success() {
            return Err(format!("mariadb-install-db failed: {}", self.logs()));
        }
        let port = std::fs::read_to_string(self.dir.join("db-port")).map_err(|e| e.to_string())?;
        let mariadbd = Command::new("/usr/sbin/mariadbd")
            .args(["--no-defaults", "--user=root", "--bind-address=127.0.0.1"])
            .arg(format!("--datadir={d}/db"))
            .arg(format!("--port={}", port.trim()))
            .arg(format!("--socket={d}/mariadb.sock"))
            .arg(format!("--pid-file={d}/mariadb.pid"))
            .arg(format!("--log-error={d}/mariadb.log"))
            .stdout(log("mariadb.out"))
            .stderr(log("mariadb.err"))
            .spawn()
            .map_err(|e| format!("mariadbd: {e}"))?;
        self.daemons.push(mariadbd);
        if !wait(Duration::from_secs(30), || {
            self.dir.join("mariadb.sock").exists()
        }) {
            return Err(format!("mariadbd did not start: {}", self.logs()));
        }
        let slurmdbd = self
            .command("/usr/sbin/slurmdbd")
            .arg("-D")
            .stdout(log("dbd.out"))
            .stderr(log("dbd.err"))
            .spawn()
            .map_err(|e| format!("slurmdbd: {e}"))?;
        self.daemons.push(slurmdbd);
        // The cluster in the database, before slurmctld registers.
        let added = || {
            self.command("/usr/bin/sacctmgr")
                .args(["-i", "add", "cluster", "wattproftest"])
                .output()
                .is_ok_and(|o| {
                    o.status.success()
                        || String::from_utf8_lossy(&o.stdout).contains("already exists")
                })
        };
        if !wait(Duration::from_secs(30), added) {
            return Err(format!(
                "slurmdbd did not take the cluster: {}",
                self.logs()
            ));
        }
        Ok(())
    }

    /// What `sacct` holds of `job`'s `field` (the job's own line).
    fn sacct(&self, job: &str, field: &str) -> String {
        self.command("/usr/bin/sacct")
            .args(["-n", "-X", "-P", "-j", job, "-o", field])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    /// A Slurm command on this cluster.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", self.dir.join("slurm.conf"));
        c
    }

    /// Submits `script` as a one-task batch job: its id.
    fn sbatch(&self, script: &str) -> String {
        let out = self
            .command("/usr/bin/sbatch")
            .args(["--parsable", "-n1", "-o"])
            .arg(self.dir.join("job-%j.out"))
            .args(["--wrap", script])
            .output()
            .expect("sbatch");
        assert!(
            out.status.success(),
            "sbatch: {}{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        self.jobs.borrow_mut().push(id.clone());
        id
    }

    /// Ends a job (the node has as many CPUs as jobs can wait on it).
    fn scancel(&self, job: &str) {
        let _ = self.command("/usr/bin/scancel").arg(job).status();
    }

    /// The ends of the daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        [
            "munged.log",
            "mariadb.log",
            "slurmdbd.log",
            "slurmctld.log",
            "slurmd.log",
            "ctld.err",
            "d.err",
        ]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("\n--- {f}:\n{}", tail.join("\n"))
        })
        .collect()
    }
}

/// The cluster's files in `dir`: a munge key, slurm.conf and cgroup.conf
/// (`plugin`: Slurm's cgroup plugin); with accounting, slurmdbd.conf,
/// MariaDB's port in `db-port`, and the epilog.
fn write_config(dir: &Path, plugin: &str, mode: Mode) -> Result<(), String> {
    for sub in ["ctld", "d"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
    }
    let key = dir.join("munge.key");
    let mut random = vec![0u8; 1024];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| e.to_string())?;
    std::fs::write(&key, &random).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400))
        .map_err(|e| e.to_string())?;
    let host = Command::new("hostname")
        .arg("-s")
        .output()
        .map_err(|e| e.to_string())?;
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let d = dir.display();
    let (ctld_port, d_port) = (free_port(), free_port());
    // Job ids of their own: the v1 cgroups are named by node and job.
    let first_job = 700_000 + std::process::id() % 100_000;
    let conf = format!(
        "ClusterName=wattproftest\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld_port}\n\
             SlurmdPort={d_port}\nAuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\n\
             CredType=cred/munge\nProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n\
             JobAcctGatherType=jobacct_gather/cgroup\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nSlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={d}/ctld\nSlurmdSpoolDir={d}/d\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             ReturnToService=2\nMpiDefault=none\nFirstJobId={first_job}\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
             PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP\n"
    );
    let conf = match mode {
        Mode::Cgroups => conf,
        Mode::Accounting => conf + &write_accounting(dir)?,
        Mode::Linuxproc => conf
            .replace(
                "ProctrackType=proctrack/cgroup",
                "ProctrackType=proctrack/linuxproc",
            )
            .replace("TaskPlugin=task/cgroup", "TaskPlugin=task/none")
            .replace(
                "JobAcctGatherType=jobacct_gather/cgroup",
                "JobAcctGatherType=jobacct_gather/linux",
            ),
    };
    std::fs::write(dir.join("slurm.conf"), conf).map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("cgroup.conf"),
        format!("CgroupPlugin={plugin}\nConstrainCores=yes\n"),
    )
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// slurmdbd.conf (mode 600, as slurmdbd requires), MariaDB's port in
/// `db-port`, and `epilog.sh`, which runs the shipped epilog for `wattprof
/// monitor --jobs-dir DIR/jobs`; returns slurm.conf's lines for them.
fn write_accounting(dir: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let d = dir.display();
    let (db_port, dbd_port) = (free_port(), free_port());
    std::fs::write(dir.join("db-port"), db_port.to_string()).map_err(|e| e.to_string())?;
    let dbd = format!(
        "AuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\nDbdHost=localhost\n\
         DbdAddr=127.0.0.1\nDbdPort={dbd_port}\nSlurmUser=root\n\
         StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n\
         StorageUser=root\nStorageLoc=wattprof_acct\nPidFile={d}/slurmdbd.pid\n\
         LogFile={d}/slurmdbd.log\n"
    );
    let path = dir.join("slurmdbd.conf");
    std::fs::write(&path, dbd).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| e.to_string())?;
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm-epilog.sh");
    let epilog = format!(
        "#!/bin/sh\nWATTPROF={} WATTPROF_JOBS_DIR={d}/jobs WATTPROF_EPILOG_WAIT_S=60 exec {}\n",
        wattprof_bin().display(),
        shipped.display()
    );
    let path = dir.join("epilog.sh");
    std::fs::write(&path, epilog).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    // The munge socket for slurmdbd is AccountingStoragePass's.
    Ok(format!(
        "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n\
         AccountingStoragePort={dbd_port}\nAccountingStoragePass={d}/munge.sock\n\
         Epilog={d}/epilog.sh\n"
    ))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The jobs first, while slurmd is there to end their steps; a
        // step's slurmstepd outlives slurmd by design, so any left are
        // killed by pid.
        let jobs = std::mem::take(&mut *self.jobs.borrow_mut());
        for j in &jobs {
            self.scancel(j);
        }
        let none_left = || {
            self.command("/usr/bin/squeue")
                .arg("-h")
                .output()
                .is_ok_and(|o| o.status.success() && o.stdout.is_empty())
        };
        wait(Duration::from_secs(20), none_left);
        kill_steps(&jobs, &self.dir);
        remove_job_cgroups(&jobs);
        // slurmd, slurmctld, then munged: each by its pid, SIGTERM, then
        // SIGKILL after 10 s.
        for mut child in self.daemons.drain(..).rev() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            if !wait(Duration::from_secs(10), || {
                child.try_wait().is_ok_and(|s| s.is_some())
            }) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Kills, by pid, what is left of `jobs`: their `slurmstepd`s and the
/// processes of their scripts (which live in the cluster's `dir`).
fn kill_steps(jobs: &[String], dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let dir = dir.to_string_lossy().into_owned();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let ours = cmdline.contains(&dir)
            || jobs
                .iter()
                .any(|j| cmdline.starts_with(&format!("slurmstepd: [{j}.")));
        if ours {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Removes what Slurm left of `jobs`' cgroups (a step whose slurmstepd
/// was killed keeps its directories), deepest first, on every v1
/// hierarchy; then the node's and uid's if they are empty.
fn remove_job_cgroups(jobs: &[String]) {
    fn remove_tree(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let Ok(tops) = std::fs::read_dir(h.path()) else {
            continue;
        };
        for top in tops.flatten() {
            let name = top.file_name().to_string_lossy().into_owned();
            if name != "slurm" && !name.starts_with("slurm_") {
                continue;
            }
            let uid = top.path().join("uid_0");
            for j in jobs {
                remove_tree(&uid.join(format!("job_{j}")));
            }
            let _ = std::fs::remove_dir(&uid);
            // Slurm's own, and the node's, where nothing is in them (a
            // real slurmd's are busy and stay).
            let _ = std::fs::remove_dir(top.path().join("system"));
            let _ = std::fs::remove_dir(top.path());
        }
    }
}

/// Polls `ok` every 100 ms for up to `limit`.
fn wait(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ok()
}

/// The job's batch step's cgroup paths (Slurm's own, v1 then v2), for
/// its CPU time as the kernel counts it.
fn batch_step(job: &str) -> Vec<String> {
    let node = Command::new("hostname")
        .arg("-s")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    vec![
        format!("/slurm_{node}/uid_0/job_{job}/step_batch"),
        format!("/slurm/uid_0/job_{job}/step_batch"),
        format!("/system.slice/slurmstepd.scope/job_{job}/step_batch"),
        format!("/system.slice/{node}_slurmstepd.scope/job_{job}/step_batch"),
    ]
}

/// A `monitor` child, interrupted at the end, or killed if the test
/// panics first (an eBPF-attached root process must not outlive it).
struct Monitor(Option<Child>);

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Slurm's cgroup/v1 plugin works here (v1 controllers mounted).
fn v1_host() -> bool {
    Path::new("/sys/fs/cgroup/freezer").exists()
}

/// The fixture's laws (static W, W per busy CPU): not round numbers.
const PACKAGE: PowerLaw = PowerLaw {
    static_w: 13.7,
    per_cpu_w: 9.1,
};
const DRAM: PowerLaw = PowerLaw {
    static_w: 1.37,
    per_cpu_w: 0.41,
};

/// The test's fresh folder and its cluster; `None`, said as skipped,
/// where the packages are missing or Slurm 22.05 cannot run jobs on this
/// host; any other failure to start is the test's.
fn cluster_or_skip(name: &str, mode: Mode) -> Option<(PathBuf, Cluster)> {
    let dir = tempfile_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (needed, packages): (&[&str], &str) = if mode == Mode::Accounting {
        (&ACCOUNTING, "slurm-wlm munge slurmdbd mariadb-server-core")
    } else {
        (&[], "slurm-wlm munge")
    };
    if let Some(missing) = BINARIES
        .iter()
        .chain(needed)
        .find(|b| !Path::new(b).exists())
    {
        wattprof_tests::say_skip(&format!(
            "{missing} is not installed (apt-get install {packages})"
        ));
        return None;
    }
    match Cluster::start(&dir, mode) {
        Ok(c) => Some((dir, c)),
        Err(why) if why.contains("needs systemd") => {
            wattprof_tests::say_skip(&why);
            None
        }
        Err(why) => panic!("the one-node Slurm did not start: {why}"),
    }
}

/// `monitor` on a RAPL fixture whose power follows the load, with the
/// host model that knows it (a job's energy is then its own, whoever
/// runs beside it), every `interval`, writing `dir/m.json` and
/// `dir/m.jsonl`, with `extra` arguments; started once its stream's
/// header is out. The fixture lives as long as the returned value.
fn start_monitor(dir: &Path, interval: &str, extra: &[&std::ffi::OsStr]) -> (Monitor, FakeRapl) {
    let rapl = FakeRapl::following(PACKAGE, DRAM);
    let model = wattprof_tests::host_model_file(dir, PACKAGE, DRAM);
    let stream = dir.join("m.jsonl");
    let monitor = Monitor(Some(
        Command::new(wattprof_bin())
            .args([
                "monitor",
                &rapl.arg(),
                "--interval",
                interval,
                "--host-model",
            ])
            .arg(&model)
            .arg("--output")
            .arg(dir.join("m.json"))
            .arg("--jsonl")
            .arg(&stream)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("monitor"),
    ));
    wait_for_stream_header(&stream);
    (monitor, rapl)
}

/// Package joules per CPU-second of a job in the recording.
fn j_per_cpu_s(job: &Value) -> f64 {
    f(job, "/energy/package_j") / (u(job, "/on_cpu_ns") as f64 / 1e9)
}

#[test]
fn slurm_jobs_are_named_split_as_slurm_counts_their_cpu_and_charged_alike_alone_or_not() {
    require_ebpf!();
    let Some((dir, cluster)) = cluster_or_skip("slurm", Mode::Cgroups) else {
        return;
    };
    let (out, stream, jobs_dir) = (dir.join("m.json"), dir.join("m.jsonl"), dir.join("jobs"));
    let addr = format!("127.0.0.1:{}", free_port());
    let (mut monitor, _rapl) = start_monitor(
        &dir,
        "1s",
        &[
            "--prometheus".as_ref(),
            addr.as_ref(),
            "--jobs-dir".as_ref(),
            jobs_dir.as_ref(),
        ],
    );
    // Each job burns, says so, and waits (its cgroups stay, to be read)
    // until the test ends it.
    let load = testload_bin();
    let job = |tag: &str, cpu: &str| {
        let done = dir.join(format!("done-{tag}"));
        let script = format!(
            "{} cpu {cpu} > /dev/null; touch '{}'; sleep 120",
            load.display(),
            done.display()
        );
        (cluster.sbatch(&script), done)
    };
    // One alone on the node, then two beside each other, about 2:1.
    // Long enough that the ~16 ms slurmstepd's child spends before it
    // is moved into the job's cgroups (wattprof counts it to the job,
    // where the process ends up; the cgroups cannot) is 0.4% of the
    // ratio, not the 1.3% of 1.2 and 0.6 s.
    let (alone, alone_done) = job("alone", "3.6");
    assert!(
        wait(Duration::from_secs(60), || alone_done.exists()),
        "the lone job did not burn within 60 s:{}",
        cluster.logs()
    );
    cluster.scancel(&alone);
    // Its file, once its cgroups are gone.
    let alone_file = jobs_dir.join(format!("slurm-{alone}.json"));
    assert!(
        wait(Duration::from_secs(15), || alone_file.exists()),
        "no {} after the job ended",
        alone_file.display()
    );
    let (a, a_done) = job("a", "3.6");
    let (b, b_done) = job("b", "1.8");
    let finished = wait(Duration::from_secs(60), || {
        a_done.exists() && b_done.exists()
    });
    assert!(
        finished,
        "the jobs did not burn within 60 s:{}",
        cluster.logs()
    );
    // Their CPU as Slurm's own cgroups count it, while they still exist.
    std::thread::sleep(Duration::from_millis(600));
    let kernel: Vec<u64> = [&a, &b]
        .iter()
        .map(|j| {
            cgroup_cpu_ns(&batch_step(j))
                .unwrap_or_else(|| panic!("job {j}'s cgroup:{}", cluster.logs()))
        })
        .collect();
    // The live series, per job step and domain.
    let (status, metrics) = http_get(&addr, "/metrics").expect("/metrics");
    assert_eq!(status, 200);
    for j in [&a, &b] {
        let series = format!(
            "wattprof_job_energy_joules_total{{scheduler=\"slurm\",job_id=\"{j}\",step=\"batch\",user=\"root\",domain=\"package\"}}"
        );
        assert!(
            metrics.contains(&series),
            "{series} missing from:\n{metrics}"
        );
    }
    stop_monitor(monitor.0.take().expect("monitor"));
    check_jobs(&out, [&alone, &a, &b], &kernel);
    check_stream_jobs(&stream, [&alone, &a, &b]);
    check_job_file(&alone_file, &out, &alone);
    drop(cluster);
}

#[test]
fn the_shipped_epilog_puts_a_job_s_joules_in_sacct() {
    require_ebpf!();
    let Some((dir, cluster)) = cluster_or_skip("slurm-epilog", Mode::Accounting) else {
        return;
    };
    let (out, jobs_dir) = (dir.join("m.json"), dir.join("jobs"));
    let (mut monitor, _rapl) =
        start_monitor(&dir, "500ms", &["--jobs-dir".as_ref(), jobs_dir.as_ref()]);
    // A job that burns and ends by itself: Slurm runs the epilog, which
    // waits for the job's file and stores its line in AdminComment.
    let job = cluster.sbatch(&format!("{} cpu 1.0 > /dev/null", testload_bin().display()));
    // An earlier run's file of the same job id (a requeued job): the
    // epilog must wait for this run's, not store that one's 1 J.
    write_stale_job_file(&jobs_dir, &job);
    let stored = || {
        cluster
            .sacct(&job, "AdminComment")
            .starts_with("wattprof:total_j=")
    };
    assert!(
        wait(Duration::from_secs(90), stored),
        "sacct shows no wattprof figure for job {job} (AdminComment {:?}; epilog.log: {:?}):{}",
        cluster.sacct(&job, "AdminComment"),
        std::fs::read_to_string(jobs_dir.join("epilog.log")).unwrap_or_default(),
        cluster.logs()
    );
    let comment = cluster.sacct(&job, "AdminComment");
    eprintln!("sacct -j {job} -X -o AdminComment: {comment}");
    stop_monitor(monitor.0.take().expect("monitor"));
    let file_path = jobs_dir.join(format!("slurm-{job}.json"));
    check_job_file(&file_path, &out, &job);
    // The figure in sacct is the job file's (to the mJ it is printed to)
    // and `wattprof report --comment`'s, whole.
    let file: Value =
        serde_json::from_slice(&std::fs::read(&file_path).expect("job file")).expect("JSON");
    let figure = |key: &str| -> f64 {
        comment
            .split(',')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {comment:?}"))
    };
    for (key, ptr) in [
        ("wattprof:total_j=", "/energy/total_j"),
        ("package_j=", "/energy/package_j"),
        ("dram_j=", "/energy/dram_j"),
    ] {
        let (stored, filed) = (figure(key), f(&file, ptr));
        assert!(
            (stored - filed).abs() <= 0.0005 + 1e-9,
            "{key}: sacct {stored}, file {filed}"
        );
    }
    assert!(figure("wattprof:total_j=") > 1.0, "{comment}");
    let report = Command::new(wattprof_bin())
        .args(["report", "--comment"])
        .arg(&file_path)
        .output()
        .expect("report");
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&report.stdout).trim(), comment);
    assert_eq!(cluster.sacct(&job, "State"), "COMPLETED");
    drop(cluster);
}

#[test]
fn without_cgroups_a_job_is_named_by_its_slurmstepd_and_its_short_children_too() {
    require_ebpf!();
    let Some((dir, cluster)) = cluster_or_skip("slurm-linuxproc", Mode::Linuxproc) else {
        return;
    };
    let out = dir.join("m.json");
    let (mut monitor, _rapl) = start_monitor(&dir, "500ms", &[]);
    // A burn, then 200 processes that each live well under an interval
    // (gone before any /proc file of theirs is read), then the script's
    // own count of its children's CPU time (cutime + cstime, in ticks),
    // then a wait.
    let (done, stat) = (dir.join("done"), dir.join("stat"));
    let load = testload_bin();
    let script = format!(
        "{} cpu 1.0 > /dev/null; i=0; while [ $i -lt 200 ]; do {} cpu 0.005 > /dev/null; \
         i=$((i+1)); done; cat /proc/$$/stat > '{}'; touch '{}'; sleep 120",
        load.display(),
        load.display(),
        stat.display(),
        done.display()
    );
    let job = cluster.sbatch(&script);
    assert!(
        wait(Duration::from_secs(60), || done.exists()),
        "the job did not burn within 60 s:{}",
        cluster.logs()
    );
    std::thread::sleep(Duration::from_millis(1200));
    stop_monitor(monitor.0.take().expect("monitor"));
    let report: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("recording")).expect("JSON");
    let j = report["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["job_id"] == job.as_str()))
        .unwrap_or_else(|| panic!("job {job} missing from {}", report["jobs"]));
    assert_eq!(j["user"], "root", "{j}");
    assert_eq!(j["steps"][0]["step"], "batch", "{j}");
    assert_eq!(
        j["steps"][0]["cgroups"][0],
        format!("slurmstepd:/slurm/uid_0/job_{job}/step_batch"),
        "{j}"
    );
    // The burn (1 s) and the 200 short ones (1 s together), as the
    // kernel counted them for the script: all in the job, the short ones
    // by their parent's job; and not more than the script and its
    // children ran, with 0.1 s for slurmstepd's child before its exec and
    // the commands after the count.
    let text = std::fs::read_to_string(&stat).expect("the script's stat");
    let fields: Vec<&str> = text[text.rfind(')').expect("stat") + 2..]
        .split(' ')
        .collect();
    // SAFETY: sysconf has no memory preconditions.
    let tick_s = 1.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks = |i: usize| fields[i].parse::<f64>().expect("a stat field") * tick_s;
    let (own_s, children_s) = (ticks(11) + ticks(12), ticks(13) + ticks(14));
    let cpu_s = u(j, "/on_cpu_ns") as f64 / 1e9;
    eprintln!(
        "job {job}: {cpu_s:.3} CPU-s, {:.3} J; the script: {own_s:.3} CPU-s, its children: \
         {children_s:.3}",
        f(j, "/energy/package_j")
    );
    assert!(children_s > 1.5, "the children ran {children_s} s");
    assert!(
        cpu_s >= 0.97 * (own_s + children_s),
        "{cpu_s} CPU-s in the job, the script and its children ran {own_s} + {children_s} s"
    );
    assert!(
        cpu_s <= own_s + children_s + 0.1,
        "{cpu_s} CPU-s in the job, the script and its children ran {own_s} + {children_s} s"
    );
    drop(cluster);
}

/// A job file for `job` in `dir` as an earlier run of the same id left
/// it an hour ago: 1 J on node `old`.
fn write_stale_job_file(dir: &Path, job: &str) {
    std::fs::create_dir_all(dir).expect("jobs dir");
    let stale = r#"{"type": "wattprof_job", "wattprof_version": "0", "node": "old",
        "first_unix_ns": 1, "last_unix_ns": 2, "scheduler": "slurm", "job_id": "JOB",
        "first_ns": 1, "last_ns": 2, "on_cpu_ns": 1, "energy": {"package_j": 1.0,
        "total_j": 1.0, "avg_power_w": 0.0, "co2_g": 0.0}, "steps": []}"#;
    let path = dir.join(format!("slurm-{job}.json"));
    std::fs::write(&path, stale.replace("JOB", job)).expect("stale file");
    // Written at that run's end, an hour ago.
    let then = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(then))
        .expect("the stale file's time");
}

/// The stream's summary line holds `jobs`, as the recording does.
fn check_stream_jobs(stream: &Path, jobs: [&str; 3]) {
    let text = std::fs::read_to_string(stream).expect("stream");
    let summary: Value = serde_json::from_str(text.lines().last().expect("a line")).expect("JSON");
    assert_eq!(summary["type"], "summary");
    for j in jobs {
        let listed = summary["jobs"]
            .as_array()
            .is_some_and(|js| js.iter().any(|x| x["job_id"] == j));
        assert!(listed, "job {j} missing from the stream's summary");
    }
}

/// The recording's jobs against Slurm's own cgroups: each named (id,
/// user, step); the pair's package energy split as their cgroups' CPU
/// time (`kernel`, in `a`, `b` order), within 1%; and the same joules per
/// CPU-second alone on the node as beside another job, within 2%.
fn check_jobs(out: &Path, [alone, a, b]: [&str; 3], kernel: &[u64]) {
    let report: Value =
        serde_json::from_slice(&std::fs::read(out).expect("recording")).expect("JSON");
    wattprof_tests::schema::assert_valid("recording", &report);
    let jobs = report["jobs"].as_array().expect("jobs[]");
    let of = |id: &str| {
        jobs.iter()
            .find(|j| j["job_id"] == id)
            .unwrap_or_else(|| panic!("job {id} missing from {jobs:?}"))
    };
    let (ja, jb, jalone) = (of(a), of(b), of(alone));
    for j in [ja, jb, jalone] {
        assert_eq!(j["scheduler"], "slurm", "{j}");
        // The uid is in Slurm's v1 paths only.
        if v1_host() {
            assert_eq!(j["user"], "root", "{j}");
            assert_eq!(j["uid"], 0, "{j}");
        }
        assert_eq!(j["steps"][0]["step"], "batch", "{j}");
        assert!(u(j, "/last_ns") >= u(j, "/first_ns"), "{j}");
    }
    let (ea, eb) = (f(ja, "/energy/package_j"), f(jb, "/energy/package_j"));
    let (energy, cpu) = (ea / eb, kernel[0] as f64 / kernel[1] as f64);
    eprintln!(
        "job {a}: {ea:.3} J, {:.3} s (its cgroup); job {b}: {eb:.3} J, {:.3} s: \
         energy {energy:.4}:1, CPU {cpu:.4}:1",
        kernel[0] as f64 / 1e9,
        kernel[1] as f64 / 1e9
    );
    assert!(
        (energy / cpu - 1.0).abs() < 0.01,
        "energy {energy} against CPU {cpu}"
    );
    eprintln!(
        "wattprof's CPU time: {:.4}:1 ({} and {} ns; the cgroups: {kernel:?})",
        u(ja, "/on_cpu_ns") as f64 / u(jb, "/on_cpu_ns") as f64,
        u(ja, "/on_cpu_ns"),
        u(jb, "/on_cpu_ns")
    );
    let (beside, lone) = (j_per_cpu_s(ja), j_per_cpu_s(jalone));
    eprintln!(
        "J per CPU-second: {lone:.3} alone, {beside:.3} beside another job ({:.4})",
        beside / lone
    );
    assert!((beside / lone - 1.0).abs() < 0.02, "{beside} vs {lone}");
}

/// The file `--jobs-dir` wrote at `file_path` for job `id`: its figures
/// are the recording's (`out`), to the µJ.
fn check_job_file(file_path: &Path, out: &Path, id: &str) {
    // The lone job's file: its figures are the recording's, to the µJ.
    let file: Value =
        serde_json::from_slice(&std::fs::read(file_path).expect("job file")).expect("JSON");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out).expect("recording")).expect("JSON");
    let recorded = report["jobs"]
        .as_array()
        .and_then(|j| j.iter().find(|j| j["job_id"] == id))
        .expect("the lone job");
    assert_eq!(file["type"], "wattprof_job");
    for ptr in ["/energy/total_j", "/energy/package_j", "/energy/static_j"] {
        let (a, b) = (f(&file, ptr), f(recorded, ptr));
        assert!((a - b).abs() < 1e-6, "{ptr}: file {a} J, recording {b} J");
    }
    assert!(
        u(&file, "/last_unix_ns") > u(&file, "/first_unix_ns"),
        "{file}"
    );
}
