#!/usr/bin/env bash
# Join a robo-rl Ray cluster as a worker node (hosts rollout workers: envs + a policy copy).
#   launch/ray_worker.sh HEAD_IP:PORT [NUM_CPUS] [NUM_GPUS]
# Several workers on one machine (a loopback test cluster) each get their own node:
#   launch/ray_head.sh 6379 0 && launch/ray_worker.sh 127.0.0.1:6379 1 && launch/ray_worker.sh 127.0.0.1:6379 1
set -euo pipefail
ADDR=${1:?usage: launch/ray_worker.sh HEAD_IP:PORT [NUM_CPUS] [NUM_GPUS]}
CPUS=${2:-}
GPUS=${3:-}
RAY=${RAY:-$(dirname "$0")/../.venv/bin/ray}
[[ -x "$RAY" ]] || RAY=ray
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec "$RAY" start --address="$ADDR" --disable-usage-stats ${CPUS:+--num-cpus="$CPUS"} ${GPUS:+--num-gpus="$GPUS"} \
  ${RAY_WORKER_EXTRA:-}
