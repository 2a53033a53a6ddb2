#!/usr/bin/env bash
# Simulator check on a GPU machine (see scripts/device/README.md). Run from anywhere:
#   bash scripts/device/gpu_sims_check.sh
# Needs .gl/*.deb (GL/Vulkan loaders) and .gpu/sims-*-cp<PYTAG>.tar.xz (+ .gpu/xlibs/*.deb) carried along.
# Writes $OUT/sims_gpu.log, $OUT/sims_gpu.json and a few PNGs.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/sims_out}
SITE=${SIMS_SITE:-/tmp/site}
PY=${PYTHON:-python3}
PYTAG=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
mkdir -p "$OUT" "$SITE"

main() {
  t0=$(date +%s)

  source scripts/device/gpu_env.sh
  gpu_env_setup
  echo "setup: $(( $(date +%s) - t0 ))s; python $($PY -V 2>&1) at $(command -v $PY); bundle $(du -sh "$SITE" | cut -f1)"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || echo "nvidia-smi failed"
  ldconfig -p | grep -E 'libvulkan.so.1|libEGL.so.1|libX11.so.6 ' | sed 's/^/  /'
  echo "VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-} __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-}"

  $PY scripts/device/gpu_sims_check.py "$@"
  rc=$?
  echo "total: $(( $(date +%s) - t0 ))s, rc=$rc"
  return $rc
}

main "$@" 2>&1 | tee "$OUT/sims_gpu.log"
exit "${PIPESTATUS[0]}"
