#!/usr/bin/env bash
# Runs `CI=true bash .ci/run` (the README's test command) on three clean clones of REPO's HEAD
# in a row, the first with two busy loops started from this shell, and writes each run's output
# (run-N.log) and its exit status and seconds (summary.txt) to OUT. The clones go to /tmp/ci,
# with the shared/ folder beside REPO linked beside them, as in CI.
#
#   bash benchmarks/results/cpu-ci-2core/ci_three.sh /tmp/ci-three [REPO]
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
REPO=$(cd "${2:-.}" && pwd)
SHARED=$(cd "$REPO/../shared" && pwd)
for i in 1 2 3; do
    rm -rf /tmp/ci && mkdir /tmp/ci && git clone -q "$REPO" /tmp/ci/main && ln -s "$SHARED" /tmp/ci/shared
    cd /tmp/ci/main
    echo "run $i commit $(git rev-parse --short HEAD) start $(date -u +%FT%TZ)" >> "$OUT/summary.txt"
    pids=""
    if [ "$i" = 1 ]; then
        ( while :; do :; done ) & pids="$pids $!"
        ( while :; do :; done ) & pids="$pids $!"
        echo "run $i busy loops:$pids" >> "$OUT/summary.txt"
    fi
    t0=$(date +%s)
    CI=true bash .ci/run > "$OUT/run-$i.log" 2>&1
    rc=$?
    t1=$(date +%s)
    [ -n "$pids" ] && kill $pids
    echo "run $i rc=$rc seconds=$((t1 - t0)) end $(date -u +%FT%TZ) tail: $(tail -1 "$OUT/run-$i.log")" >> "$OUT/summary.txt"
    cd /
done
