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
# (each node's own directory: the files are named by job, not by node).
#
# wattprof writes DIR/slurm-<job>.json once the job's cgroups are gone,
# which can be after the epilog returns; so this script starts a waiter
# for a file written since the job started (sacct's Start; one older is
# an earlier run's: a requeued job) and returns at once. It always exits
# 0: an epilog that fails drains the node. What goes wrong is written to
# $WATTPROF_JOBS_DIR/epilog.log.
#
# This script owns the job's AdminComment: it keeps what is there and
# adds "; " and its entry (wattprof:total_j=...,package_j=...,nodes=NODE).
# On a job over several nodes each node adds its own; two nodes writing
# at once can lose one entry (sacctmgr sets the whole field), so each
# reads the field back and tries again, 8 times, at random delays. A
# quote in the field ends it for sacctmgr: such a field is not touched.

WATTPROF=${WATTPROF:-/usr/local/bin/wattprof}
JOBS_DIR=${WATTPROF_JOBS_DIR:-/var/lib/wattprof/jobs}
WAIT_S=${WATTPROF_EPILOG_WAIT_S:-300}
SACCT=${SACCT:-/usr/bin/sacct}
SACCTMGR=${SACCTMGR:-/usr/bin/sacctmgr}

case $WAIT_S in
'' | *[!0-9]*) WAIT_S=300 ;;
esac
job=${SLURM_JOB_ID:-}
case $job in
'' | *[!0-9_]*) exit 0 ;;
esac
file="$JOBS_DIR/slurm-$job.json"
log="$JOBS_DIR/epilog.log"

say() {
    printf '%s job %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$job" "$*" >>"$log" 2>/dev/null
}

# The field as sacct has it now, of this job's own row (an array's or a
# heterogeneous job's id also lists its other jobs); fails when sacct
# does.
admin_comment() {
    out=$("$SACCT" -n -X -P -j "$job" -o JobIDRaw,AdminComment 2>>"$log") || return 1
    printf '%s\n' "$out" | awk -F'|' -v j="$job" '$1 == j { print substr($0, length($1) + 2); exit }'
}

# When the job started (seconds since the epoch), from sacct; empty when
# sacct cannot say.
job_start() {
    start=$("$SACCT" -n -X -P -j "$job" -o JobIDRaw,Start 2>/dev/null |
        awk -F'|' -v j="$job" '$1 == j { print $2; exit }')
    [ -n "$start" ] && date -d "$start" +%s 2>/dev/null
}

# A pause of 1 to 4 s, different on each node.
pause() {
    sleep "$(($(od -An -N1 -tu1 /dev/urandom 2>/dev/null || echo 1) % 4 + 1))"
}

# Whether the file is this run's: written after the job started (an
# earlier run's, a requeued job's, is older), or, where sacct gives no
# start, after the epilog began.
this_run() {
    [ -f "$file" ] || return 1
    if [ -n "$start_s" ]; then
        [ "$(stat -c %Y "$file" 2>/dev/null || echo 0)" -ge "$start_s" ]
    else
        [ "$file" -nt "$marker" ]
    fi
}

store() {
    marker=$1
    start_s=$(job_start)
    waited=0
    until this_run; do
        if [ "$waited" -ge "$WAIT_S" ]; then
            say "no new $file after ${WAIT_S} s (is wattprof monitor running with --jobs-dir $JOBS_DIR, and has the job cgroups?)"
            rm -f "$marker"
            return
        fi
        sleep 1
        waited=$((waited + 1))
    done
    rm -f "$marker"
    if ! entry=$("$WATTPROF" report --comment "$file" 2>>"$log"); then
        say "wattprof report --comment $file failed"
        return
    fi
    tries=0
    while [ "$tries" -lt 8 ]; do
        tries=$((tries + 1))
        if ! old=$(admin_comment); then
            say "sacct failed (try $tries)"
            pause
            continue
        fi
        case $old in
        *"$entry"*) return ;;
        *\'* | *\"*)
            say "AdminComment holds a quote, left as it is; this node's entry: $entry"
            return
            ;;
        '') new=$entry ;;
        *) new="$old; $entry" ;;
        esac
        "$SACCTMGR" -i modify job where jobid="$job" set AdminComment="$new" >/dev/null 2>>"$log" ||
            say "sacctmgr modify job failed (try $tries)"
        pause
    done
    case $(admin_comment) in
    *"$entry"*) ;;
    *) say "AdminComment does not hold this node's entry after 8 tries: $entry" ;;
    esac
}

if [ "${1:-}" = --waiter ]; then
    # In its own session now: tell the epilog it may return.
    : >"$2.detached"
    store "$2"
    exit 0
fi
# The epilog's start: the file to wait for is newer.
marker=$(mktemp "$JOBS_DIR/.epilog-$job.XXXXXX" 2>/dev/null) || {
    logger -t wattprof-epilog "job $job: cannot create a file in $JOBS_DIR" 2>/dev/null
    exit 0
}
# Detached, in a session of its own: the epilog returns once the waiter
# is out of its process group (slurmd kills that group when the epilog
# exits: a waiter still in it was seen killed), at most 5 s later, and
# Slurm goes on to remove the job's cgroups.
setsid /bin/sh "$0" --waiter "$marker" </dev/null >/dev/null 2>&1 &
tries=0
while [ ! -e "$marker.detached" ] && [ "$tries" -lt 50 ]; do
    sleep 0.1
    tries=$((tries + 1))
done
if [ ! -e "$marker.detached" ]; then
    say "the waiter did not start within 5 s (is $0 readable by /bin/sh?)"
fi
rm -f "$marker.detached"
exit 0
