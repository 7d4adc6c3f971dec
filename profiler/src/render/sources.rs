//! `wattprof sources` in words.

use crate::sources::probe::SourcesReport;
use crate::sources::{Domain, nvml};

fn describe_domains(domains: &[(Domain, Option<u32>)]) -> String {
    let mut packages: Vec<u32> = domains.iter().filter_map(|(_, p)| *p).collect();
    packages.sort_unstable();
    packages.dedup();
    let mut parts: Vec<String> = packages
        .iter()
        .map(|p| {
            let names: Vec<&str> = domains
                .iter()
                .filter(|(_, q)| *q == Some(*p))
                .map(|(d, _)| d.name())
                .collect();
            format!("package {p}: {}", names.join(", "))
        })
        .collect();
    if domains.iter().any(|(d, _)| *d == Domain::Psys) {
        parts.push("platform: psys".into());
    }
    parts.join("; ")
}

/// Renders the text form.
pub(crate) fn render(report: &SourcesReport) -> String {
    let mut out = String::new();
    cpu_readers(&mut out, report);
    gpu_readers(&mut out, report);
    wattmeter(&mut out, report);
    cross_check(&mut out, report);
    verdict(&mut out, report);
    static_power(&mut out, report);
    out
}

/// Each CPU reader in order of preference: in use, or why not and the fix;
/// then the advice.
fn cpu_readers(out: &mut String, report: &SourcesReport) {
    out.push_str("CPU energy readers, in order of preference:\n");
    for r in &report.readers {
        out.push_str(&format!(
            "  {:<9} {:<9}",
            r.name,
            r.status.replace('_', " ")
        ));
        match (&r.info, &r.reason) {
            (Some(info), _) => {
                let res = info
                    .resolution_uj
                    .map(|u| format!("; resolution {u:.1} µJ"))
                    .unwrap_or_default();
                let domains = describe_domains(&info.domains);
                let sep = if domains.is_empty() { "" } else { ": " };
                out.push_str(&format!(" {}{sep}{domains}{res}\n", info.location));
                if let Some(why) = &r.reason {
                    out.push_str(&format!("  {:<19} why: {why}\n", ""));
                }
            }
            (None, Some(reason)) => {
                out.push_str(&format!(" {reason}\n"));
                if let Some(fix) = &r.fix {
                    out.push_str(&format!("  {:<19} fix: {fix}\n", ""));
                }
            }
            (None, None) => out.push('\n'),
        }
    }
    for a in &report.advice {
        out.push_str(&format!("  advice: {a}\n"));
    }
}

/// The GPUs NVML sees, or why none.
fn gpu_readers(out: &mut String, report: &SourcesReport) {
    out.push_str("GPU energy readers:\n");
    match (&report.gpu.reason, report.gpu.gpus.is_empty()) {
        (Some(reason), _) => {
            out.push_str(&format!("  {:<9} {:<9} {reason}\n", "nvml", "missing"));
            if let Some(fix) = &report.gpu.fix {
                out.push_str(&format!("  {:<19} fix: {fix}\n", ""));
            }
        }
        (None, false) => {
            for g in &report.gpu.gpus {
                let method = match g.method {
                    nvml::GpuEnergyMethod::EnergyCounter => "total-energy counter",
                    nvml::GpuEnergyMethod::PowerIntegration => {
                        "power samples integrated (no energy counter on this GPU: estimated)"
                    }
                };
                out.push_str(&format!(
                    "  nvml      in use    GPU {} {} ({}): {method}, {:.1} GiB{}\n",
                    g.index,
                    g.name,
                    g.uuid,
                    g.memory_total_bytes as f64 / f64::from(1u32 << 30),
                    if g.mig {
                        "; MIG enabled: instances are not attributed separately yet"
                    } else {
                        ""
                    }
                ));
            }
        }
        (None, true) => out.push_str("  nvml      missing\n"),
    }
}

/// The wattmeter log's health and energy (`--wattmeter-log`).
fn wattmeter(out: &mut String, report: &SourcesReport) {
    if let Some(w) = &report.wattmeter {
        let s = &w.stats;
        out.push_str(&format!(
            "Wattmeter {} (outlet {}): {} good frames, {} not ok, {} malformed lines, \
             {} out of order; mean {:.1} W, {:.3} J{}\n",
            w.log,
            w.outlet,
            s.frames_ok,
            s.frames_not_ok,
            s.malformed_lines,
            s.out_of_order,
            s.mean_power_w,
            w.energy_j,
            if s.gap_s > 0.0 {
                format!(", {:.2} s of gaps bridged", s.gap_s)
            } else {
                String::new()
            }
        ));
    }
}

/// Whether the working readers agree (`--check`).
fn cross_check(out: &mut String, report: &SourcesReport) {
    if let Some(d) = &report.disagreements {
        if report.checked.len() < 2 {
            out.push_str("Cross-check: fewer than two readers work here; nothing to compare.\n");
        } else if d.is_empty() {
            out.push_str(&format!(
                "Cross-check: {} agree within 5% on every domain they share.\n",
                report.checked.join(", ")
            ));
        }
        for x in d {
            out.push_str(&format!(
                "Cross-check: {} and {} disagree on {} energy{}: {:.3} J vs {:.3} J ({:.1}%)\n",
                x.a.0,
                x.b.0,
                x.domain.name(),
                x.package
                    .map(|p| format!(" of package {p}"))
                    .unwrap_or_default(),
                crate::units::joules(x.a.1),
                crate::units::joules(x.b.1),
                x.relative * 100.0
            ));
        }
    }
}

/// Which reader CPU energy comes from, measured or estimated.
fn verdict(out: &mut String, report: &SourcesReport) {
    match report.cpu_energy_reader {
        Some("estimate") => out.push_str(&format!(
            "CPU energy is ESTIMATED with a power model ({}; no energy counter here): every \
             figure from it is marked estimated.\n",
            report
                .readers
                .iter()
                .find(|r| r.name == "estimate")
                .and_then(|r| r.info.as_ref())
                .map_or("", |i| i.location.as_str())
        )),
        Some(name) => out.push_str(&format!("CPU energy is measured with {name}.\n")),
        None => out.push_str(
            "No CPU energy counter is readable on this machine: wattprof cannot measure CPU \
             energy here.\n",
        ),
    }
}

/// Where `run` and `monitor` take each domain's static power from.
fn static_power(out: &mut String, report: &SourcesReport) {
    let st = &report.static_power;
    out.push_str(&format!(
        "\nStatic power (what each domain draws with no task running; each program pays its \
         share of the CPUs' time){}:\n",
        st.host_model
            .as_ref()
            .map(|p| format!(", host power model {p}"))
            .unwrap_or_else(|| ", no host power model".into())
    ));
    for f in &st.figures {
        out.push_str(&format!(
            "  {:<16} {:>8.2} W static{} ({})\n",
            f.domain.label(f.package),
            f.static_w,
            f.per_cpu_w
                .map(|k| format!(" + {k:.3} W per busy CPU"))
                .unwrap_or_default(),
            match f.static_source {
                crate::sources::static_power::StaticSource::HostModel => "host model",
                crate::sources::static_power::StaticSource::Learned => {
                    "host model, learned by monitor"
                }
                _ => "the power model's idle term",
            }
        ));
    }
    if let Some(why) = &st.ignored {
        out.push_str(&format!("  warning: {why}\n"));
    }
    out.push_str(&format!("  otherwise: {}\n", st.otherwise));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::estimate;
    use crate::sources::msr;
    use crate::sources::probe::probe;
    use crate::topology::SysRoot;

    #[test]
    fn fixture_machine_prefers_powercap_and_explains_msr() {
        let sys = SysRoot::at(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/intel-2s/sys"),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let report = probe(
            &sys,
            &msr::MsrRoot::at(dir.path()),
            "vendor_id: GenuineIntel\ncpu family: 6\nmodel: 85\n",
            tdp(150.0),
        );
        assert_eq!(report.cpu_energy_reader, Some("powercap"));
        assert_eq!(report.readers[0].status, "in_use");
        // The fixture has no power PMU and no CPU topology.
        assert_eq!(report.readers[1].status, "missing");
        assert_eq!(report.readers[2].status, "missing");
        let text = render(&report);
        assert!(
            text.contains("package 1: package, core, uncore, dram"),
            "{text}"
        );
        assert!(text.contains("platform: psys"), "{text}");
        assert!(text.contains("measured with powercap"), "{text}");
        // A measured reader wins over the estimate, even with a TDP given.
        assert_eq!(report.readers[3].name, "estimate");
        assert_eq!(report.readers[3].status, "available");
    }

    fn tdp(w: f64) -> estimate::ModelRequest {
        estimate::ModelRequest {
            cpu_tdp_w: Some(w),
            ..Default::default()
        }
    }

    #[test]
    fn machine_without_rapl_says_why_and_which_model_stands_in() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpuinfo = "vendor_id: AuthenticAMD\ncpu family: 25\nmodel: 1\nmodel name: AMD EPYC\n\
                       flags: fpu hypervisor\n";
        let probe_with = |model| {
            probe(
                &SysRoot::at(dir.path()),
                &msr::MsrRoot::at(dir.path()),
                cpuinfo,
                model,
            )
        };
        // With no option: the vCPU model of the microarchitecture, and why.
        let report = probe_with(estimate::ModelRequest::default());
        assert_eq!(report.cpu_energy_reader, Some("estimate"));
        let text = render(&report);
        assert!(text.contains("modprobe intel_rapl_msr"), "{text}");
        assert!(text.contains("vcpu model: vCPUs x (0.45 W"), "{text}");
        assert!(text.contains("VM guest (hypervisor flag)"), "{text}");
        assert!(text.contains("AMD EPYC 3rd Gen"), "{text}");
        assert!(text.contains("Cloud Carbon Footprint"), "{text}");
        assert!(text.contains("CPU energy is ESTIMATED"), "{text}");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["readers"][0]["status"], "missing");
        assert!(json["readers"][0]["fix"].is_string());
        // --power-model none: nothing, and what would give an estimate.
        let report = probe_with(estimate::ModelRequest {
            choice: estimate::ModelChoice::None,
            ..Default::default()
        });
        assert_eq!(report.cpu_energy_reader, None);
        let text = render(&report);
        assert!(text.contains("cannot measure CPU energy here"), "{text}");
        assert!(text.contains("--power-model at auto"), "{text}");
        // --power-model tdp for a CPU not in the table: why, and the fix.
        let report = probe_with(estimate::ModelRequest {
            choice: estimate::ModelChoice::Tdp,
            ..Default::default()
        });
        assert_eq!(report.cpu_energy_reader, None);
        let text = render(&report);
        assert!(text.contains("AMD EPYC is not in the TDP table"), "{text}");
        assert!(text.contains("give --cpu-tdp WATTS"), "{text}");
        // With a TDP, the TDP model.
        let report = probe_with(tdp(120.0));
        assert_eq!(report.cpu_energy_reader, Some("estimate"));
        assert!(render(&report).contains("TDP 120 W x CPU utilization"));
    }
}
