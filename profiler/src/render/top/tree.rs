//! `top`'s tree view: rows in tree order with their subtree sums, the
//! parents that did not run (read from `/proc`, so that each row is under
//! its real parent), and a process's lineage.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::rows::{Figures, Row, Seen};
use crate::process::{ProcFs, ProcMeta};

/// A parent chain is a few levels; the bound stops a loop in `/proc`.
const MAX_DEPTH: usize = 64;

/// A parent that had no row, as `/proc` showed it.
#[derive(Clone, Debug)]
struct Asleep {
    ppid: Option<u32>,
    comm: Rc<str>,
    /// When it started: what `top` kept of this pid is its only if it
    /// started then (the pid may be another's by now).
    start: Option<u64>,
    /// Its user, read once.
    user: Option<Rc<str>>,
}

/// The parents that had no row, read once each from `/proc`, `None`
/// where it was gone.
#[derive(Debug)]
pub(super) struct Ancestors {
    procfs: ProcFs,
    known: HashMap<u32, Option<Asleep>>,
}

impl Ancestors {
    pub(super) fn new(procfs: ProcFs) -> Self {
        Self {
            procfs,
            known: HashMap::new(),
        }
    }

    /// `pid` as `/proc` shows it, read the first time.
    fn of(&mut self, pid: u32) -> Option<&mut Asleep> {
        let procfs = &self.procfs;
        self.known
            .entry(pid)
            .or_insert_with(|| {
                procfs.comm_of(pid).map(|comm| Asleep {
                    ppid: procfs.parent_of(pid),
                    comm: comm.into(),
                    start: procfs.start_ticks(pid),
                    user: None,
                })
            })
            .as_mut()
    }

    /// Rows for the parents that have none (they did not run), up to pid
    /// 1, so that the tree shows each row under its real parent. What is
    /// known of the others is forgotten: a pid reused later is read again.
    pub(super) fn rows(&mut self, rows: &[Row], seen: &mut Seen) -> Vec<Row> {
        let have: HashSet<u32> = rows.iter().map(|r| r.pid).collect();
        let mut added = HashSet::new();
        let mut ghosts = Vec::new();
        for r in rows {
            let mut at = r.ppid;
            for _ in 0..MAX_DEPTH {
                let Some(pid) = at.filter(|p| *p != 0 && !have.contains(p)) else {
                    break;
                };
                if !added.insert(pid) {
                    break;
                }
                let Some(asleep) = self.of(pid) else {
                    break;
                };
                // What was kept of it, if it ran before: only if this pid
                // is still that process.
                let kept = seen.kept_of(pid, asleep.start);
                let energy_j = kept.map_or(0.0, |k| k.energy_j);
                let user = match (kept, &asleep.user) {
                    (Some(k), _) => k.user.clone(),
                    (None, Some(u)) => u.clone(),
                    (None, None) => seen.user_from_proc(pid),
                };
                asleep.user = Some(user.clone());
                let (ppid, comm) = (asleep.ppid, asleep.comm.clone());
                ghosts.push(Row {
                    pid,
                    id: 0,
                    ppid,
                    user,
                    comm,
                    fig: Figures {
                        energy_j,
                        ..r.fig.none_like()
                    },
                    asleep: true,
                    depth: 0,
                    subtree: false,
                });
                at = ppid;
            }
        }
        self.known.retain(|pid, _| added.contains(pid));
        ghosts
    }

    /// `pid` and its parents, `name (pid)` each, from the rows shown
    /// where they have one, else from `/proc`.
    pub(super) fn lineage(&mut self, pid: u32, rows: &[Row]) -> String {
        let mut chain: Vec<(u32, Option<String>)> = Vec::new();
        let mut at = Some(pid);
        while let Some(p) = at {
            if chain.len() == MAX_DEPTH || chain.iter().any(|(q, _)| *q == p) {
                break;
            }
            let (ppid, comm) = match rows.iter().find(|r| r.pid == p) {
                Some(r) => (r.ppid, Some(r.comm.to_string())),
                None => match self.of(p) {
                    Some(a) => (a.ppid, Some(a.comm.to_string())),
                    None => (None, None),
                },
            };
            chain.push((p, comm));
            at = ppid.filter(|pp| *pp != 0);
        }
        chain
            .iter()
            .map(|(p, comm)| match comm {
                Some(c) => format!("{c} ({p})"),
                None => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" <- ")
    }
}

/// Rows in tree order: each under its parent (its `ppid`, where that is
/// a row too) with its depth, and its figures the sums over it and every
/// row under it; siblings in `cmp` order of those sums, so the costliest
/// subtree comes first.
pub(super) fn tree_order(
    mut rows: Vec<Row>,
    cmp: impl Fn(&Row, &Row) -> std::cmp::Ordering,
) -> Vec<Row> {
    let index: HashMap<u32, usize> = rows.iter().enumerate().map(|(i, r)| (r.pid, i)).collect();
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match r.ppid.and_then(|p| index.get(&p)).filter(|p| **p != i) {
            Some(parent) => children.entry(*parent).or_default().push(i),
            None => roots.push(i),
        }
    }
    // Rows in a parent loop (no root above them) are roots too.
    let reached = preorder(&roots, &children, rows.len());
    let mut seen = vec![false; rows.len()];
    for (i, _) in &reached {
        seen[*i] = true;
    }
    for (i, seen) in seen.iter().enumerate() {
        if !seen {
            roots.push(i);
            children.values_mut().for_each(|l| l.retain(|c| *c != i));
        }
    }
    // Sums, children before parents (the reverse of a preorder).
    let order = preorder(&roots, &children, rows.len());
    for (i, _) in order.iter().rev() {
        if let Some(list) = children.get(i) {
            let mut sum = rows[*i].fig;
            for c in list {
                sum.add(&rows[*c].fig);
            }
            rows[*i].fig = sum;
        }
    }
    for r in &mut rows {
        r.subtree = true;
    }
    let by = |a: &usize, b: &usize| cmp(&rows[*a], &rows[*b]);
    roots.sort_unstable_by(by);
    for list in children.values_mut() {
        list.sort_unstable_by(by);
    }
    let order = preorder(&roots, &children, rows.len());
    let mut rows: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(i, depth)| {
            let mut r = rows[i].take()?;
            r.depth = depth;
            Some(r)
        })
        .collect()
}

/// Each row reached from `roots`, with its depth, parents first
/// (iteratively: trees can be deep).
fn preorder(
    roots: &[usize],
    children: &HashMap<usize, Vec<usize>>,
    n: usize,
) -> Vec<(usize, usize)> {
    let mut seen = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut stack: Vec<(usize, usize)> = roots.iter().rev().map(|r| (*r, 0)).collect();
    while let Some((i, depth)) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        order.push((i, depth));
        if let Some(list) = children.get(&i) {
            stack.extend(list.iter().rev().map(|c| (*c, depth + 1)));
        }
    }
    order
}
