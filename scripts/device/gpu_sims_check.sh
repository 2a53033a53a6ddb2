#!/usr/bin/env bash
# Simulator check on a lent GPU machine (see scripts/device/README.md). Run from anywhere:
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

  # GL/Vulkan loaders (libvulkan1, libegl1, libglvnd0, libopengl0, ...), then the NVIDIA ICDs if not registered
  if ls .gl/*.deb >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v nvidia-smi >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  NV=/usr/local/nvidia/share
  if [ -f $NV/vulkan/icd.d/nvidia_icd.json ] && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$NV/vulkan/icd.d/nvidia_icd.json VK_ICD_FILENAMES=$NV/vulkan/icd.d/nvidia_icd.json
  fi
  if [ -f $NV/glvnd/egl_vendor.d/10_nvidia.json ] && ! ls /usr/share/glvnd/egl_vendor.d/*nvidia* >/dev/null 2>&1; then
    export __EGL_VENDOR_LIBRARY_FILENAMES=$NV/glvnd/egl_vendor.d/10_nvidia.json
  fi
  # SAPIEN's renderer links libX11; unpack Debian's X client libs beside (never into /) when the image lacks them
  if ! ldconfig -p | grep -q 'libX11.so.6 ' && ls .gpu/xlibs/*.deb >/dev/null 2>&1; then
    for f in .gpu/xlibs/*.deb; do dpkg -x "$f" /tmp/xlibs; done
    export LD_LIBRARY_PATH=/tmp/xlibs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "libX11 not in the image: using /tmp/xlibs"
  fi

  # the simulator bundle (site-packages layout) and the environment
  for t in .gpu/sims-*-cp"$PYTAG".tar.xz; do
    [ -f "$t" ] && tar -xJf "$t" -C "$SITE" || echo "missing bundle $t (cp$PYTAG)"
  done
  export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl} ROBO_RL_LIBERO_HOME=/tmp/robo-rl-libero
  export OUT
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
