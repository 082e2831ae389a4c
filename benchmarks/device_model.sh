#!/usr/bin/env bash
# On the GPU machine: install the carried wheels and build the default model from the GGUF parts
# carried in .device/ (see device_prepare.sh). Parts may arrive in separate calls: each call copies
# what it carries to /tmp/radixlm-gguf; once all are there, the model is converted (once).
# Source it: `. benchmarks/device_model.sh` (exports PYTHONPATH and RADIXLM_CACHE).
mkdir -p /tmp/radixlm-gguf /tmp/radixlm_pkg
cp -f .device/smollm2.gguf.* /tmp/radixlm-gguf/ 2>/dev/null
ln -sfn "$PWD" /tmp/radixlm_pkg/radixlm
if ls .whl/*.whl >/dev/null 2>&1 && [[ ! -e /tmp/site/.done ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/radixlm_pkg:/tmp/site PYTHONUNBUFFERED=1 RADIXLM_CACHE=/tmp/radixlm-cache
PARTS=$(ls /tmp/radixlm-gguf/ | sed -n 's/^smollm2\.gguf\.\([0-9]*\)\.part-.*/\1/p' | head -1)
if [[ -n "$PARTS" && $(ls /tmp/radixlm-gguf/smollm2.gguf.$PARTS.part-* | wc -l) == "$PARTS" ]]; then
  cat /tmp/radixlm-gguf/smollm2.gguf.$PARTS.part-* > /tmp/radixlm-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -c "from radixlm.runtime.default_model import convert_gguf, cache_dir; import os
print(convert_gguf('/tmp/radixlm-gguf/SmolLM2-135M-Instruct.Q4_1.gguf', os.path.join(cache_dir(), 'SmolLM2-135M-Instruct')))" 2>&1 | tail -1
  export RADIXLM_MODEL=$RADIXLM_CACHE/SmolLM2-135M-Instruct
fi
