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
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Most processes whose maps are remembered as read, and most cached
/// frame names; past it the caches start again (names are only
/// recomputed, never lost).
const CACHE_LIMIT: usize = 200_000;

/// Names frames.
pub struct Symbols {
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
    /// Parsed perf maps of exited processes.
    perf_maps: HashMap<u32, Vec<(u64, u64, String)>>,
    /// Where `/proc` is (tests point it elsewhere).
    proc_root: PathBuf,
    /// Where perf maps are written.
    tmp: PathBuf,
}

impl Default for Symbols {
    fn default() -> Self {
        Self::new("/proc", "/tmp")
    }
}

impl Symbols {
    /// Symbols for processes under `proc_root`, with perf maps in `tmp`.
    pub fn new(proc_root: impl Into<PathBuf>, tmp: impl Into<PathBuf>) -> Self {
        let mut s = Self {
            symbolizer: Symbolizer::builder()
                .enable_inlined_fns(true)
                .enable_code_info(false)
                .build(),
            files: HashMap::new(),
            read: HashSet::new(),
            scanned: HashSet::new(),
            names: HashMap::new(),
            kernel_names: HashMap::new(),
            perf_maps: HashMap::new(),
            proc_root: proc_root.into(),
            tmp: tmp.into(),
        };
        // Our own libraries are the system's: index them up front.
        s.scan_maps("self");
        s
    }

    /// Files `tgid` executed: `path` as given to execve.
    pub fn saw_exec(&mut self, tgid: u32, path: &str) {
        let p = Path::new(path);
        if p.is_absolute() {
            // In the process's own mount namespace first (a container).
            let root = self.proc_root.join(tgid.to_string()).join("root");
            let inside = root.join(p.strip_prefix("/").unwrap_or(p));
            if !self.index_file(&inside) {
                self.index_file(p);
            }
        } else {
            let cwd = self.proc_root.join(tgid.to_string()).join("cwd");
            if !self.index_file(&cwd.join(p)) {
                self.index_file(p);
            }
        }
    }

    /// Records the build id of `path`; whether the file could be read.
    fn index_file(&mut self, path: &Path) -> bool {
        if self.read.contains(path) {
            return true;
        }
        match blazesym::helper::read_elf_build_id(path) {
            Ok(id) => {
                if self.read.len() >= CACHE_LIMIT {
                    self.read.clear();
                }
                self.read.insert(path.to_path_buf());
                if let Some(id) = id {
                    self.files
                        .entry(pad(&id))
                        .or_insert_with(|| path.to_path_buf());
                }
                true
            }
            Err(_) => false,
        }
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
            if !self.index_file(&inside) {
                self.index_file(Path::new(p));
            }
        }
    }

    /// The frames of one sample, outermost first: the user stack, then the
    /// kernel stack (each kernel frame ends in [`KERNEL_SUFFIX`]).
    pub fn frames(&mut self, tgid: u32, user: &[UserFrame], kernel: &[u64]) -> Vec<String> {
        let mut out: Vec<String> = Vec::with_capacity(user.len() + kernel.len());
        for (i, f) in user.iter().enumerate().rev() {
            // Frames above the innermost are return addresses: look up the
            // call instruction before them.
            let back = u64::from(i > 0);
            match *f {
                UserFrame::File { build_id, offset } => {
                    out.extend(self.file_frame(tgid, build_id, offset.saturating_sub(back)));
                }
                UserFrame::Addr(addr) => {
                    out.extend(self.addr_frame(tgid, addr.saturating_sub(back)))
                }
            }
        }
        for (i, addr) in kernel.iter().enumerate().rev() {
            let back = u64::from(i > 0);
            let name = self.kernel_frame(addr.saturating_sub(back));
            out.push(format!("{name}{KERNEL_SUFFIX}"));
        }
        out
    }

    fn file_frame(&mut self, tgid: u32, build_id: [u8; 20], offset: u64) -> Vec<String> {
        if let Some(n) = self.names.get(&(build_id, offset)) {
            return n.clone();
        }
        if !self.files.contains_key(&build_id) && !self.scanned.contains(&tgid) {
            if self.scanned.len() >= CACHE_LIMIT {
                self.scanned.clear();
            }
            self.scanned.insert(tgid);
            self.scan_maps(&tgid.to_string());
        }
        let names = match self.files.get(&build_id) {
            None => vec![format!("[unknown] (build id {})", hex(&build_id[..8]))],
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
                let text =
                    std::fs::read_to_string(self.tmp.join(format!("perf-{tgid}.map"))).ok()?;
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

fn pad(id: &[u8]) -> [u8; 20] {
    let mut out = [0u8; 20];
    let n = id.len().min(20);
    out[..n].copy_from_slice(&id[..n]);
    out
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
pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
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
    fn an_exited_process_is_named_from_its_perf_map_and_the_rest_is_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("perf-999999.map"), "1000 100 jitted_fn\n").expect("write");
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(&proc_root).expect("mkdir");
        let mut s = Symbols::new(&proc_root, dir.path());
        let frames = s.frames(
            999_999,
            &[
                UserFrame::Addr(0x1010),
                UserFrame::Addr(0x9000),
                UserFrame::File {
                    build_id: [9; 20],
                    offset: 10,
                },
            ],
            &[],
        );
        assert_eq!(
            frames,
            vec![
                "[unknown] (build id 0909090909090909)".to_string(),
                "[unknown] ([unknown])".to_string(),
                "jitted_fn".to_string(),
            ]
        );
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
            eprintln!("skipping: the test binary has no build id");
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
        assert!(s.file_frame(1, pad(&id), offset + 2)[0].starts_with("[unknown] (build id"));
        s.names.clear();
        s.saw_exec(1, &exe.display().to_string());
        assert_eq!(
            s.file_frame(1, pad(&id), offset + 2),
            vec!["wattprof_symbols_probe".to_string()]
        );
    }
}
