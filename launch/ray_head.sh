#!/usr/bin/env bash
# Start the Ray head of a robo-rl cluster on this machine (the learner runs here, in the driver).
#   launch/ray_head.sh [PORT] [NUM_CPUS]     PORT default 6379; NUM_CPUS default: all (0 = learner only)
# Then on every worker node: launch/ray_worker.sh HEAD_IP:PORT
# And run a job:  robo-rl train CONFIG cluster.address=auto cluster.num_workers=N
# Every node must use the same Python and Ray version (constraints.txt pins ray).
set -euo pipefail
usage="usage: launch/ray_head.sh [PORT] [NUM_CPUS]   (PORT 1-65535, default 6379; NUM_CPUS >= 0, default all)"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
(( $# <= 2 )) || { echo "ray_head.sh: too many arguments; $usage" >&2; exit 2; }
PORT=${1:-6379}
CPUS=${2:-}
[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) || { echo "ray_head.sh: PORT '$PORT' is not a port number; $usage" >&2; exit 2; }
[[ -z "$CPUS" || "$CPUS" =~ ^[0-9]+$ ]] || { echo "ray_head.sh: NUM_CPUS '$CPUS' is not a whole number; $usage" >&2; exit 2; }
RAY=${RAY:-$(dirname "$0")/../.venv/bin/ray}
[[ -x "$RAY" ]] || RAY=ray
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
exec "$RAY" start --head --port="$PORT" --include-dashboard=false --disable-usage-stats \
  ${CPUS:+--num-cpus="$CPUS"} ${RAY_HEAD_EXTRA:-}
