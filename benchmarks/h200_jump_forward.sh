#!/usr/bin/env bash
# H200: constrained vs free decoding with jump-forward off and on, for each tree of TREES (git
# archives in .device/<tree>, see h200_constrained_ab.sh; default: after), alternating REPS times.
# Usage (from the repo root, on the device): bash benchmarks/h200_jump_forward.sh OUT [REPS] [PASSES] [TREES]
set -uo pipefail
OUT=$1; REPS=${2:-2}; PASSES=${3:-2}; TREES=${4:-after}
mkdir -p "$OUT"
for rep in $(seq 1 "$REPS"); do
  for t in $TREES; do
  for jf in no-enable-jump-forward enable-jump-forward; do
    (cd ".device/$t" && . benchmarks/device_model.sh >/dev/null 2>&1 && export PYTHONPATH=$PWD:$PYTHONPATH &&
     timeout 170 python3 benchmarks/bench_constrained.py --write-config llama-3.1-8b /tmp/llama-3.1-8b-config \
       --load-format dummy --tokenizer-path .device/deepseek-llm --device cuda --num-prompts 128 \
       --max-new-tokens 256 --passes "$PASSES" --server-arg=--$jf > "$OUT/$t.$jf.$rep.log" 2>&1)
    echo "== $t $jf rep $rep"; grep "^| [0-9]" "$OUT/$t.$jf.$rep.log" || tail -5 "$OUT/$t.$jf.$rep.log"
  done
  done
done
