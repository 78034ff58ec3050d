#!/usr/bin/env bash
# Device side, detached: the trial-cost benchmark (fresh interpreter vs zygote) on the H100, then
# more trials of the `story` study with the zygote and a time budget, all within SECONDS.
#
#   setsid nohup bash benchmarks/gpu/cheap_trials.sh SECONDS > /root/ct/job.log 2>&1 &
#   (then, in later calls: cat /root/ct/*.log; when /root/ct/DONE exists, tar /root/ct into $OUT)
#
# Needs the install of ../../../shared/gpu/README.md (vLLM 0.26.0 in /tmp/site).
set -u
seconds=${1:?seconds}
deadline=$(( $(date +%s) + seconds ))
ct=/root/ct
mkdir -p "$ct"
rm -rf "$ct/src" && mkdir -p "$ct/src" && cp -r tuner benchmarks traces "$ct/src/"
cd "$ct/src" || exit 1
export PYTHONPATH=/tmp/site:$ct/src VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$ct/env.txt" 2>&1
python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >> "$ct/env.txt" 2>&1

python3 benchmarks/trial_cost.py --trace benchmarks/gpu/traces/story-12rps.csv \
  --window-s 10 --time-scale 1 --shape qwen2.5-3b --repeats "${REPEATS:-2}" \
  --arg enforce-eager=false --arg gpu-memory-utilization=0.3 --arg max-num-seqs=16 \
  --json "$ct/trial_cost.json" > "$ct/trial_cost.log" 2>&1

cp tests/data/h100-story/study.db "$ct/story.db"
left=$(( deadline - $(date +%s) ))
if [ "$left" -gt 200 ]; then
  python3 -m tuner.cli run --trace benchmarks/gpu/traces/story-12rps.csv --study story \
    --spec benchmarks/gpu/studies/story.yaml --storage "sqlite:///$ct/story.db" \
    --configs "$ct/configs" --runs "$ct/runs" --n-trials 12 --time-budget-s "$left" \
    > "$ct/study.log" 2>&1
fi
touch "$ct/DONE"
