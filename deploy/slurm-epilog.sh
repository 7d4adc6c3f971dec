#!/bin/sh
# Slurm Epilog: stores this node's wattprof figure for the job in the
# job's accounting record, so that
#     sacct -j JOBID -X -o JobID,AdminComment%120
# shows it (docs/slurm.md). Needs slurmdbd: Slurm 22.05 refuses
# `scontrol update` on a finished job, but `sacctmgr modify job` edits a
# finished job's accounting record.
#
# slurm.conf, on every node:   Epilog=/etc/slurm/epilog.d/wattprof.sh
# and wattprof on every node:  wattprof monitor --jobs-dir /var/lib/wattprof/jobs
#
# wattprof writes DIR/slurm-<job>.json once the job's cgroups are gone,
# and Slurm removes them only after the epilog returns; so this script
# starts a waiter for the file and returns at once. It always exits 0:
# an epilog that fails drains the node. What goes wrong is written to
# $WATTPROF_JOBS_DIR/epilog.log.
#
# On a job over several nodes each node adds its own entry, separated by
# "; " (each entry: wattprof:total_j=...,package_j=...,nodes=NODE). Two
# nodes writing at once can lose one entry: each checks that its entry
# is there afterwards and tries again (5 times).

WATTPROF=${WATTPROF:-/usr/local/bin/wattprof}
JOBS_DIR=${WATTPROF_JOBS_DIR:-/var/lib/wattprof/jobs}
WAIT_S=${WATTPROF_EPILOG_WAIT_S:-300}
SACCT=${SACCT:-/usr/bin/sacct}
SACCTMGR=${SACCTMGR:-/usr/bin/sacctmgr}

job=${SLURM_JOB_ID:-}
case $job in
'' | *[!0-9_]*) exit 0 ;;
esac
file="$JOBS_DIR/slurm-$job.json"
log="$JOBS_DIR/epilog.log"

say() {
    printf '%s job %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$job" "$*" >>"$log" 2>/dev/null
}

store() {
    waited=0
    while [ ! -f "$file" ]; do
        if [ "$waited" -ge "$WAIT_S" ]; then
            say "no $file after ${WAIT_S} s (is wattprof monitor running with --jobs-dir $JOBS_DIR?)"
            return
        fi
        sleep 1
        waited=$((waited + 1))
    done
    if ! entry=$("$WATTPROF" report --comment "$file" 2>>"$log"); then
        say "wattprof report --comment $file failed"
        return
    fi
    tries=0
    while [ "$tries" -lt 5 ]; do
        old=$("$SACCT" -n -X -P -j "$job" -o AdminComment 2>>"$log" | head -n 1)
        case $old in
        *"$entry"*) return ;;
        '') new=$entry ;;
        *) new="$old; $entry" ;;
        esac
        "$SACCTMGR" -i modify job where jobid="$job" set AdminComment="$new" >/dev/null 2>>"$log" ||
            say "sacctmgr modify job failed"
        sleep "$((tries + 1))"
        tries=$((tries + 1))
    done
    case $("$SACCT" -n -X -P -j "$job" -o AdminComment 2>/dev/null) in
    *"$entry"*) ;;
    *) say "AdminComment does not hold this node's entry after 5 tries: $entry" ;;
    esac
}

# Detached: the epilog returns now, and Slurm goes on to remove the
# job's cgroups.
(store </dev/null >/dev/null 2>&1 &)
exit 0
