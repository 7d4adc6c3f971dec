//! Function names for the stack sampler's frames, through blazesym.
//!
//! User frames arrive as (build id, file offset) pairs: the file is found
//! from its build id among the files processes executed (the sampler
//! reports every exec) and mapped (read from `/proc/PID/maps` while the
//! process lives), so a process that lived 20 ms is named long after it
//! exited. Frames the kernel could give only as an address (JIT code, a
//! file without build id) are named through the live process (its maps
//! and its perf map, `/tmp/perf-PID.map`), or through its perf map alone
//! once it has exited. Kernel frames are named from `/proc/kallsyms`.
//! What cannot be named is `[unknown]` with the module it is in, never
//! dropped.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::{MaybeDefault, Pid};

use crate::tracker::stacks::UserFrame;

/// The suffix of kernel frames (flame graph tools colour them apart).
pub(crate) const KERNEL_SUFFIX: &str = "_[k]";

/// Starts the key of a frame in a file: build id and offset, in hex.
const FILE_KEY: char = '\u{1}';
/// Starts the key of a kernel frame: its address, in hex.
const KERNEL_KEY: char = '\u{2}';

/// Most processes whose maps are remembered as read, and most cached
/// frame names; past it the caches start again (names are only
/// recomputed, never lost).
const CACHE_LIMIT: usize = 200_000;

/// Names frames.
pub(crate) struct Symbols {
    symbolizer: Symbolizer,
    /// Build id (zero-padded) to a file that has it.
    files: HashMap<[u8; 20], PathBuf>,
    /// Files whose build id was read.
    read: HashSet<PathBuf>,
    /// Processes whose maps were read.
    scanned: HashSet<u32>,
    /// Names of file frames already found.
    names: HashMap<([u8; 20], u64), Vec<String>>,
    kernel_names: HashMap<u64, String>,
    /// Files of build ids found only inside a process (a container),
    /// held open so they can be read after it exits.
    held: Vec<std::fs::File>,
    /// Parsed perf maps of exited processes.
    perf_maps: HashMap<u32, Vec<(u64, u64, String)>>,
    /// Where `/proc` is (tests point it elsewhere).
    proc_root: PathBuf,
    /// Where perf maps are written.
    tmp: PathBuf,
    /// When naming started (perf maps older than this are not ours).
    started: std::time::SystemTime,
}

impl Default for Symbols {
    fn default() -> Self {
        Self::new("/proc", "/tmp")
    }
}

impl Symbols {
    /// Symbols for processes under `proc_root`, with perf maps in `tmp`.
    pub(crate) fn new(proc_root: impl Into<PathBuf>, tmp: impl Into<PathBuf>) -> Self {
        let mut s = Self {
            symbolizer: new_symbolizer(),
            held: Vec::new(),
            files: HashMap::new(),
            read: HashSet::new(),
            scanned: HashSet::new(),
            names: HashMap::new(),
            kernel_names: HashMap::new(),
            perf_maps: HashMap::new(),
            proc_root: proc_root.into(),
            tmp: tmp.into(),
            started: std::time::SystemTime::now() - std::time::Duration::from_secs(1),
        };
        // Our own libraries are the system's: index them up front.
        s.scan_maps("self");
        s
    }

    /// Files `tgid` executed: `path` as given to execve.
    pub(crate) fn saw_exec(&mut self, tgid: u32, path: &str) {
        // A new image: its maps are worth reading again.
        self.scanned.remove(&tgid);
        let p = Path::new(path);
        let dir = self.proc_root.join(tgid.to_string());
        let inside = if p.is_absolute() {
            // In the process's own mount namespace (a container).
            dir.join("root").join(p.strip_prefix("/").unwrap_or(p))
        } else {
            dir.join("cwd").join(p)
        };
        if !self.index(&inside, p) {
            self.index(p, p);
        }
    }

    /// Records the build id of the file at `inside` (a path through the
    /// process, valid while it lives); the path kept is one that outlives
    /// it: `host` when it is the same file, else the file held open.
    /// Returns whether the file could be read.
    fn index(&mut self, inside: &Path, host: &Path) -> bool {
        if self.read.contains(inside) {
            return true;
        }
        let Ok(id) = blazesym::helper::read_elf_build_id(inside) else {
            return false;
        };
        if self.read.len() >= CACHE_LIMIT {
            self.read.clear();
        }
        self.read.insert(inside.to_path_buf());
        let Some(id) = id else {
            return true;
        };
        let key = pad(&id);
        if self.files.contains_key(&key) {
            return true;
        }
        let same_on_host = inside == host
            || blazesym::helper::read_elf_build_id(host)
                .ok()
                .flatten()
                .is_some_and(|h| pad(&h) == key);
        let stable = if same_on_host {
            Some(host.to_path_buf())
        } else {
            self.hold(inside)
        };
        if let Some(path) = stable {
            self.files.insert(key, path);
        }
        true
    }

    /// Keeps `path` open and returns a path to it that outlives its
    /// process (`/proc/self/fd/N`); past HELD_FILES, `path` itself.
    fn hold(&mut self, path: &Path) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        if self.held.len() >= HELD_FILES {
            return Some(path.to_path_buf());
        }
        let f = std::fs::File::open(path).ok()?;
        let fd = f.as_raw_fd();
        self.held.push(f);
        Some(PathBuf::from(format!("/proc/self/fd/{fd}")))
    }

    /// Drops what naming cached (blazesym's parsed files, perf maps, frame
    /// names), so a long `monitor` stays bounded; the build-id index stays.
    pub(crate) fn trim(&mut self) {
        self.symbolizer = new_symbolizer();
        self.perf_maps.clear();
        self.names.clear();
        self.kernel_names.clear();
    }

    /// Bytes held, roughly (the caches and the index).
    pub(crate) fn bytes(&self) -> usize {
        self.files.len() * 120
            + self.read.len() * 100
            + self.names.len() * 120
            + self.kernel_names.len() * 80
            + self.perf_maps.values().map(|m| m.len() * 64).sum::<usize>()
    }

    /// Indexes every file process `pid` ("self" for wattprof) maps.
    fn scan_maps(&mut self, pid: &str) {
        let dir = self.proc_root.join(pid);
        let Ok(maps) = std::fs::read_to_string(dir.join("maps")) else {
            return;
        };
        let mut paths: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.starts_with('/'))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        for p in paths {
            let inside = dir.join("root").join(&p[1..]);
            if !self.index(&inside, Path::new(p)) {
                self.index(Path::new(p), Path::new(p));
            }
        }
    }

    /// The frames of one sample, outermost first: the user stack, then the
    /// kernel stack. Frames of files and of the kernel come as keys (see
    /// [`Symbols::resolve`]): naming them can wait until the profiled
    /// program is done, so the work does not compete with it. Frames given
    /// as bare addresses are named now, while their process lives.
    pub(crate) fn frames(&mut self, tgid: u32, user: &[UserFrame], kernel: &[u64]) -> Vec<String> {
        let mut out: Vec<String> = Vec::with_capacity(user.len() + kernel.len());
        for (i, f) in user.iter().enumerate().rev() {
            // Frames above the innermost are return addresses: look up the
            // call instruction before them.
            let back = u64::from(i > 0);
            match *f {
                UserFrame::File { build_id, offset } => {
                    if !self.files.contains_key(&build_id) && !self.scanned.contains(&tgid) {
                        // Find the file while the process still maps it.
                        if self.scanned.len() >= CACHE_LIMIT {
                            self.scanned.clear();
                        }
                        self.scanned.insert(tgid);
                        self.scan_maps(&tgid.to_string());
                    }
                    out.push(format!(
                        "{FILE_KEY}{}:{:x}",
                        hex(&build_id),
                        offset.saturating_sub(back)
                    ));
                }
                UserFrame::Addr(addr) => {
                    out.extend(self.addr_frame(tgid, addr.saturating_sub(back)))
                }
            }
        }
        for (i, addr) in kernel.iter().enumerate().rev() {
            let back = u64::from(i > 0);
            out.push(format!("{KERNEL_KEY}{:x}", addr.saturating_sub(back)));
        }
        out
    }

    /// The names of a frame [`Symbols::frames`] gave: a key is named (one
    /// name, or several where functions were inlined, outermost first;
    /// kernel names end in [`KERNEL_SUFFIX`]); a name is itself.
    pub(crate) fn resolve(&mut self, frame: &str) -> Vec<String> {
        if let Some(rest) = frame.strip_prefix(FILE_KEY) {
            let parsed = rest
                .split_once(':')
                .and_then(|(id, off)| Some((unhex(id)?, u64::from_str_radix(off, 16).ok()?)));
            if let Some((build_id, offset)) = parsed {
                return self.file_frame(build_id, offset);
            }
        } else if let Some(addr) = frame
            .strip_prefix(KERNEL_KEY)
            .and_then(|a| u64::from_str_radix(a, 16).ok())
        {
            return vec![format!("{}{KERNEL_SUFFIX}", self.kernel_frame(addr))];
        }
        vec![frame.to_string()]
    }

    /// Whether a frame is a key still to be named.
    pub(crate) fn is_key(frame: &str) -> bool {
        frame.starts_with(FILE_KEY) || frame.starts_with(KERNEL_KEY)
    }

    fn file_frame(&mut self, build_id: [u8; 20], offset: u64) -> Vec<String> {
        if let Some(n) = self.names.get(&(build_id, offset)) {
            return n.clone();
        }
        let names = match self.files.get(&build_id) {
            // Not cached: the file may be found later.
            None => return vec![format!("[unknown] (build id {})", hex(&build_id[..8]))],
            Some(path) => {
                let src = Source::Elf(Elf::new(path));
                let module = module_name(path);
                match self
                    .symbolizer
                    .symbolize_single(&src, Input::FileOffset(offset))
                {
                    Ok(Symbolized::Sym(sym)) => std::iter::once(sym.name.to_string())
                        .chain(sym.inlined.iter().map(|f| f.name.to_string()))
                        .collect(),
                    _ => vec![format!("[unknown] ({module})")],
                }
            }
        };
        if self.names.len() >= CACHE_LIMIT {
            self.names.clear();
        }
        self.names.insert((build_id, offset), names.clone());
        names
    }

    fn addr_frame(&mut self, tgid: u32, addr: u64) -> Vec<String> {
        let alive = self.proc_root.join(tgid.to_string()).join("maps");
        if std::fs::metadata(&alive).is_ok() {
            let src = Source::Process(Process::new(Pid::from(tgid)));
            if let Ok(Symbolized::Sym(sym)) =
                self.symbolizer.symbolize_single(&src, Input::AbsAddr(addr))
            {
                return std::iter::once(sym.name.to_string())
                    .chain(sym.inlined.iter().map(|f| f.name.to_string()))
                    .collect();
            }
        }
        if let Some(name) = self.perf_map_name(tgid, addr) {
            return vec![name];
        }
        vec![format!("[unknown] ({})", self.module_of(tgid, addr))]
    }

    /// The name of `addr` in the perf map of `tgid` (JIT code), read from
    /// the file, which outlives the process.
    fn perf_map_name(&mut self, tgid: u32, addr: u64) -> Option<String> {
        let entries = match self.perf_maps.get(&tgid) {
            Some(e) => e,
            None => {
                let path = self.tmp.join(format!("perf-{tgid}.map"));
                // A map left by an earlier process with this pid is not
                // this one's.
                let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
                if modified < self.started {
                    return None;
                }
                let text = std::fs::read_to_string(&path).ok()?;
                if self.perf_maps.len() >= 1024 {
                    self.perf_maps.clear();
                }
                self.perf_maps
                    .entry(tgid)
                    .or_insert_with(|| parse_perf_map(&text))
            }
        };
        entries
            .iter()
            .rev()
            .find(|(start, size, _)| addr >= *start && addr - start < *size)
            .map(|(_, _, name)| name.clone())
    }

    /// The mapping `addr` falls in, while the process lives.
    fn module_of(&self, tgid: u32, addr: u64) -> String {
        let maps = std::fs::read_to_string(self.proc_root.join(tgid.to_string()).join("maps"))
            .unwrap_or_default();
        for line in maps.lines() {
            let mut cols = line.split_whitespace();
            let Some((lo, hi)) = cols.next().and_then(|r| r.split_once('-')) else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
            else {
                continue;
            };
            if (lo..hi).contains(&addr) {
                return match cols.nth(4) {
                    Some(p) if p.starts_with('/') => module_name(Path::new(p)),
                    Some(p) => p.to_string(),
                    None => "[anon]".to_string(),
                };
            }
        }
        "[unknown]".to_string()
    }

    fn kernel_frame(&mut self, addr: u64) -> String {
        if let Some(n) = self.kernel_names.get(&addr) {
            return n.clone();
        }
        let src = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Some(self.proc_root.join("kallsyms")),
            vmlinux: MaybeDefault::None,
            ..Kernel::default()
        });
        let name = match self.symbolizer.symbolize_single(&src, Input::AbsAddr(addr)) {
            Ok(Symbolized::Sym(sym)) => sym.name.to_string(),
            _ => "[unknown] ([kernel])".to_string(),
        };
        if self.kernel_names.len() >= CACHE_LIMIT {
            self.kernel_names.clear();
        }
        self.kernel_names.insert(addr, name.clone());
        name
    }
}

fn new_symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_inlined_fns(true)
        .enable_code_info(false)
        .build()
}

/// Most files held open for their build ids.
const HELD_FILES: usize = 256;

fn pad(id: &[u8]) -> [u8; 20] {
    let mut out = [0u8; 20];
    let n = id.len().min(20);
    out[..n].copy_from_slice(&id[..n]);
    out
}

fn unhex(text: &str) -> Option<[u8; 20]> {
    let mut out = [0u8; 20];
    if text.len() != 40 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn module_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// A perf map (`START SIZE NAME` per line, hexadecimal, `0x` optional).
pub(crate) fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let hexnum = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let start = hexnum(parts.next()?)?;
            let size = hexnum(parts.next()?)?;
            let name = parts.next()?.trim();
            (!name.is_empty()).then(|| (start, size, name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_maps_parse_with_or_without_0x_and_names_with_spaces() {
        let m = parse_perf_map("7f00 10 py::work:/tmp/x.py\n0x7f10 0x20 [interp] a b\nbad line\n");
        assert_eq!(
            m,
            vec![
                (0x7f00, 0x10, "py::work:/tmp/x.py".to_string()),
                (0x7f10, 0x20, "[interp] a b".to_string())
            ]
        );
    }

    #[test]
    fn a_perf_map_older_than_the_profile_is_not_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        let map = dir.path().join("perf-999998.map");
        std::fs::write(&map, "1000 100 stale_fn\n").expect("write");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&map)
            .and_then(|f| f.set_modified(old))
            .expect("mtime");
        let mut s = Symbols::new(dir.path().join("proc"), dir.path());
        let keys = s.frames(999_998, &[UserFrame::Addr(0x1010)], &[]);
        assert_eq!(keys, vec!["[unknown] ([unknown])".to_string()]);
    }

    #[test]
    fn an_exited_process_is_named_from_its_perf_map_and_the_rest_is_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("perf-999999.map"), "1000 100 jitted_fn\n").expect("write");
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(&proc_root).expect("mkdir");
        let mut s = Symbols::new(&proc_root, dir.path());
        let keys = s.frames(
            999_999,
            &[
                UserFrame::Addr(0x1010),
                UserFrame::Addr(0x9000),
                UserFrame::File {
                    build_id: [9; 20],
                    offset: 10,
                },
            ],
            &[0xffff_ffff_8100_0010],
        );
        let frames: Vec<String> = keys.iter().flat_map(|k| s.resolve(k)).collect();
        assert_eq!(
            frames,
            vec![
                "[unknown] (build id 0909090909090909)".to_string(),
                "[unknown] ([unknown])".to_string(),
                "jitted_fn".to_string(),
                "[unknown] ([kernel])_[k]".to_string(),
            ]
        );
        // The file frame was a key until resolved, the address frames names.
        assert!(Symbols::is_key(&keys[0]) && !Symbols::is_key(&keys[2]));
    }

    /// A function whose file offset the test looks up by name.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn wattprof_symbols_probe() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn a_file_frame_is_named_through_the_build_id_of_an_executed_file() {
        assert_eq!(wattprof_symbols_probe(), 7);
        let exe = std::env::current_exe().expect("exe");
        let Ok(Some(id)) = blazesym::helper::read_elf_build_id(&exe) else {
            skip_test!("the test binary has no build id");
            return;
        };
        let inspector = blazesym::inspect::Inspector::new();
        let src = blazesym::inspect::source::Source::Elf(blazesym::inspect::source::Elf::new(&exe));
        let found = inspector
            .lookup(&src, &["wattprof_symbols_probe"])
            .expect("lookup");
        let offset = found
            .first()
            .and_then(|v| v.first())
            .and_then(|s| s.file_offset)
            .expect("the probe's file offset");
        let mut s = Symbols::new("/nonexistent", "/nonexistent");
        // Unknown until the file is seen executed.
        assert!(s.file_frame(pad(&id), offset + 2)[0].starts_with("[unknown] (build id"));
        s.names.clear();
        s.saw_exec(1, &exe.display().to_string());
        // As a sample gives it: an inner frame (offset as is), through its key.
        let keys = s.frames(
            1,
            &[UserFrame::File {
                build_id: pad(&id),
                offset: offset + 2,
            }],
            &[],
        );
        assert_eq!(
            s.resolve(&keys[0]),
            vec!["wattprof_symbols_probe".to_string()]
        );

        // Executed inside a container (its /proc/PID/root), then gone
        // before the frame is named: on the host at the same path, and at a
        // path only the container had (the file is held open).
        for (exec_path, held) in [
            (exe.clone(), false),
            (PathBuf::from("/opt/wp-only-in/probe"), true),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let inside = dir
                .path()
                .join("7/root")
                .join(exec_path.strip_prefix("/").expect("absolute"));
            std::fs::create_dir_all(inside.parent().expect("parent")).expect("mkdir");
            std::os::unix::fs::symlink(&exe, &inside).expect("symlink");
            let mut s = Symbols::new(dir.path(), "/nonexistent");
            s.saw_exec(7, &exec_path.display().to_string());
            let keys = s.frames(
                7,
                &[UserFrame::File {
                    build_id: pad(&id),
                    offset: offset + 2,
                }],
                &[],
            );
            drop(dir);
            assert_eq!(
                s.resolve(&keys[0]),
                vec!["wattprof_symbols_probe".to_string()],
                "held: {held}"
            );
            assert_eq!(s.held.len(), usize::from(held));
        }
    }
}
