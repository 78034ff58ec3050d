#!/usr/bin/env bash
# The README's Quick start in N fresh clones of this repository, one after the other, as written:
#
#   bash benchmarks/quickstart_clones.sh [N] [DIR]     (default 5 clones under /tmp/qs)
#
# Each clone (under a fresh temporary folder, or WORK) runs `bash .ci/setup`, then `tuner run
# --trace traces/azure-conv-peak.csv --study demo`; DIR/K holds its setup.log, run.log,
# config.yaml and demo.db, and this prints each run's exit status, seconds and last lines.
# .ci/setup prints nothing when it succeeds (pip -q with pip's warnings filtered, the venv and
# the import check silent), so setup.log is its trace (bash -x), each line stamped with the
# time, then the versions it installed. DIR is then a result folder (benchmarks/harness.py):
# README.md (date, commit, this command, the machine, what was printed) and files.md (each
# log's last lines, K/setup.tail.txt and K/run.tail.txt, and each K/config.yaml, one section
# each); DIR=benchmarks/results/NAME makes it one of this repository's results (the .log files
# stay out of git, K/demo.db is each clone's study).
set -u
n=${1:-5}
out=$(mkdir -p "${2:-/tmp/qs}" && cd "${2:-/tmp/qs}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
# Each line read, after the UTC time it was read at.
stamp() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$(date -u +%T)" "$line"; done
}
clones() {
for k in $(seq 1 "$n"); do
  dir=$out/$k
  rm -rf "$dir"; mkdir -p "$dir"
  rm -rf "$work/$k"; git clone -q "$src" "$work/$k/main"
  cd "$work/$k/main" || exit 1
  git rev-parse --short HEAD > "$work/commit.txt"  # the commit the clones ran, for the header
  echo "== clone $k at $(git rev-parse --short HEAD) $(date -u +%FT%TZ)"
  began=$(date +%s)
  bash -x .ci/setup 2>&1 | stamp > "$dir/setup.log"
  status=${PIPESTATUS[0]}
  .venv/bin/python -m pip list --format=freeze 2>/dev/null \
    | grep -i -E '^(torch|vllm[a-z_-]*|optuna|vllm-serve-tuner)==' >> "$dir/setup.log"
  echo "setup exit $status in $(( $(date +%s) - began )) s" | tee -a "$dir/setup.log"
  began=$(date +%s)
  ( . .venv/bin/activate && tuner run --trace traces/azure-conv-peak.csv --study demo ) > "$dir/run.log" 2>&1
  echo "run exit $? in $(( $(date +%s) - began )) s"
  tail -n 25 "$dir/run.log"
  cp configs/demo.yaml "$dir/config.yaml" 2>/dev/null
  cp studies/demo.db "$dir/demo.db" 2>/dev/null
done
echo "== all done $(date -u +%FT%TZ)"
}
clones | tee "$work/summary.txt"
cd "$src" && python3 benchmarks/harness.py "$out" --summary "$work/summary.txt" --commit "$(cat "$work/commit.txt")" \
  --title "The README's Quick start in $n fresh clones in a row" \
  --command "bash benchmarks/quickstart_clones.sh $n ${2:-/tmp/qs}" --tail "$out"/*/setup.log "$out"/*/run.log \
  --file "$out"/*/config.yaml
