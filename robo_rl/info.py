"""`robo-rl info`: registered names and a live check of each simulator backend and of ROS 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

from robo_rl.registry import ALGORITHMS, ENVS, POLICIES

_SAPIEN_CHECK = "import sapien; print(sapien.render.get_device_summary())"


def _check_maniskill() -> dict[str, Any]:
    if importlib.util.find_spec("mani_skill") is None:
        return {"ok": False, "detail": "mani-skill not installed: pip install 'robo-rl[maniskill]'"}
    # A subprocess: a broken Vulkan driver can abort the interpreter.
    proc = subprocess.run([sys.executable, "-c", _SAPIEN_CHECK], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or "Supported: 1" not in out:
        return {"ok": False, "detail": "SAPIEN finds no Vulkan device; install Mesa >= 24 lavapipe: "
                "'apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1' on Debian 12 "
                "(bash scripts/setup.sh does it)"}
    gpu = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.strip().startswith("GPU:")), "?")
    return {"ok": True, "detail": f"Vulkan device: {gpu}"}


_LIBERO_CHECK = (
    "import os; os.environ.setdefault('MUJOCO_GL', 'osmesa'); os.environ.setdefault('PYOPENGL_PLATFORM', 'osmesa');"
    "from sims.libero.paths import ensure_config, check_assets; ensure_config(); check_assets();"
    "from sims.libero.suites import suite_tasks, SUITES; print('tasks=%d' % sum(len(suite_tasks(s)) for s in SUITES));"
    "import mujoco; from mujoco import GLContext; c = GLContext(16, 16); c.make_current(); print('gl ok')"
)


def _check_libero() -> dict[str, Any]:
    if importlib.util.find_spec("libero") is None or importlib.util.find_spec("robosuite") is None:
        return {"ok": False, "detail": "LIBERO not installed: ROBO_RL_EXTRAS=maniskill,libero,dev bash scripts/setup.sh"}
    proc = subprocess.run([sys.executable, "-c", _LIBERO_CHECK], capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode != 0 or "gl ok" not in proc.stdout:
        last = next((ln for ln in reversed(lines) if ln.strip()), "unknown error")
        return {"ok": False, "detail": f"{last[:200]} (headless GL needs Debian's libosmesa6; scripts/setup.sh installs it)"}
    count = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("tasks=")), "?")
    return {"ok": True, "detail": f"{count} tasks in 5 suites; MuJoCo osmesa rendering works"}


def _check_torch() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    detail = f"torch {torch.__version__}, " + (f"CUDA x{torch.cuda.device_count()}" if cuda else "CPU only")
    return {"ok": True, "detail": detail}


_ROS2_CHECK = ("import rclpy; from rclpy.signals import SignalHandlerOptions; "
               "rclpy.init(signal_handler_options=SignalHandlerOptions.NO); "
               "print('rmw=' + rclpy.get_rmw_implementation_identifier()); rclpy.shutdown()")


def _check_ros2() -> dict[str, Any]:
    rclpy = importlib.util.find_spec("rclpy") is not None
    cyclone = importlib.util.find_spec("cyclonedds") is not None
    if not rclpy:
        return {"ok": cyclone, "detail": ("no rclpy: deploy uses the cyclonedds transport; " if cyclone else
                                          "neither rclpy nor cyclonedds: ") + "pip install 'robo-rl[ros2]'"}
    # A subprocess: rclpy.init touches process-wide state (the ROS context, DDS participants).
    proc = subprocess.run([sys.executable, "-c", _ROS2_CHECK], capture_output=True, text=True, timeout=60)
    rmw = next((ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("rmw=")), None)
    if proc.returncode != 0 or rmw is None:
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["unknown error"]
        return {"ok": False, "detail": f"rclpy does not initialise: {last[0][:200]}"}
    return {"ok": True, "detail": f"rclpy with {rmw} (transport auto = rclpy); cyclonedds {'too' if cyclone else 'absent'}"}


def collect() -> dict[str, Any]:
    return {
        "registries": {"envs": ENVS.names(), "policies": POLICIES.names(), "algorithms": ALGORITHMS.names()},
        "backends": {"torch": _check_torch(), "maniskill": _check_maniskill(), "libero": _check_libero(),
                     "ros2": _check_ros2()},
    }
