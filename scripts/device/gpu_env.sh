#!/usr/bin/env bash
# Sourced by the GPU check scripts (run from the repo root): GL/Vulkan loaders and NVIDIA ICDs, X client
# libs if the image lacks them, the simulator bundle into $SITE, and the environment (PYTHONPATH, GL
# platform). Needs PYTAG and SITE set.
gpu_env_setup() {
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
}

# The GPU's name, then its utilisation and memory sampled every second into $OUT/gpu_util.csv in the background
# (summarised by gpu_util_summary.py); SMI holds the sampler's pid, "" without nvidia-smi.
gpu_util_start() {
  SMI=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$OUT/gpu_util.csv" &
    SMI=$!
  fi
}
