#!/usr/bin/env bash
# A fresh clone, setup and the Quick start with two busy loops on the cores (same session).
set -u
rm -rf /tmp/qs/clone && mkdir -p /tmp/qs/clone && cd /tmp/qs/clone
git clone -q /work/main main && ln -s /work/shared shared && cd main
git log --oneline -1
(while :; do :; done) & l1=$!
(while :; do :; done) & l2=$!
began=$(date +%s)
bash .ci/setup > /tmp/qs/setup.log 2>&1; echo "setup exit $? in $(( $(date +%s) - began )) s"
. .venv/bin/activate
qs=$(date +%s)
tuner run --trace traces/azure-conv-peak.csv --study demo > /tmp/qs/run.log 2>&1; echo "quick start exit $? in $(( $(date +%s) - qs )) s"
echo "total $(( $(date +%s) - began )) s"
kill $l1 $l2
head -30 configs/demo.yaml
