#!/bin/sh
# wattprof's bundled sample workload: one CPU burner (awk, about 1-2 s of
# CPU) and, at the same time, a burst of short-lived processes (expr, a few
# milliseconds each) of the kind /proc-polling profilers never see.
#
#   sudo ./target/release/wattprof run -- ./examples/sample-workload.sh
#
# WATTPROF_SAMPLE_PROCESSES sets the size of the burst (default 1000).
set -eu
n=${WATTPROF_SAMPLE_PROCESSES:-1000}

awk 'BEGIN { for (i = 0; i < 100000000; i++) s += i * i; print "burner done" }' &
burner=$!

i=0
while [ "$i" -lt "$n" ]; do
    expr "$i" + 1 >/dev/null
    i=$((i + 1))
done
echo "$n short-lived processes done"
wait "$burner"
