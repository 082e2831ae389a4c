#!/usr/bin/env bash
# H200: constrained vs free decoding with jump-forward off (the CUDA default) and on, same tree
# (.device/after, see h200_constrained_ab.sh), alternating REPS times.
# Usage (from the repo root, on the device): bash benchmarks/h200_jump_forward.sh OUT [REPS] [PASSES]
set -uo pipefail
OUT=$1; REPS=${2:-2}; PASSES=${3:-2}
mkdir -p "$OUT"
for rep in $(seq 1 "$REPS"); do
  for jf in no-enable-jump-forward enable-jump-forward; do
    (cd .device/after && . benchmarks/device_model.sh >/dev/null 2>&1 && export PYTHONPATH=$PWD:$PYTHONPATH &&
     timeout 170 python3 benchmarks/bench_constrained.py --write-config llama-3.1-8b /tmp/llama-3.1-8b-config \
       --load-format dummy --tokenizer-path .device/deepseek-llm --device cuda --num-prompts 128 \
       --max-new-tokens 256 --passes "$PASSES" --server-arg=--$jf > "$OUT/$jf.$rep.log" 2>&1)
    echo "== $jf rep $rep"; grep "^| [0-9]" "$OUT/$jf.$rep.log" || tail -5 "$OUT/$jf.$rep.log"
  done
done
