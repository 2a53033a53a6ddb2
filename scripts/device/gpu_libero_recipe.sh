#!/usr/bin/env bash
# LIBERO on a GPU: the CPU pipeline's RL stage at GPU scale for a fixed number of minutes. The small
# OpenVLA-style policy SFT'd on scripted libero_spatial demos (runs/openvla-small-sft-libero, made here by
# configs/openvla_small_sft_libero.yaml) is evaluated on the official init states, trained with
# configs/grpo_openvla_small_libero.yaml with the policy on the GPU (run.device=cuda) and RECIPE_ENVS envs
# rendered with EGL on it, and evaluated again. Prints env steps/s, GPU utilisation and memory, the
# success before/after and their paired comparison. Run from anywhere:
#   bash scripts/device/gpu_libero_recipe.sh
# Carry .gl, .gpu (sims-common + sims-libero bundles, see README.md here) and runs/openvla-small-sft-libero
# (its checkpoints/latest is enough). Writes $OUT/libero_recipe.log, before.json, after.json, gpu_util.csv,
# metrics.csv. Knobs: RECIPE_MINUTES (RL minutes, default 4), RECIPE_ENVS (default 32), RECIPE_EPISODES
# (official init states per task, default 20), RECIPE_TASKS (default libero_spatial/0,libero_spatial/2),
# RECIPE_ENVS_PER_WORKER (envs packed per worker process, default 4; 2 doubles the processes on a
# 16-core machine), RECIPE_DEVICE (default cuda), RECIPE_GL (default egl), RECIPE_SFT (the SFT run), RECIPE_CONFIG (the GRPO
# config; the pi0-style pipeline: RECIPE_CONFIG=configs/grpo_pi0_small_libero.yaml
# RECIPE_SFT=runs/pi0-small-sft-libero, made by configs/pi0_small_sft_libero.yaml), RECIPE_EVAL_ARGS (more
# arguments for both evaluations; the pi0-style policy is trained in its sampled mode and evaluated in it with
# RECIPE_EVAL_ARGS="--stochastic policy.sampler=sde"), RECIPE_TRAIN_ARGS (more overrides for the RL run, e.g.
# "env.init_states=official algo.lr=2e-5"), RECIPE_RUN_DIR (where the RL run is written, default $OUT/runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/recipe_out}
SITE=${SIMS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
PYTAG=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
MINUTES=${RECIPE_MINUTES:-4}
ENVS=${RECIPE_ENVS:-32}
EPW=${RECIPE_ENVS_PER_WORKER:-4}
EPISODES=${RECIPE_EPISODES:-20}
TASKS=${RECIPE_TASKS:-libero_spatial/0,libero_spatial/2}
DEVICE=${RECIPE_DEVICE:-cuda}
GL=${RECIPE_GL:-egl}
SFT=${RECIPE_SFT:-runs/openvla-small-sft-libero}
CONFIG=${RECIPE_CONFIG:-configs/grpo_openvla_small_libero.yaml}
read -r -a EVAL_ARGS <<< "${RECIPE_EVAL_ARGS:-}"
RUNS=${RECIPE_RUN_DIR:-$OUT/runs}
read -r -a TRAIN_ARGS <<< "${RECIPE_TRAIN_ARGS:-}"
mkdir -p "$OUT" "$SITE"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1

main() {
  t0=$(date +%s)
  source scripts/device/gpu_env.sh
  if [ "$GL" = egl ]; then
    gpu_env_setup
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MUJOCO_GL=$GL PYOPENGL_PLATFORM=$GL
  fi
  echo "setup: $(( $(date +%s) - t0 ))s"
  [ -d "$SFT/checkpoints" ] || { echo "no SFT run at $SFT: carry it (runs/openvla-small-sft-libero)"; return 2; }
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  gpu_util_start
  place=("env.gl=$GL" "env.envs_per_worker=$EPW")
  evals=$(( ENVS < 16 ? ENVS : 16 ))
  t1=$(date +%s)
  $PY -m robo_rl.cli eval "$SFT" --benchmark libero-spatial --task "$TASKS" --episodes "$EPISODES" \
    --num-envs "$evals" --device "$DEVICE" --out "$OUT/before.json" "${place[@]}" "${EVAL_ARGS[@]}" || return 1
  echo "before: $(( $(date +%s) - t1 ))s"
  ntasks=$(echo "$TASKS" | tr ',' '\n' | wc -l)
  ids=$(echo "$TASKS" | tr ',' '\n' | sed 's|.*/||' | paste -sd, -)
  t2=$(date +%s)
  $PY -m robo_rl.cli train "$CONFIG" "run.init_from=$SFT" "run.device=$DEVICE" \
    "env.task_ids=[$ids]" "env.num_envs=$ENVS" "${place[@]}" "algo.min_groups=$(( ENVS / 4 / 2 > ntasks ? ENVS / 4 / 2 : ntasks ))" \
    "run.max_minutes=$MINUTES" "run.out_dir=$RUNS" run.name=grpo run.torch_threads=4 run.progress=false \
    run.tensorboard=false "${TRAIN_ARGS[@]}" || return 1
  echo "rl: $(( $(date +%s) - t2 ))s"
  cp "$RUNS/grpo/metrics.csv" "$OUT/metrics.csv"
  t3=$(date +%s)
  $PY -m robo_rl.cli eval "$RUNS/grpo" --benchmark libero-spatial --task "$TASKS" --episodes "$EPISODES" \
    --num-envs "$evals" --device "$DEVICE" --out "$OUT/after.json" "${place[@]}" "${EVAL_ARGS[@]}" || return 1
  echo "after: $(( $(date +%s) - t3 ))s"
  [ -n "$SMI" ] && kill "$SMI"
  $PY -m robo_rl.cli compare --a "$OUT/before.json" --b "$OUT/after.json"
  $PY - "$OUT" <<'EOF'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = list(csv.DictReader(open(out / "metrics.csv")))
wall = float(rows[-1]["wall_time"])
print(f"RL: {len(rows)} updates, {int(rows[-1]['env_steps'])} env steps in {wall / 60:.1f} min = "
      f"{int(rows[-1]['env_steps']) / max(wall, 1e-9):.1f} env steps/s; informative groups "
      f"{sum(float(r.get('rollout/informative_groups') or 0) for r in rows):.0f} of "
      f"{sum(float(r.get('rollout/groups') or 0) for r in rows):.0f}")
EOF
  $PY scripts/device/gpu_util_summary.py "$OUT/gpu_util.csv"
  echo "total: $(( $(date +%s) - t0 ))s"
}

main "$@" 2>&1 | tee "$OUT/libero_recipe.log"
exit "${PIPESTATUS[0]}"
