#!/usr/bin/env bash
# The README's Quick start on N fresh clones in a row, each with its own `bash .ci/setup`, then
# the YAML it wrote served from another folder with the command `tuner run` printed for it
# ("(serve: COMMAND)") and asked for one completion. Each run's files go to OUT/run-I/; OUT/summary.txt has one line a run: commit,
# setup and Quick start exit status and seconds, the outcome line, whether the YAML served.
# No run starts after DEADLINE (epoch seconds).
#
#   bash benchmarks/results/cpu-quickstart-confirmed/in_a_row.sh REPO OUT N DEADLINE
set -u
src=$1; out=$(mkdir -p "$2" && cd "$2" && pwd); n=$3; deadline=$4
for i in $(seq 1 "$n"); do
  [ "$(date +%s)" -gt "$deadline" ] && break
  dir=$out/run-$i && mkdir -p "$dir"
  work=$(mktemp -d) && git clone -q "$src" "$work/main" && cd "$work/main" || exit 1
  commit=$(git log --oneline -1 | cut -c1-7)
  began=$(date +%s)
  bash .ci/setup > "$dir/setup.log" 2>&1; setup_rc=$?
  setup_s=$(( $(date +%s) - began ))
  . .venv/bin/activate
  qs=$(date +%s)
  tuner run --trace traces/azure-conv-peak.csv --study demo > "$dir/run.log" 2>&1; rc=$?
  qs_s=$(( $(date +%s) - qs ))
  cp configs/demo.yaml "$dir/" 2>/dev/null
  # Serve the written YAML as it is, from a folder that is not the clone.
  elsewhere=$(mktemp -d) && cp configs/demo.yaml "$elsewhere/" && cd "$elsewhere"
  port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  model=$(python -c 'import yaml; print(yaml.safe_load(open("demo.yaml"))["model"])')
  serve=$(grep -o '(serve: [^)]*)' "$dir/run.log" | tail -1 | sed -e 's/^(serve: //' -e 's/)$//' -e 's|configs/demo.yaml|demo.yaml|')
  echo "$serve" > "$dir/serve-command.txt"
  setsid $serve --port "$port" > "$dir/serve.log" 2>&1 < /dev/null &
  pid=$!
  served=no
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 2
  done
  if curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"model\": \"$model\", \"prompt\": [1, 2, 3], \"max_tokens\": 4, \"ignore_eos\": true}" \
      > "$dir/completion.json"; then
    tokens=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["completion_tokens"])' "$dir/completion.json")
    served="yes, $tokens tokens"
  fi
  kill -TERM -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  deactivate
  outcome=$(grep -E "defaults kept:|beats vLLM.s defaults|meet the SLOs|meets the SLOs" "$dir/run.log" | head -1 | cut -c1-160)
  echo "run $i: $commit: $outcome; setup rc $setup_rc in $setup_s s; quick start exit $rc in $qs_s s; served: $served; started $(date -u -d @"$began" +%H:%M:%S)" >> "$out/summary.txt"
  cd / && rm -rf "$work" "$elsewhere"
done
