#!/usr/bin/env bash
# Clean-clone CI runs in a row: clone SRC's HEAD into /tmp/ciloop/main with shared/ linked
# beside it (as CI has it), run `CI=true bash .ci/run` there, N times; no run starts after
# DEADLINE (epoch seconds). Each run's output is OUT/run-I.log; OUT/summary.txt has each run's
# commit, exit status and seconds.
#
#   bash benchmarks/results/cpu-ci-tiers/ci_in_a_row.sh /path/to/tuner OUT N DEADLINE
set -u
src=$1; out=$2; n=$3; deadline=$4
mkdir -p "$out"
for i in $(seq 1 "$n"); do
  now=$(date +%s); [ "$now" -gt "$deadline" ] && break
  rm -rf /tmp/ciloop && mkdir -p /tmp/ciloop && git clone -q "$src" /tmp/ciloop/main && ln -s /work/shared /tmp/ciloop/shared
  commit=$(git -C /tmp/ciloop/main log --oneline -1)
  s=$(date +%s)
  (cd /tmp/ciloop/main && CI=true bash .ci/run > "$out/run-$i.log" 2>&1); rc=$?
  echo "run $i: $commit: rc $rc in $(( $(date +%s) - s )) s, started $(date -u -d @$s +%H:%M:%S)" >> "$out/summary.txt"
done
