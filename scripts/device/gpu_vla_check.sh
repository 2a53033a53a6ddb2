#!/usr/bin/env bash
# GPU check of the VLA decoders: `robo-rl bench decode` on an OpenVLA-7B-shaped random-init model in
# bf16 (batched KV-cache decode vs per-env loop vs transformers generate()), B = 1, 8, 32, 64; then
# `robo-rl bench sample` at pi0 size in bf16 (B = 1, 8, 32, cached prefix vs not).
# Runs on the GPU machine from the repo root; transformers 5.24 travels as a wheel in .whl/
# (the machine's own transformers is older). Writes $OUT/decode_7b.json, $OUT/sample_pi0.json and $OUT/vla_gpu.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  timeout ${VLA_TIMEOUT:-300} python3 -m robo_rl.cli bench decode --arch openvla-7b --device cuda --dtype bfloat16 \
    --batch 1 8 32 64 --rounds 3 --json "$OUT/decode_7b.json"
  echo "bench rc=$?"
  # pi0: chunk sampling at pi0 size (PaliGemma-3B + Gemma-300M shapes, random init), cached prefix vs not
  timeout ${PI0_TIMEOUT:-240} python3 -m robo_rl.cli bench sample --arch pi0 --device cuda --dtype bfloat16 \
    --batch 1 8 32 --rounds 3 --json "$OUT/sample_pi0.json"
  echo "bench sample rc=$?"
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
} 2>&1 | tee "$OUT/vla_gpu.log"
