#!/usr/bin/env bash
# The README's Quick start in N fresh clones of this repository, one after the other, as written:
#
#   bash benchmarks/quickstart_clones.sh [N] [DIR]     (default 5 clones under /tmp/qs)
#
# Each clone runs `bash .ci/setup`, then `tuner run --trace traces/azure-conv-peak.csv --study
# demo`; DIR/K holds its setup.log, run.log, config.yaml and demo.db, and this prints each run's
# exit status, seconds and last lines.
set -u
n=${1:-5}
out=${2:-/tmp/qs}
src=$(cd "$(dirname "$0")/.." && pwd)
for k in $(seq 1 "$n"); do
  dir=$out/$k
  rm -rf "$dir"; mkdir -p "$dir"
  git clone -q "$src" "$dir/main"
  cd "$dir/main" || exit 1
  echo "== clone $k at $(git rev-parse --short HEAD) $(date -u +%FT%TZ)"
  began=$(date +%s)
  bash .ci/setup > "$dir/setup.log" 2>&1
  echo "setup exit $? in $(( $(date +%s) - began )) s"
  began=$(date +%s)
  ( . .venv/bin/activate && tuner run --trace traces/azure-conv-peak.csv --study demo ) > "$dir/run.log" 2>&1
  echo "run exit $? in $(( $(date +%s) - began )) s"
  tail -n 25 "$dir/run.log"
  cp configs/demo.yaml "$dir/config.yaml" 2>/dev/null
  cp studies/demo.db "$dir/demo.db" 2>/dev/null
done
echo "== all done $(date -u +%FT%TZ)"
