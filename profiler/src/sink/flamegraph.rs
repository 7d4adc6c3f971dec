//! Energy flame graphs: folded stacks weighted in microjoules, an SVG drawn
//! by inferno, and the stack section of the recording.

use super::recording::PendingOutput;
use super::{Sink, Totals};
use crate::attribution::EnergyBy;
use crate::attribution::stacks::StackLedger;
use crate::model::RunReport;
use crate::sources::Domain;

/// The domains a flame graph can weigh by; each one's name
/// ([`Domain::name`]) is the folded file's first frame and what
/// `--flamegraph-domain` takes.
pub(crate) const DOMAINS: [Domain; 5] = [
    Domain::Package,
    Domain::Core,
    Domain::Dram,
    Domain::Gpu,
    Domain::Wall,
];

/// The energy of the domain named `domain` in `e` (0 for an unknown
/// name).
pub(crate) fn domain_uj(domain: &str, e: &EnergyBy) -> u64 {
    DOMAINS
        .iter()
        .find(|d| d.name() == domain)
        .map_or(0, |d| e.of(*d))
}

/// A frame name as folded stacks can carry it: `;` separates frames and a
/// line ends the stack.
fn clean(frame: &str) -> std::borrow::Cow<'_, str> {
    if frame.contains([';', '\n', '\r']) {
        frame.replace(';', ":").replace(['\n', '\r'], " ").into()
    } else {
        frame.into()
    }
}

/// Folded lines (`[domain;]process;frame;...;frame µJ`), sorted, for one
/// domain (no prefix) or for every domain with energy (each line prefixed
/// by its domain). Entries with no energy in a domain are left out of it.
pub(crate) fn folded_lines(ledger: &StackLedger, domain: Option<&str>) -> Vec<String> {
    let mut lines = Vec::new();
    for d in DOMAINS {
        let name = d.name();
        if domain.is_some_and(|want| want != name) {
            continue;
        }
        for (process, stack, w) in ledger.entries() {
            let uj = w.energy.of(d);
            if uj == 0 {
                continue;
            }
            let mut line = String::new();
            if domain.is_none() {
                line.push_str(name);
                line.push(';');
            }
            line.push_str(&clean(process));
            for frame in ledger.table.frames(stack) {
                line.push(';');
                line.push_str(&clean(frame));
            }
            line.push(' ');
            line.push_str(&uj.to_string());
            lines.push(line);
        }
    }
    lines.sort_unstable();
    lines
}

/// The folded stacks of every domain (each line starts with its domain),
/// as a file's bytes; and how many lines.
pub(crate) fn folded(ledger: &StackLedger) -> (Vec<u8>, usize) {
    let lines = folded_lines(ledger, None);
    let mut out = Vec::new();
    for l in &lines {
        out.extend_from_slice(l.as_bytes());
        out.push(b'\n');
    }
    (out, lines.len())
}

/// The domain a flame graph shows when none is asked for: package where it
/// has energy, else the first domain that has any.
pub(crate) fn default_domain(ledger: &StackLedger) -> &'static str {
    let has = |d: Domain| ledger.entries().any(|(_, _, w)| w.energy.of(d) > 0);
    DOMAINS
        .into_iter()
        .find(|d| has(*d))
        .map_or("package", Domain::name)
}

/// The energy flame graph of `domain` (an interactive SVG: hover for a
/// frame's joules, click to zoom, Ctrl-F to search); `what` is shown in
/// the title (the command, or "monitor").
pub(crate) fn svg(ledger: &StackLedger, domain: &str, what: &str) -> std::io::Result<Vec<u8>> {
    let lines = folded_lines(ledger, Some(domain));
    let total_uj: u64 = ledger
        .entries()
        .map(|(_, _, w)| domain_uj(domain, &w.energy))
        .sum();
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!(
        "Energy flame graph: {domain}, {:.3} J ({what})",
        total_uj as f64 / 1e6
    );
    opt.subtitle = Some(
        "width = energy; hover for a function's energy, click to zoom, Ctrl-F to search (wattprof)"
            .into(),
    );
    // inferno shows count x factor rounded to a whole number: millijoules
    // where there is a joule or more, else microjoules.
    let (unit, factor) = if total_uj >= 1_000_000 {
        ("mJ", 1e-3)
    } else {
        ("µJ", 1.0)
    };
    opt.count_name = unit.into();
    opt.factor = factor;
    opt.name_type = "Function:".into();
    opt.deterministic = true;
    opt.hash = true;
    let mut out = Vec::new();
    if lines.is_empty() {
        // inferno refuses to draw nothing; say why in an SVG instead.
        let what = what
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        out.extend_from_slice(
            format!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="60"><text x="10" y="35" font-family="Verdana" font-size="14">No {domain} energy was attributed to any sampled stack ({what}).</text></svg>"#
            )
            .as_bytes(),
        );
    } else {
        inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut out)
            .map_err(std::io::Error::other)?;
    }
    Ok(out)
}

/// `--stacks-out` and `--flamegraph`: the folded stacks and the flame
/// graph, written at the end.
pub(crate) struct FlameGraph {
    folded: Option<PendingOutput>,
    svg: Option<PendingOutput>,
    /// The domain the graph weighs by (`None`: the default for the run).
    domain: Option<String>,
}

impl FlameGraph {
    /// Writes the files opened (each may be absent).
    pub(crate) fn new(
        folded: Option<PendingOutput>,
        svg: Option<PendingOutput>,
        domain: Option<String>,
    ) -> Self {
        Self {
            folded,
            svg,
            domain,
        }
    }
}

/// Puts `bytes` in place as `option`'s file: the line to print, or why not.
fn commit(
    out: PendingOutput,
    option: &str,
    bytes: std::io::Result<Vec<u8>>,
    what: &str,
) -> Result<String, String> {
    let dest = out.dest.clone();
    bytes
        .and_then(|b| out.commit_raw(&b))
        .map(|()| format!("{what} written to {}", dest.display()))
        .map_err(|e| format!("cannot write {option} {}: {e}", dest.display()))
}

impl Sink for FlameGraph {
    fn finish(&mut self, report: &RunReport, totals: &Totals<'_>) -> Vec<Result<String, String>> {
        let Some(ledger) = totals.stacks else {
            return Vec::new();
        };
        // What the graph's title names: the command, or `monitor`.
        let what = report.command.as_ref().map_or_else(
            || report.mode.clone(),
            |c| format!("`{}`", c.argv.join(" ")),
        );
        // Each output is tried whatever happened to the other.
        let mut done = Vec::new();
        if let Some(out) = self.folded.take() {
            let (bytes, lines) = folded(ledger);
            done.push(commit(
                out,
                "--stacks-out",
                Ok(bytes),
                &format!("folded stacks ({lines} lines, µJ)"),
            ));
        }
        if let Some(out) = self.svg.take() {
            let domain = self
                .domain
                .as_deref()
                .unwrap_or_else(|| default_domain(ledger));
            done.push(commit(
                out,
                "--flamegraph",
                svg(
                    ledger,
                    domain,
                    &if report
                        .energy
                        .domains
                        .iter()
                        .any(|d| d.domain.name() == domain && d.estimated)
                    {
                        format!("estimated, {what}")
                    } else {
                        what.clone()
                    },
                ),
                &format!("{domain} energy flame graph"),
            ));
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> StackLedger {
        let mut l = StackLedger::new(100);
        let a = l.table.intern(&["main".into(), "a;b".into()]);
        let k = l.table.intern(&["main".into(), "write_[k]".into()]);
        l.add(
            "burner",
            &[(a, 3), (k, 1)],
            &EnergyBy {
                package_uj: 4_000,
                dram_uj: 400,
                ..EnergyBy::default()
            },
        );
        l
    }

    #[test]
    fn folded_lines_carry_domain_process_frames_and_microjoules() {
        let l = ledger();
        assert_eq!(
            folded_lines(&l, None),
            vec![
                "dram;burner;main;a:b 300",
                "dram;burner;main;write_[k] 100",
                "package;burner;main;a:b 3000",
                "package;burner;main;write_[k] 1000",
            ]
        );
        assert_eq!(
            folded_lines(&l, Some("dram")),
            vec!["burner;main;a:b 300", "burner;main;write_[k] 100"]
        );
        assert_eq!(default_domain(&l), "package");
    }

    #[test]
    fn the_svg_is_titled_with_domain_and_energy_and_names_the_frames() {
        let text =
            String::from_utf8(svg(&ledger(), "package", "test").expect("svg")).expect("utf8");
        assert!(
            text.contains("Energy flame graph: package, 0.004 J"),
            "{text}"
        );
        assert!(text.contains("write"));
        assert!(text.contains("a:b"));
        let empty =
            String::from_utf8(svg(&ledger(), "gpu", "`a && b <c>`").expect("svg")).expect("utf8");
        assert!(empty.contains("No gpu energy"));
        assert!(empty.contains("`a &amp;&amp; b &lt;c&gt;`"), "{empty}");
        let (bytes, n) = folded(&ledger());
        assert_eq!(n, 4);
        assert!(bytes.ends_with(b"write_[k] 1000\n"));
    }
}
