//! codecarbon's `emissions.csv`: one row per `run` or `monitor`, appended,
//! with codecarbon's column names, order and units (energy in kWh,
//! emissions in kg CO2eq, power in W, duration in s), so codecarbon's
//! dashboard and pandas scripts written for it read wattprof's figures.
//! Columns wattprof cannot know (location, cloud, Python, water) are left
//! empty.

use crate::carbon::J_PER_KWH;
use std::io::BufRead;
use std::path::Path;

use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{DomainReport, EnergyJ, HostReport, RunReport};
use crate::sources::Domain;

/// codecarbon 3.3's columns, in its order (`EmissionsData`).
pub(crate) const COLUMNS: [&str; 38] = [
    "timestamp",
    "project_name",
    "run_id",
    "experiment_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "gpu_power",
    "ram_power",
    "cpu_energy",
    "gpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "country_name",
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "os",
    "python_version",
    "codecarbon_version",
    "cpu_count",
    "cpu_model",
    "gpu_count",
    "gpu_model",
    "longitude",
    "latitude",
    "ram_total_size",
    "tracking_mode",
    "cpu_utilization_percent",
    "gpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "on_cloud",
    "pue",
    "wue",
];

/// What a codecarbon row is made of: a recording's figures, or those
/// `report` read back (`report::Summary::emissions`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Emissions<'a> {
    /// `run` or `monitor`.
    pub(crate) mode: &'a str,
    /// Wall-clock start (ns since the epoch).
    pub(crate) start_unix_ns: u64,
    /// Length (ns).
    pub(crate) wall_ns: u64,
    /// The command (`run`).
    pub(crate) argv: Option<&'a [String]>,
    /// The command tree's energy.
    pub(crate) tree: &'a EnergyJ,
    /// Per domain.
    pub(crate) domains: &'a [DomainReport],
    /// gCO2eq per kWh.
    pub(crate) g_per_kwh: f64,
    /// Possible CPUs, where known.
    pub(crate) cpus: Option<usize>,
    /// Busy CPU time (ns).
    pub(crate) busy_ns: u64,
    /// All CPUs' accounting windows (ns), where known.
    pub(crate) window_ns: Option<u64>,
    /// The machine.
    pub(crate) host: &'a HostReport,
}

impl<'a> From<&'a RunReport> for Emissions<'a> {
    fn from(r: &'a RunReport) -> Self {
        Self {
            mode: &r.mode,
            start_unix_ns: r.start_unix_ns,
            wall_ns: r.wall_ns,
            argv: r.command.as_ref().map(|c| c.argv.as_slice()),
            tree: &r.energy.groups.tree,
            domains: &r.energy.domains,
            g_per_kwh: r.energy.carbon_intensity_g_per_kwh,
            cpus: Some(r.machine.cpus),
            busy_ns: r.machine.busy_ns,
            window_ns: Some(r.machine.window_ns),
            host: &r.host,
        }
    }
}

/// A text cell whose value came from outside wattprof (a program's name,
/// a job's user or node), made safe for a spreadsheet: one that starts
/// with `=`, `+`, `-`, `@`, a tab or a carriage return would be taken as a
/// formula (CSV injection), so it gets a leading `'`, which spreadsheets
/// show as text and do not print. Numbers are written as they are.
pub(crate) fn text_cell(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    }
}

/// The row for a finished profile. `run` reports the command tree's
/// energy (what it cost), `monitor` the machine's measured energy
/// (`tracking_mode` says which, as codecarbon's `process`/`machine`).
/// `ram_total_gb` is the machine's memory, `run_id` a fresh UUID.
pub(crate) fn emissions_row(
    r: Emissions<'_>,
    ram_total_gb: Option<f64>,
    run_id: &str,
) -> Vec<String> {
    let duration_s = r.wall_ns as f64 / 1e9;
    let tree = r.mode == "run";
    let (cpu_j, ram_j, gpu_j) = if tree {
        let t = r.tree;
        (t.package_j, t.dram_j, t.gpu_j)
    } else {
        let measured = |d: Domain| -> f64 {
            r.domains
                .iter()
                .filter(|x| x.domain == d)
                .map(|x| x.measured_j)
                .sum()
        };
        (
            measured(Domain::Package),
            measured(Domain::Dram),
            measured(Domain::Gpu),
        )
    };
    let total_j = cpu_j + ram_j + gpu_j;
    let kg = crate::carbon::grams(total_j, r.g_per_kwh) / 1000.0;
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let busy_pct = match r.window_ns {
        Some(w) if w > 0 => (100.0 * r.busy_ns as f64 / w as f64).to_string(),
        _ => String::new(),
    };
    let gpus = &r.host.gpus;
    let gpu_model = match gpus.first() {
        Some(g) => format!("{} x {}", gpus.len(), g.name),
        None => String::new(),
    };
    let project = match r.argv {
        Some(argv) => argv
            .first()
            .map(|a| text_cell(a.rsplit('/').next().unwrap_or(a)))
            .unwrap_or_default(),
        None => "monitor".to_string(),
    };
    // An empty sum is -0.0, which would print as "-0".
    let num = |x: f64| (x + 0.0).to_string();
    let values: [String; 38] = [
        iso8601_utc(r.start_unix_ns.saturating_add(r.wall_ns)),
        project,
        run_id.to_string(),
        String::new(),
        num(duration_s),
        num(kg),
        num(per_s(kg)),
        num(per_s(cpu_j)),
        num(per_s(gpu_j)),
        num(per_s(ram_j)),
        num(cpu_j / J_PER_KWH),
        num(gpu_j / J_PER_KWH),
        num(ram_j / J_PER_KWH),
        num(total_j / J_PER_KWH),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        format!("Linux-{}", r.host.kernel),
        String::new(),
        String::new(),
        r.cpus.map(|c| c.to_string()).unwrap_or_default(),
        text_cell(&r.host.cpu_model),
        gpus.len().to_string(),
        gpu_model,
        String::new(),
        String::new(),
        ram_total_gb.map(|g| g.to_string()).unwrap_or_default(),
        if tree { "process" } else { "machine" }.to_string(),
        busy_pct,
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        "1.0".to_string(),
        String::new(),
    ];
    values.into()
}

/// Whether `--csv FILE` can take a row: new, empty, or already
/// codecarbon's emissions.csv (a file with other columns is refused rather
/// than mixed into), and writable. Creates nothing: `run` and `monitor`
/// call it before measuring, [`append`] again at the end.
pub(crate) fn check(path: &Path) -> Result<(), String> {
    match std::fs::File::open(path) {
        Ok(f) => {
            let mut first = String::new();
            let _ = std::io::BufReader::new(f).read_line(&mut first);
            if !first.is_empty() && first.trim_end() != COLUMNS.join(",") {
                return Err(format!(
                    "--csv {}: not an emissions.csv with codecarbon 3's columns; give a new \
                     file (rows are appended to it)",
                    path.display()
                ));
            }
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(|_| ())
                .map_err(|e| format!("cannot write --csv {}: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if dir.is_dir() {
                Ok(())
            } else {
                Err(format!(
                    "cannot write --csv {}: directory {} does not exist",
                    path.display(),
                    dir.display()
                ))
            }
        }
        Err(e) => Err(format!("cannot read --csv {}: {e}", path.display())),
    }
}

/// Appends `row` to the emissions file at `path` (see [`check`]), writing
/// the header first into an empty or new file.
pub(crate) fn append(path: &Path, row: &[String]) -> Result<(), String> {
    check(path)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot write --csv {}: {e}", path.display()))?;
    let new = file.metadata().map_or(true, |m| m.len() == 0);
    let mut w = csv::WriterBuilder::new().from_writer(file);
    let write = |w: &mut csv::Writer<std::fs::File>| -> csv::Result<()> {
        if new {
            w.write_record(COLUMNS)?;
        }
        w.write_record(row)?;
        w.flush()?;
        Ok(())
    };
    write(&mut w).map_err(|e| format!("cannot write --csv {}: {e}", path.display()))
}

/// The per-interval CSV's columns (`--csv-intervals`): one row per
/// interval and domain, in the units of codecarbon's file where it has the
/// figure (kWh, kg) and the recording's otherwise (J, W, s).
pub(crate) const INTERVAL_COLUMNS: [&str; 19] = [
    "timestamp",
    "t_s",
    "duration_s",
    "domain",
    "package",
    "estimated",
    "basis",
    "measured_j",
    "attributed_j",
    "idle_j",
    "unattributed_j",
    "power_w",
    "energy_kwh",
    "emissions_kg",
    "busy_cpu_s",
    "static_j",
    "attributed_static_j",
    "static_w",
    "static_source",
];

/// The rows of one interval (see [`INTERVAL_COLUMNS`]): `start_unix_ns` is
/// the profile's start, `g_per_kwh` its carbon intensity.
pub(crate) fn interval_rows(
    iv: &IntervalRecord,
    start_unix_ns: u64,
    g_per_kwh: f64,
) -> impl Iterator<Item = [String; 19]> + '_ {
    let stamp = iso8601_utc(start_unix_ns.saturating_add(iv.t_ns));
    iv.domains.iter().map(move |d| {
        let kwh = d.measured_j / J_PER_KWH;
        [
            stamp.clone(),
            (iv.t_ns as f64 / 1e9).to_string(),
            (iv.duration_ns as f64 / 1e9).to_string(),
            d.domain.name().to_string(),
            d.package.map(|p| p.to_string()).unwrap_or_default(),
            d.estimated.to_string(),
            d.basis.name().to_string(),
            d.measured_j.to_string(),
            d.attributed_j.to_string(),
            d.idle_j.to_string(),
            d.unattributed_j.to_string(),
            d.power.power_w.to_string(),
            kwh.to_string(),
            (kwh * g_per_kwh / 1000.0).to_string(),
            (iv.busy_ns as f64 / 1e9).to_string(),
            d.static_j.to_string(),
            d.attributed_static_j.to_string(),
            d.static_w.map(|w| w.to_string()).unwrap_or_default(),
            d.static_source
                .map(|s| s.name().to_string())
                .unwrap_or_default(),
        ]
    })
}

/// A per-interval CSV being written (`--csv-intervals`): rows are written
/// as each interval ends, an interval's rows in one `write`, so a killed
/// wattprof leaves every interval it finished. A failed write (a full
/// disk) stops it, with one warning on stderr, and cuts off what it wrote
/// in part; the rest of the profile goes on.
#[derive(Debug)]
pub(crate) struct IntervalCsv {
    file: std::fs::File,
    rows: Vec<u8>,
    /// Bytes of complete intervals written.
    len: u64,
    path: std::path::PathBuf,
    failed: Option<String>,
}

impl IntervalCsv {
    /// Creates (truncates) `path` and writes the header.
    pub(crate) fn create(path: &Path) -> Result<Self, String> {
        let err = |e: &dyn std::fmt::Display| {
            format!(
                "cannot write --csv-intervals {}: {e} (check that the directory exists and is \
                 writable)",
                path.display()
            )
        };
        let file = std::fs::File::create(path).map_err(|e| err(&e))?;
        let mut out = Self {
            file,
            rows: Vec::new(),
            len: 0,
            path: path.to_path_buf(),
            failed: None,
        };
        out.append(std::iter::once(INTERVAL_COLUMNS))
            .map_err(|e| err(&e))?;
        Ok(out)
    }

    /// Why the file stopped early, if it did.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Appends rows in one write; on failure, cuts the file back to its
    /// last complete interval.
    fn append<R, T>(&mut self, rows: impl Iterator<Item = R>) -> std::io::Result<()>
    where
        R: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        use std::io::Write;
        self.rows.clear();
        {
            let mut w = csv::WriterBuilder::new().from_writer(&mut self.rows);
            for row in rows {
                w.write_record(row).map_err(std::io::Error::other)?;
            }
            w.flush()?;
        }
        match self.file.write_all(&self.rows) {
            Ok(()) => {
                self.len += self.rows.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }

    /// Writes one interval's rows.
    pub(crate) fn write(&mut self, iv: &IntervalRecord, start_unix_ns: u64, g_per_kwh: f64) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.append(interval_rows(iv, start_unix_ns, g_per_kwh)) {
            let why = format!(
                "writing --csv-intervals {}: {e}; that file stops after its last complete interval",
                self.path.display()
            );
            eprintln!("wattprof: {why}; sampling goes on");
            self.failed = Some(why);
        }
    }
}

/// `--csv`: codecarbon's emissions row for the whole run, appended at the
/// end (the file was checked before the profile began).
pub(crate) struct EmissionsRow {
    path: std::path::PathBuf,
}

impl EmissionsRow {
    /// Appends to `path`.
    pub(crate) fn new(path: std::path::PathBuf) -> Self {
        Self { path }
    }
}

impl super::Sink for EmissionsRow {
    fn finish(&mut self, report: &RunReport, _: &super::Totals<'_>) -> Vec<Result<String, String>> {
        vec![append_emissions(&self.path, report)]
    }
}

/// Appends `report`'s codecarbon row to `path` (checked before the
/// profile began): what was done, in one line.
pub(crate) fn append_emissions(path: &Path, report: &RunReport) -> Result<String, String> {
    let row = emissions_row(report.into(), ram_total_gb(), &uuid4());
    append(path, &row).map(|()| format!("emissions row appended to {}", path.display()))
}

/// `--csv-intervals`: each interval's rows, timed from the header's
/// wall-clock start, with the header's carbon intensity.
pub(crate) struct IntervalCsvSink {
    csv: IntervalCsv,
    start_unix_ns: u64,
    g_per_kwh: f64,
}

impl IntervalCsvSink {
    /// Rows into `csv`.
    pub(crate) fn new(csv: IntervalCsv) -> Self {
        Self {
            csv,
            start_unix_ns: 0,
            g_per_kwh: 0.0,
        }
    }
}

impl super::Sink for IntervalCsvSink {
    fn header(&mut self, header: &HeaderRecord, _: &super::Totals<'_>) {
        self.start_unix_ns = header.start_unix_ns;
        self.g_per_kwh = header.carbon_intensity_g_per_kwh;
    }

    fn interval(&mut self, record: &IntervalRecord, _: &super::Totals<'_>) {
        debug_assert!(self.start_unix_ns > 0, "the header comes first");
        self.csv.write(record, self.start_unix_ns, self.g_per_kwh);
    }

    fn failure(&self) -> Option<&str> {
        self.csv.failure()
    }
}

/// A fresh random UUID (version 4), as codecarbon's `run_id`.
pub(crate) fn uuid4() -> String {
    let mut b = [0u8; 16];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 16 {
        // No entropy syscall: time and pid still make it unique enough for a
        // run id.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// `unix_ns` as ISO 8601 in UTC, microseconds (as Python's `isoformat`).
pub(crate) fn iso8601_utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let micros = (unix_ns % 1_000_000_000) / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The machine's memory (GB, as codecarbon's `ram_total_size`).
pub(crate) fn ram_total_gb() -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024.0 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_a_spreadsheet_would_run_as_a_formula_is_quoted() {
        for bad in ["=1+1", "+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"] {
            assert_eq!(text_cell(bad), format!("'{bad}"), "{bad}");
        }
        for good in ["python3", "node-1", "1=1", "", "a-b"] {
            assert_eq!(text_cell(good), good);
        }
    }

    #[test]
    fn timestamps_are_iso8601_utc() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000000+00:00");
        // 2024-02-29 12:34:56.789012 UTC (a leap day).
        assert_eq!(
            iso8601_utc(1_709_210_096_789_012_345),
            "2024-02-29T12:34:56.789012+00:00"
        );
    }

    #[test]
    fn run_ids_are_version_4_uuids() {
        let (a, b) = (uuid4(), uuid4());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn rows_are_appended_under_one_header_and_a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("emissions.csv");
        let row: Vec<String> = COLUMNS.iter().map(|c| format!("{c} value")).collect();
        append(&path, &row).expect("first");
        append(&path, &row).expect("second");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], COLUMNS.join(","));
        let other = dir.path().join("other.csv");
        std::fs::write(&other, "a,b\n1,2\n").expect("w");
        let e = append(&other, &row).expect_err("refused");
        assert!(e.contains("codecarbon"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&other).expect("r"),
            "a,b\n1,2\n",
            "left as it was"
        );
    }
}
