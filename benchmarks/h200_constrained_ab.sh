#!/usr/bin/env bash
# H200 A/B of constrained vs free decoding (issue 12): runs bench_constrained.py from each tree in
# .device/<tree> (git archives, see baseline_tree.py), alternating trees REPS times, so that machine
# drift hits every tree alike. Prints the table rows of every run.
# Usage (from the repo root, on the device): bash benchmarks/h200_constrained_ab.sh OUT "prev after" [REPS] [PASSES]
set -uo pipefail
OUT=$1; TREES=$2; REPS=${3:-2}; PASSES=${4:-3}
mkdir -p "$OUT"
for rep in $(seq 1 "$REPS"); do
  for t in $TREES; do
    (cd ".device/$t" && . benchmarks/device_model.sh >/dev/null 2>&1 && export PYTHONPATH=$PWD:$PYTHONPATH &&
     timeout 170 python3 benchmarks/bench_constrained.py --write-config llama-3.1-8b /tmp/llama-3.1-8b-config \
       --load-format dummy --tokenizer-path .device/deepseek-llm --device cuda --num-prompts 128 \
       --max-new-tokens 256 --passes "$PASSES" > "$OUT/$t.$rep.log" 2>&1)
    echo "== $t rep $rep"; grep "^| [0-9]" "$OUT/$t.$rep.log" || tail -5 "$OUT/$t.$rep.log"
  done
done
