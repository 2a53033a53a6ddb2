#!/usr/bin/env bash
# Join a robo-rl Ray cluster as a worker node (hosts rollout workers: envs + a policy copy).
#   launch/ray_worker.sh HEAD_IP:PORT [NUM_CPUS] [NUM_GPUS]
# Several workers on one machine (a loopback test cluster) each get their own node:
#   launch/ray_head.sh 6379 0 && launch/ray_worker.sh 127.0.0.1:6379 1 && launch/ray_worker.sh 127.0.0.1:6379 1
set -euo pipefail
usage="usage: launch/ray_worker.sh HEAD_IP:PORT [NUM_CPUS] [NUM_GPUS]   (counts: whole numbers >= 0)"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
(( $# >= 1 && $# <= 3 )) || { echo "ray_worker.sh: expected 1 to 3 arguments, got $#; $usage" >&2; exit 2; }
ADDR=$1
CPUS=${2:-}
GPUS=${3:-}
[[ "$ADDR" =~ ^[^:[:space:]]+:[0-9]+$ ]] || { echo "ray_worker.sh: '$ADDR' is not HEAD_IP:PORT (e.g. 10.0.0.5:6379); $usage" >&2; exit 2; }
for n in "$CPUS" "$GPUS"; do
  [[ -z "$n" || "$n" =~ ^[0-9]+$ ]] || { echo "ray_worker.sh: '$n' is not a whole number; $usage" >&2; exit 2; }
done
RAY=${RAY:-$(dirname "$0")/../.venv/bin/ray}
[[ -x "$RAY" ]] || RAY=ray
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec "$RAY" start --address="$ADDR" --disable-usage-stats ${CPUS:+--num-cpus="$CPUS"} ${GPUS:+--num-gpus="$GPUS"} \
  ${RAY_WORKER_EXTRA:-}
