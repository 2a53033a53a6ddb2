#!/usr/bin/env bash
# RPD with a VLA teacher on a GPU, for a fixed number of minutes per arm: the CNN student on rgb from its weak
# BC warm start (runs/cnn-bc-pushcube-few) pulled towards the small pi0-style teacher (runs/pi0-small-sft-pushcube)
# with configs/rpd_vla_teacher_pushcube_gpu.yaml, against the same run with algo.lambda_=0 (PPO alone); then the
# teacher and both students on the same evaluation seeds, and their paired comparisons. ManiSkill's GPU physics
# needs SAPIEN's PhysX GPU library, which an offline machine lacks, so the default is CPU physics in worker
# processes with rendering, student and teacher on the GPU. Run from anywhere:
#   bash scripts/device/gpu_rpd_recipe.sh
# Carry .gl, .gpu (sims-common + sims-maniskill bundles and xlibs, see README.md here), runs/pi0-small-sft-pushcube
# and runs/cnn-bc-pushcube-few. Writes $OUT/rpd_recipe.log, teacher.json, rpd.json, ppo.json, rpd_metrics.csv,
# ppo_metrics.csv, gpu_util.csv. Knobs: RPD_MINUTES (per arm, default 2.5), RPD_ENVS (default 16), RPD_BACKEND
# (default cpu; gpu where the PhysX GPU library is installed), RPD_ANNEAL (env steps over which lambda goes
# 1 -> 0, default 40000), RPD_EPISODES (evaluation episodes, default 100), RPD_DEVICE (default cuda),
# RPD_ARGS (more overrides for both arms), RPD_RUN_DIR (default $OUT/runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rpd_out}
SITE=${SIMS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
PYTAG=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
MINUTES=${RPD_MINUTES:-2.5}
ENVS=${RPD_ENVS:-16}
BACKEND=${RPD_BACKEND:-cpu}
ANNEAL=${RPD_ANNEAL:-40000}
EPISODES=${RPD_EPISODES:-100}
DEVICE=${RPD_DEVICE:-cuda}
RUNS=${RPD_RUN_DIR:-$OUT/runs}
TEACHER=runs/pi0-small-sft-pushcube
STUDENT=runs/cnn-bc-pushcube-few
read -r -a ARGS <<< "${RPD_ARGS:-}"
mkdir -p "$OUT" "$SITE"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1

main() {
  t0=$(date +%s)
  source scripts/device/gpu_env.sh
  if [ "$DEVICE" != cpu ]; then
    gpu_env_setup
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  echo "setup: $(( $(date +%s) - t0 ))s"
  for run in "$TEACHER" "$STUDENT"; do
    [ -d "$run/checkpoints" ] || { echo "no run at $run: carry it"; return 2; }
  done
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  gpu_util_start
  common=("env.backend=$BACKEND" "env.num_envs=$ENVS" "run.device=$DEVICE" "run.max_minutes=$MINUTES"
          "algo.anneal_env_steps=$ANNEAL" "run.eval_every_steps=0" "run.final_eval_episodes=0"
          "run.checkpoint_every_steps=20000" "run.out_dir=$RUNS" run.torch_threads=4 run.progress=false
          run.tensorboard=false)
  for arm in rpd ppo; do
    lam=1.0; [ "$arm" = ppo ] && lam=0
    t1=$(date +%s)
    $PY -m robo_rl.cli train configs/rpd_vla_teacher_pushcube_gpu.yaml "${common[@]}" "algo.lambda_=$lam" \
      "run.name=$arm" "${ARGS[@]}" || return 1
    echo "$arm: $(( $(date +%s) - t1 ))s"
    cp "$RUNS/$arm/metrics.csv" "$OUT/${arm}_metrics.csv"
  done
  evals=(--episodes "$EPISODES" --num-envs "$ENVS" --seed 10000 --device "$DEVICE" "env.backend=$BACKEND")
  for who in teacher rpd ppo; do
    src="$RUNS/$who"; [ "$who" = teacher ] && src=$TEACHER
    t2=$(date +%s)
    $PY -m robo_rl.cli eval "$src" "${evals[@]}" --out "$OUT/$who.json" || return 1
    echo "eval $who: $(( $(date +%s) - t2 ))s"
  done
  [ -n "$SMI" ] && kill "$SMI"
  $PY -m robo_rl.cli compare --a "$OUT/rpd.json" --b "$OUT/ppo.json"
  $PY -m robo_rl.cli compare --a "$OUT/teacher.json" --b "$OUT/rpd.json"
  $PY - "$OUT" <<'EOF'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
for arm in ("rpd", "ppo"):
    rows = list(csv.DictReader(open(out / f"{arm}_metrics.csv")))
    wall = float(rows[-1]["wall_time"])
    steps = int(rows[-1]["env_steps"])
    lam = rows[-1].get("loss/teacher_lambda") or "-"
    print(f"{arm}: {steps} env steps in {wall / 60:.1f} min = {steps / max(wall, 1e-9):.1f} env steps/s, "
          f"last lambda {lam}, last sampled training success {rows[-1].get('train/success_rate') or '-'}")
EOF
  $PY scripts/device/gpu_util_summary.py "$OUT/gpu_util.csv"
  echo "total: $(( $(date +%s) - t0 ))s"
}

main "$@" 2>&1 | tee "$OUT/rpd_recipe.log"
exit "${PIPESTATUS[0]}"
