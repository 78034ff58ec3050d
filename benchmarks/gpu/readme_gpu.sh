#!/usr/bin/env bash
# On the device, from the repository root, once vLLM is installed in /tmp/site (README.md here,
# "How this repository's runs were made"): the README's "Install" and "Tune your model" sections,
# command by command, with tuner from TUNER_SRC (default .gpu/snap).
#
#   OUT=... bash benchmarks/gpu/readme_gpu.sh
#
# What differs from the README, because the machine has no network: vLLM comes from the staged
# wheels instead of `pip install -e ".[gpu]"`, and `tuner` is `python3 -m tuner.cli`. The model
# is a local folder with saved weights (tuner.engine.dummy_model.write_model with weights, the
# cpu-demo shape: random values, 38 MB), the trace the story's (12 req/s, 10 to 200 tokens).
# (TRACE replaces it: a lighter one for a check of this script on vLLM's CPU build.)
# `tuner run` adds `--n-trials 2 --time-budget-s BUDGET_S` (default 300) so that the run fits
# the machine's time. Then the YAML it wrote is served with `vllm serve --config` from another
# folder and asked for one completion. Everything printed goes to $OUT/readme.log; the study
# database, the spec, the YAML and the trial logs to $OUT. SERVE replaces `vllm serve` (on vLLM's
# CPU build, for a check of this script: `python3 -m vllm.entrypoints.openai.api_server`).
set -u
out=${OUT:?OUT}
src=${TUNER_SRC:-.gpu/snap}
root=${README_ROOT:-/root/readme}
repo=$PWD
export PYTHONPATH=$root/lib:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p "$root/lib" "$root/work" "$root/elsewhere"
cp -r "$src/tuner" "$root/lib/"
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --target "$root/lib" .whl/httpx_aiohttp-*.whl
tuner() { python3 -m tuner.cli "$@"; }
exec > >(tee "$out/readme.log") 2>&1
echo "== $(date -u +%FT%TZ) tuner $(cat "$src/COMMIT" 2>/dev/null || echo 'working tree')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
python3 -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "torch", m.version("torch"))'
cd "$root/work"
cp "${TRACE:-$repo/benchmarks/gpu/traces/story-12rps.csv}" prod.csv
python3 -c 'from tuner.engine import write_model as w; print(w("models/my-model", "cpu-demo"))'
began=$(date +%s)

echo "== tuner init"
tuner init --trace prod.csv --model "$root/work/models/my-model" \
    --slo ttft_p95_s=0.3 --slo tpot_p95_s=0.03 --slo e2e_p99_s=7
echo "exit $?"
cat studies/prod.yaml

echo "== tuner run"
tuner run --trace prod.csv --study prod --n-trials 2 --time-budget-s "${BUDGET_S:-300}"
echo "exit $?"
echo "== configs/prod.yaml"
cat configs/prod.yaml
cp studies/prod.yaml studies/prod.db configs/prod.yaml "$out/" 2>/dev/null
tar czf "$out/runs.tgz" runs 2>/dev/null

echo "== vllm serve --config configs/prod.yaml, from another folder"
cp configs/prod.yaml "$root/elsewhere/prod.yaml"
cd "$root/elsewhere"
${SERVE:-python3 -m vllm.entrypoints.cli.main serve} --config prod.yaml --port 8765 > serve.log 2>&1 &
server=$!
for _ in $(seq 1 120); do
  curl -sf localhost:8765/health > /dev/null && break
  kill -0 $server 2>/dev/null || break
  sleep 2
done
model=$(python3 -c 'import yaml; print(yaml.safe_load(open("prod.yaml"))["model"])')
curl -s localhost:8765/v1/completions -H 'content-type: application/json' \
  -d "{\"model\": \"$model\", \"prompt\": \"Hello\", \"max_tokens\": 4, \"ignore_eos\": true}"
echo
kill $server; wait $server 2>/dev/null
tail -5 serve.log
cp serve.log "$out/"
echo "== done in $(( $(date +%s) - began )) s"
