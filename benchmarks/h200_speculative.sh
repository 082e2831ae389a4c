#!/usr/bin/env bash
# Issue 14 on the GPU machine: bench_speculative.py (real default model, bf16, batch 1) for several
# source trees in one call (same machine start), optionally with a cProfile of the scheduler steps.
# Trees are `git archive` copies carried in .device/<name>; the model's GGUF parts must already be in
# /tmp/radixlm-gguf or carried in .device/p*/ (see device_prepare.sh, device_model.sh).
# Usage: bash benchmarks/h200_speculative.sh "before after" [extra bench_speculative.py args]
# Modes (--modes): plain, ngram_local (own history only), ngram (+ the global store of other requests,
# speculative_ngram_capacity), e.g. --modes plain,ngram_local,ngram (the bench's default in trees that have it).
set -uo pipefail
TREES=${1:-before after}; shift || true
mkdir -p /tmp/radixlm-gguf && cp -f .device/p*/smollm2.gguf.* /tmp/radixlm-gguf/ 2>/dev/null
. benchmarks/device_model.sh
[[ -z "${RADIXLM_MODEL:-}" ]] && { echo "model parts incomplete: $(ls /tmp/radixlm-gguf)"; exit 0; }
nvidia-smi --query-gpu=name --format=csv,noheader
for t in $TREES; do
  mkdir -p /tmp/pkg_$t && ln -sfn "$PWD/.device/$t" /tmp/pkg_$t/radixlm
  echo "=== tree $t"
  PYTHONPATH=/tmp/pkg_$t:/tmp/site python3 .device/$t/benchmarks/bench_speculative.py --device cuda \
    --dtype bfloat16 --model-path "$RADIXLM_MODEL" "$@" 2>&1 | grep -v "^\s*$" | grep -v Warning | tail -60
done
