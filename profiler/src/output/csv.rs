//! codecarbon's `emissions.csv`: one row per `run` or `monitor`, appended,
//! with codecarbon's column names, order and units (energy in kWh,
//! emissions in kg CO2eq, power in W, duration in s), so codecarbon's
//! dashboard and pandas scripts written for it read wattprof's figures.
//! Columns wattprof cannot know (location, cloud, Python, water) are left
//! empty.

use std::io::BufRead;
use std::path::Path;

use super::RunReport;
use crate::sources::Domain;

/// codecarbon 3.3's columns, in its order (`EmissionsData`).
pub const COLUMNS: [&str; 38] = [
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

const J_PER_KWH: f64 = 3.6e6;

/// The row for a finished profile. `run` reports the command tree's
/// energy (what it cost), `monitor` the machine's measured energy
/// (`tracking_mode` says which, as codecarbon's `process`/`machine`).
/// `ram_total_gb` is the machine's memory, `run_id` a fresh UUID.
pub fn emissions_row(r: &RunReport, ram_total_gb: Option<f64>, run_id: &str) -> Vec<String> {
    let duration_s = r.wall_ns as f64 / 1e9;
    let tree = r.mode == "run";
    let (cpu_j, ram_j, gpu_j) = if tree {
        let t = &r.energy.groups.tree;
        (t.package_j, t.dram_j, t.gpu_j)
    } else {
        let measured = |d: Domain| -> f64 {
            r.energy
                .domains
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
    let kg = total_j / J_PER_KWH * r.energy.carbon_intensity_g_per_kwh / 1000.0;
    let per_s = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let busy_pct = if r.machine.window_ns > 0 {
        100.0 * r.machine.busy_ns as f64 / r.machine.window_ns as f64
    } else {
        0.0
    };
    let gpus = &r.host.gpus;
    let gpu_model = match gpus.first() {
        Some(g) => format!("{} x {}", gpus.len(), g.name),
        None => String::new(),
    };
    let project = match &r.command {
        Some(c) => c
            .argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
            .unwrap_or_default(),
        None => "monitor".to_string(),
    };
    let values: [String; 38] = [
        iso8601_utc(r.start_unix_ns.saturating_add(r.wall_ns)),
        project,
        run_id.to_string(),
        String::new(),
        duration_s.to_string(),
        kg.to_string(),
        per_s(kg).to_string(),
        per_s(cpu_j).to_string(),
        per_s(gpu_j).to_string(),
        per_s(ram_j).to_string(),
        (cpu_j / J_PER_KWH).to_string(),
        (gpu_j / J_PER_KWH).to_string(),
        (ram_j / J_PER_KWH).to_string(),
        (total_j / J_PER_KWH).to_string(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        format!("Linux-{}", r.host.kernel),
        String::new(),
        String::new(),
        r.machine.cpus.to_string(),
        r.host.cpu_model.clone(),
        gpus.len().to_string(),
        gpu_model,
        String::new(),
        String::new(),
        ram_total_gb.map(|g| g.to_string()).unwrap_or_default(),
        if tree { "process" } else { "machine" }.to_string(),
        busy_pct.to_string(),
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
pub fn check(path: &Path) -> Result<(), String> {
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
pub fn append(path: &Path, row: &[String]) -> Result<(), String> {
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

/// A fresh random UUID (version 4), as codecarbon's `run_id`.
pub fn uuid4() -> String {
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
pub fn iso8601_utc(unix_ns: u64) -> String {
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
pub fn ram_total_gb() -> Option<f64> {
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
