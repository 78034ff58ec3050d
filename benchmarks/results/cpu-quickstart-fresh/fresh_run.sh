#!/usr/bin/env bash
# The README's Quick start on a fresh clone: clone, `bash .ci/setup`, `tuner run`; with BUSY=1,
# two busy loops on the cores beside it (started from the same shell). Timings in
# $OUT/summary.txt, tuner's output in $OUT/run.log.
#
#   bash benchmarks/results/cpu-quickstart-fresh/fresh_run.sh OUT [REPO]
set -u
out=${1:?output folder}; repo=${2:-$(git rev-parse --show-toplevel)}
rm -rf "$out" && mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d) && cd "$work"
git clone -q "$repo" main && cd main
{ git log --oneline -1; date -u +%FT%TZ; echo "BUSY=${BUSY:-0}"; } > "$out/summary.txt"
if [ "${BUSY:-0}" = 1 ]; then (while :; do :; done) & l1=$!; (while :; do :; done) & l2=$!; fi
began=$(date +%s)
bash .ci/setup > "$out/setup.log" 2>&1
echo "setup exit $? in $(( $(date +%s) - began )) s" >> "$out/summary.txt"
. .venv/bin/activate
qs=$(date +%s)
tuner run --trace traces/azure-conv-peak.csv --study demo > "$out/run.log" 2>&1
echo "quick start exit $? in $(( $(date +%s) - qs )) s" >> "$out/summary.txt"
echo "total $(( $(date +%s) - began )) s" >> "$out/summary.txt"
[ "${BUSY:-0}" = 1 ] && kill $l1 $l2
cp configs/demo.yaml studies/demo.db "$out/" 2>/dev/null
rm -rf "$work"
