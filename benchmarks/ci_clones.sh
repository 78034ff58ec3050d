#!/usr/bin/env bash
# Clean-clone CI runs in a row: clone SRC's HEAD into /tmp/ciloop/main with the shared/ folder
# beside SRC linked beside it (as CI has it), run `CI=true bash .ci/run` there, N times; no run
# starts after DEADLINE (epoch seconds). Each run's output is OUT/run-I.log; OUT/summary.txt has
# each run's commit, exit status and seconds.
#
#   bash benchmarks/ci_clones.sh /path/to/tuner OUT N DEADLINE
set -u
src=$(cd "$1" && pwd); out=$2; n=$3; deadline=$4
shared=$(cd "$src/../shared" && pwd)
mkdir -p "$out"
for i in $(seq 1 "$n"); do
  now=$(date +%s); [ "$now" -gt "$deadline" ] && break
  rm -rf /tmp/ciloop && mkdir -p /tmp/ciloop && git clone -q "$src" /tmp/ciloop/main && ln -s "$shared" /tmp/ciloop/shared
  commit=$(git -C /tmp/ciloop/main log --oneline -1)
  s=$(date +%s)
  (cd /tmp/ciloop/main && CI=true bash .ci/run > "$out/run-$i.log" 2>&1); rc=$?
  echo "run $i: $commit: rc $rc in $(( $(date +%s) - s )) s, started $(date -u -d @$s +%H:%M:%S)" >> "$out/summary.txt"
done
