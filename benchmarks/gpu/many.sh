#!/usr/bin/env bash
# Several studies of user_capacity.sh at once on a machine of several GPUs, one a GPU, from the
# repository root once vLLM is installed in /tmp/site (README.md here):
#
#   bash benchmarks/gpu/many.sh start FILE     start each study of FILE on its own GPU
#   OUT=... bash benchmarks/gpu/many.sh wait FILE SECONDS
#                                              follow them until all ended or SECONDS pass,
#                                              then pack each one's `wait` output and files
#                                              into $OUT/all.tar (NAME/ in it for each)
#   OUT=... bash benchmarks/gpu/many.sh serve FILE
#                                              once all ended: each one's `serve`, one after
#                                              the other, on ports 8765, 8766, ...
#
# FILE has one study a line: its NAME, then the variables user_capacity.sh reads
# (`code TRACE=AzureLLMInferenceTrace_code.csv SLOS="ttft_p95_s=1 tpot_p95_s=0.05" ...`;
# quotes as in bash); blank lines and lines from # on are skipped. The study of line i (from
# 0) runs with CUDA_VISIBLE_DEVICES=i in STUDY_ROOT=/root/NAME (ROOT=... replaces /root).
# The same variables can be set for all of them in the environment.
set -u
here=$(cd "$(dirname "$0")" && pwd)
file=${2:?FILE}
top=${ROOT:-/root}

# Each study's line as "INDEX NAME VARIABLES..." (comments and blank lines left out).
studies() {
  grep -v -E '^[[:space:]]*(#|$)' "$file" | awk '{ print NR - 1, $0 }'
}

# Run user_capacity.sh's $1 for the study of line "$2" with its variables and its GPU.
each() {
  local action=$1 index=$2 name=$3 vars=$4
  shift 4
  (eval "export $vars"; CUDA_VISIBLE_DEVICES=$index STUDY_ROOT=$top/$name \
    bash "$here/user_capacity.sh" "$action" "$@")
}

case ${1:-} in
  start)
    while read -r index name vars; do
      echo "== $name on GPU $index"
      each start "$index" "$name" "$vars"
    done < <(studies)
    ;;
  wait)
    seconds=${3:?seconds}
    end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ]; do
      left=0
      while read -r _ name _; do [ -e "$top/$name/DONE" ] || left=1; done < <(studies)
      [ "$left" = 0 ] && break
      sleep 5
    done
    out=${OUT:?OUT}
    while read -r index name vars; do
      mkdir -p "$out/$name"
      echo "== $name"
      OUT=$out/$name each wait "$index" "$name" "$vars" 0 | tee "$out/$name/wait.txt" | tail -n 25
    done < <(studies)
    # One file comes back, whatever the number of studies.
    (cd "$out" && tar cf all.tar --exclude=all.tar -- */ && rm -rf -- */)
    ;;
  serve)
    out=${OUT:?OUT}
    port=8765
    while read -r index name vars; do
      mkdir -p "$out/$name"
      echo "== $name"
      OUT=$out/$name SERVE_PORT=$port each serve "$index" "$name" "$vars"
      port=$(( port + 1 ))
    done < <(studies)
    (cd "$out" && tar cf serve.tar --exclude=serve.tar -- */ && rm -rf -- */)
    ;;
  *)
    sed -n 2,21p "$0"; exit 2 ;;
esac
