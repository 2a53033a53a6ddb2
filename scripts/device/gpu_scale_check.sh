#!/usr/bin/env bash
# Scale-out GPU check (pipelined rollouts, Ray, several GPUs): ManiSkill envs batched on the GPU
# (physx_cuda; if SAPIEN's PhysX GPU library cannot be had offline, CPU physics + GPU rendering) driven
# by an OpenVLA-7B-shaped random-init VLA decoding in bf16: env steps/s, env vs policy time, GPU
# utilization and memory (`robo-rl bench scale`), at 32 and 64 envs; two scene workers, and the rollout
# loop timed serial vs pipelined over them. Run from anywhere:
#   bash scripts/device/gpu_scale_check.sh
# Carry .gl, .gpu (the simulator bundle, see README.md here) and .whl (transformers, as gpu_vla_check.sh).
# Writes $OUT/scale_gpu.log and $OUT/scale_7b.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/scale_out}
SITE=${SIMS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
PYTAG=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
mkdir -p "$OUT" "$SITE"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

main() {
  t0=$(date +%s)
  source scripts/device/gpu_env.sh
  gpu_env_setup
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || return 1
  fi
  echo "setup: $(( $(date +%s) - t0 ))s"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || echo "nvidia-smi failed"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  timeout "${SCALE_TIMEOUT:-420}" $PY -m robo_rl.cli bench scale --arch openvla-7b --device cuda --dtype bfloat16 \
    --env-backend gpu --fallback-cpu --num-envs 32 64 --envs-per-worker 4 --scene-workers 2 --pipeline --steps 20 --json "$OUT/scale_7b.json"
  rc=$?
  echo "total: $(( $(date +%s) - t0 ))s, rc=$rc"
  return $rc
}

main "$@" 2>&1 | tee "$OUT/scale_gpu.log"
exit "${PIPESTATUS[0]}"
