#!/usr/bin/env bash
# On the device, from the repository root, once vLLM is installed in /tmp/site
# (benchmarks/gpu/README.md, staged runs): `tuner run` of studies/story-api-servers.yaml with
# tuner's default launcher, tuner from TUNER_SRC (default .gpu/snap), while a background loop
# records the processes every 2 s; then what is left running. Writes to $OUT: env.txt, ps.log,
# tuner.log, study.db, trials.txt (each trial's capacity and arguments), after.txt, runs.tgz
# (tuner's trial folders: each engine's log). LIMIT_S (default 450) bounds `tuner run`.
set -u
out=${OUT:?OUT}
src=${TUNER_SRC:-.gpu/snap}
root=${ASC_ROOT:-/root/asc}
export PYTHONPATH=$root:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p "$root"
cp -r "$src/tuner" "$root/"
cp "$src/COMMIT" "$root/tuner-commit.txt" 2>/dev/null || echo "working tree" > "$root/tuner-commit.txt"
cp benchmarks/gpu/studies/story-api-servers.yaml benchmarks/gpu/traces/story-12rps.csv "$root/"
{
  date -u +%FT%TZ
  echo "tuner $(cat "$root/tuner-commit.txt")"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\))'
  python3 -c 'import sys, importlib.metadata as m; print(sys.version.split()[0])
for d in ("vllm", "torch", "optuna", "httpx-aiohttp"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "missing")'
  cd "$root" && python3 -c 'import tuner.engine.serve as s; print("tuner.engine.serve imports from", s.__file__)'
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
(while true; do echo "== $(date -u +%T)"; ps -eo pid,ppid,etimes,rss,args --sort=pid \
  | grep -E 'python|VLLM|vllm|tuner' | grep -v -E 'grep|ps -eo'; sleep 2; done) > "$out/ps.log" 2>&1 &
mon=$!
cd "$root"
timeout "${LIMIT_S:-450}" python3 -m tuner.cli run --trace story-12rps.csv \
  --spec story-api-servers.yaml --study story --n-trials 2 --storage sqlite:///study.db \
  > tuner.log 2>&1
echo "tuner run rc $?" | tee -a tuner.log
sleep 5
kill "$mon"
{
  echo "== after tuner run ended, $(date -u +%T)"
  ps -eo pid,ppid,etimes,args --sort=pid | grep -E 'python|VLLM|vllm|tuner' | grep -v -E 'grep|ps -eo'
  echo "== Prometheus multiprocess files under /tmp"
  find /tmp -maxdepth 2 -newer "$root/tuner-commit.txt" -name '*.db' -path '*prom*' 2>/dev/null
  find /tmp -maxdepth 1 -newer "$root/tuner-commit.txt" -type d 2>/dev/null
  echo "== GPU processes"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>/dev/null
} > "$out/after.txt" 2>&1
python3 - > "$out/trials.txt" 2>&1 <<'PY'
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
for name in optuna.get_all_study_names("sqlite:///study.db"):
    s = optuna.load_study(study_name=name, storage="sqlite:///study.db")
    for t in s.trials:
        print(name, t.number, t.state.name, t.values, t.params)
        for k, v in sorted(t.user_attrs.items()):
            print("   ", k, str(v)[:300])
PY
cp study.db tuner.log "$out/"
tar czf "$out/runs.tgz" runs configs 2>/dev/null
grep -h -o -i -E '\((APIServer|ApiServer)_[0-9]+ pid=[0-9]+' -r runs | sort | uniq -c
grep -c 'VLLM::APIServer' "$out/ps.log"
ls -l "$out"
