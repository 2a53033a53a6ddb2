#!/usr/bin/env bash
# Start the Ray head of a robo-rl cluster on this machine (the learner runs here, in the driver).
#   launch/ray_head.sh [PORT] [NUM_CPUS]     PORT default 6379; NUM_CPUS default: all (0 = learner only)
# Then on every worker node: launch/ray_worker.sh HEAD_IP:PORT
# And run a job:  robo-rl train CONFIG cluster.address=auto cluster.num_workers=N
# Every node must use the same Python and Ray version (constraints.txt pins ray).
set -euo pipefail
PORT=${1:-6379}
CPUS=${2:-}
RAY=${RAY:-$(dirname "$0")/../.venv/bin/ray}
[[ -x "$RAY" ]] || RAY=ray
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec "$RAY" start --head --port="$PORT" --include-dashboard=false --disable-usage-stats \
  ${CPUS:+--num-cpus="$CPUS"} ${RAY_HEAD_EXTRA:-}
