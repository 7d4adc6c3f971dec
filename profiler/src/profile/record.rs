//! One interval's record: the rows of the processes reported one by one,
//! with their memory (`sums::memory` reads it at a rationed pace).

use super::{Profile, Scope};
use crate::attribution::{ConsumerId, DomainShare, EnergyBy};
use crate::hash::IntMap;
use crate::model::record::{
    DomainRow, GpuRow, GroupRow, GroupRows, InstanceRow, IntervalPower, IntervalRecord, LiveRow,
    ProcessRow,
};
use crate::process::{IntervalUsage, Role};
use crate::sources::DomainKey;
use crate::sources::registry::IntervalEnergy;
use crate::sums::memory::Row as MemoryRow;
use crate::tracker::CpuSample;
use crate::units::joules;

impl Profile {
    /// The rows of the processes reported one by one, with the memory of
    /// those that ran (one that did not run cannot have changed its own
    /// memory).
    pub(super) fn process_rows(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        read: &IntervalEnergy,
        at_ns: u64,
        rows: &mut Vec<ProcessRow>,
    ) {
        let selected: Vec<usize> = self.selected(usage, energy);
        let gpu_bytes_of = |id: ConsumerId| -> u64 {
            read.gpus
                .iter()
                .flat_map(|g| &g.processes)
                .filter(|p| self.table.id_of(p.pid) == Some(id))
                .map(|p| p.memory_bytes)
                .sum()
        };
        let memory_rows: Vec<MemoryRow> = selected
            .iter()
            .map(|i| {
                let u = &usage[*i];
                MemoryRow {
                    id: u.id,
                    pid: u.pid,
                    exited: self.table.by_id(u.id).is_none_or(|p| p.exit_ns.is_some()),
                    gpu_bytes: if read.gpus.is_empty() {
                        0
                    } else {
                        gpu_bytes_of(u.id)
                    },
                }
            })
            .collect();
        // `run` reads every process of its tree; `monitor`, whose top rows
        // change from interval to interval, is rationed.
        let rationed = matches!(self.cfg.scope, Scope::Machine { .. });
        // `monitor` and `top` read the memory of the `--top` rows with the
        // most energy only (`top` has a row for every process that ran: a
        // page-table walk each would cost more than the rest of its work).
        let read_for = match &self.cfg.scope {
            Scope::Machine { memory_top, .. } => (*memory_top).min(memory_rows.len()),
            Scope::Tree => memory_rows.len(),
        };
        let memory = self
            .sums
            .memory
            .read(&memory_rows[..read_for], &self.procfs, rationed, at_ns)
            .into_iter()
            .chain(std::iter::repeat(None));
        // The last interval's names are written over, not freed and
        // allocated again: `top` has a row for every process that ran.
        let mut names: Vec<String> = rows.drain(..).map(|r| r.comm).collect();
        for ((i, mem), m) in selected.into_iter().zip(memory).zip(&memory_rows) {
            let u = &usage[i];
            let e = energy.get(&u.id).copied().unwrap_or_default();
            let process = self.table.by_id(u.id);
            let mut comm = names.pop().unwrap_or_default();
            comm.clear();
            match process {
                Some(p) => p.write_name(&mut comm),
                None => crate::process::unnamed(u.pid, &mut comm),
            }
            rows.push(ProcessRow {
                pid: u.pid,
                ppid: process.and_then(|p| p.ppid),
                comm,
                on_cpu_ns: u.on_cpu_ns.iter().sum(),
                package_j: joules(e.package_uj),
                core_j: joules(e.core_uj),
                dram_j: joules(e.dram_uj),
                gpu_j: joules(e.gpu_uj),
                static_j: joules(e.static_uj()),
                pss_bytes: mem.map(|m| m.pss_bytes),
                uss_bytes: mem.map(|m| m.uss_bytes),
                gpu_memory_bytes: m.gpu_bytes,
                live: LiveRow {
                    id: u.id,
                    static_j: [
                        joules(e.package_static_uj),
                        joules(e.dram_static_uj),
                        joules(e.gpu_static_uj),
                    ],
                },
            });
        }
    }

    /// The interval's record, in the previous record's buffers.
    pub(super) fn build_record(&mut self, b: &Built<'_>) -> IntervalRecord {
        let Built {
            mig,
            sample,
            duration_ns,
            usage,
            energy,
            read,
            shares,
            covers_ns,
            groups: interval_groups,
        } = *b;
        let mut record = self.last.take().unwrap_or_default();
        let mut rows = record.processes.take().unwrap_or_default();
        self.process_rows(usage, energy, read, sample.at_ns, &mut rows);
        record.domains.clear();
        record.domains.extend(shares.iter().map(|s| {
            // A caught-up domain's energy covers the intervals it held.
            let covers = covers_ns
                .iter()
                .find(|(k, _)| *k == DomainKey::new(s.key.domain, s.key.package))
                .map(|(_, ns)| *ns);
            DomainRow::from_uj(
                &s.totals(),
                self.statics.figure(s.key.domain, s.key.package).copied(),
                covers.unwrap_or(duration_ns),
                |power_w| IntervalPower {
                    power_w,
                    covers_ns: covers,
                },
            )
        }));
        record.gpus.clear();
        let statics = &self.statics;
        record
            .gpus
            .extend(read.gpus.iter().zip(mig).map(|(g, mig)| {
                GpuRow {
                    index: g.index,
                    energy_j: joules(g.energy_uj),
                    power_w: g.power_w,
                    util_pct: g.util_pct,
                    memory_used_bytes: g.memory_used_bytes,
                    sm_basis: Some(g.sm_basis),
                    idle_w: statics.gpu_figures(g.index).0,
                    held_w: statics.gpu_figures(g.index).1,
                    processes: Some(g.processes.clone()),
                    instances: g
                        .instances
                        .iter()
                        .zip(mig)
                        .map(|(i, uj)| InstanceRow {
                            gpu_instance_id: i.gpu_instance_id,
                            compute_instance_id: i.compute_instance_id,
                            uuid: i.uuid.clone(),
                            slices: i.slices,
                            sms: i.sms,
                            sm_util_pct: i.sm_util_pct,
                            pids: i.pids.clone(),
                            energy_j: joules(*uj),
                        })
                        .collect(),
                }
            }));
        let group = |r: Role| GroupRow {
            on_cpu_ns: usage
                .iter()
                .filter(|u| u.role == r)
                .map(|u| u.on_cpu_ns.iter().sum::<u64>())
                .sum(),
            energy_j: joules(interval_groups[r as usize].total_uj()),
            package_j: joules(interval_groups[r as usize].package_uj),
            core_j: joules(interval_groups[r as usize].core_uj),
            dram_j: joules(interval_groups[r as usize].dram_uj),
            gpu_j: joules(interval_groups[r as usize].gpu_uj),
            static_j: joules(interval_groups[r as usize].static_uj()),
        };
        record.groups = GroupRows {
            tree: group(Role::Tree),
            profiler: group(Role::Profiler),
            other: group(Role::Other),
        };
        record.t_ns = sample.at_ns.saturating_sub(self.start_ns);
        record.duration_ns = duration_ns;
        record.busy_ns = sample.busy_ns();
        record.processes = Some(rows);
        record
    }

    /// Hands the record to every sink, and keeps the problems they raise.
    pub(super) fn write_record(&mut self, record: IntervalRecord) {
        self.each_sink(|s, totals| s.interval(&record, totals));
        let problems: Vec<String> = self
            .sinks
            .iter_mut()
            .filter_map(|s| s.take_problem())
            .collect();
        for p in problems {
            self.problem(p);
        }
        self.last = Some(record);
    }
}

/// What an interval's record is built from.
pub(super) struct Built<'a> {
    /// Per GPU, per MIG instance: the energy its processes were given.
    pub(crate) mig: &'a [Vec<u64>],
    pub(crate) sample: &'a CpuSample,
    pub(crate) duration_ns: u64,
    pub(crate) usage: &'a [IntervalUsage],
    pub(crate) energy: &'a IntMap<ConsumerId, EnergyBy>,
    pub(crate) read: &'a IntervalEnergy,
    pub(crate) shares: &'a [DomainShare],
    /// The span each caught-up domain's energy covers.
    pub(crate) covers_ns: &'a [(DomainKey, u64)],
    /// This interval's energy per group.
    pub(crate) groups: &'a [EnergyBy; 3],
}
