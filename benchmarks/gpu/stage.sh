#!/usr/bin/env bash
# Stage vLLM 0.26.0 and tuner's own needs for the device machine, from the repository root:
#
#   bash benchmarks/gpu/stage.sh            writes .gpu/part00.. (50 MiB each), .gpu/install.sh,
#                                           .gpu/snap (tuner at COMMIT, default HEAD) and .whl/
#
# ../shared/gpu/stage.sh packs the wheels as 60 MiB parts, but a call carries at most 64 MiB
# with the working tree (16 MiB on 2026-11-28), so the parts are cut again to what the tree
# leaves, less 8 MiB for what the study's call carries (the snapshot, .whl, a trace), at most
# 50 MiB: `bash .gpu/install.sh .gpu/partNN TOTAL`, one call a part (it prints TOTAL). The image
# lacks httpx-aiohttp (tuner's client) and optuna-dashboard (with bottle, which `pip install .`
# asks for: benchmarks/gpu/install_check.sh): their wheels go to .whl, carried with the call that
# starts a study (benchmarks/README.md). The shared conversation trace is copied to .gpu/conv.csv.
set -euo pipefail
commit=${COMMIT:-HEAD}
rm -f .gpu/part*
bash ../shared/gpu/stage.sh .gpu 2> >(grep -v '^WARNING: Location' >&2) >/dev/null
cat .gpu/part?? > .gpu/wheels.tar
rm -f .gpu/part??
# What travels with every call: tracked files and untracked ones git does not ignore, in MiB.
tree_mib=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null \
  | tail -1 | awk '{print int($1 / 1048576) + 1}')
part_mib=$(( 64 - tree_mib - 8 ))
[ "$part_mib" -gt 50 ] && part_mib=50
split -b "${part_mib}m" -d -a 2 .gpu/wheels.tar .gpu/part
rm .gpu/wheels.tar
rm -rf .gpu/snap && mkdir -p .gpu/snap
git archive "$commit" tuner | tar x -C .gpu/snap
git rev-parse --short "$commit" > .gpu/snap/COMMIT
cp .gpu/snap/COMMIT .gpu/snap/tuner/_commit.txt  # tuner.build.commit: the YAML header names it
mkdir -p .whl
cp ../shared/traces/AzureLLMInferenceTrace_conv.csv .gpu/conv.csv
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d .whl "httpx-aiohttp>=0.2,<0.3" \
  "optuna-dashboard>=0.17" "bottle>=0.13" 2>&1 \
  | grep -v '^WARNING: Location' || true
echo "$(ls .gpu/part?? | wc -l) parts of ${part_mib} MiB (the tree: ${tree_mib} MiB); tuner $(cat .gpu/snap/COMMIT) in .gpu/snap; $(ls .whl)"
