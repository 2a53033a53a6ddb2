"""Simulator check on a GPU machine: placement, ManiSkill3 (GPU rendering), LIBERO (EGL). Run through
gpu_sims_check.sh (it unpacks the bundle and sets the environment); see scripts/device/README.md.

Each section runs in its own subprocess under a deadline (a crash, hang or timeout costs that section
only) and writes its results as it goes; the parent merges them into $OUT/sims_gpu.json and prints a table.

    python3 scripts/device/gpu_sims_check.py                 # all sections
    python3 scripts/device/gpu_sims_check.py --only libero   # one section
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT") or "/tmp/sims_out")
TMP = Path("/tmp/sims_check")
BUDGET_S = float(os.environ.get("SIMS_CHECK_BUDGET_S", 270))  # whole run, on top of the shell part
GL = os.environ.get("SIMS_CHECK_GL", "egl")  # LIBERO's GL backend (osmesa for a CPU-only dry run)
# section -> (cap in seconds, description)
SECTIONS = {
    "placement": (60, "robo_rl.distributed.placement on the real GPUs"),
    "maniskill": (110, "ManiSkill3 PickCube-v1 rgb, CPU physics + GPU render: raw env and our VecEnv 1/4/8"),
    "libero": (120, "LIBERO libero_spatial/0, EGL on the GPU (SIMS_CHECK_GL): VecEnv 1/4 workers, fast_render off/on"),
    "maniskill_gpu_sim": (40, "ManiSkill3 physx_cuda, 64 envs (expected to fail offline)"),
}


class Recorder(dict):
    """A section's results, rewritten to disk after every entry so a timeout keeps what was measured."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.path = TMP / f"{name}.json"

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        self.path.write_text(json.dumps(self, indent=1, default=str))

    def attempt(self, key: str, fn, *args, **kw):  # noqa: ANN001
        try:
            self[key] = fn(*args, **kw)
        except Exception as err:  # noqa: BLE001 - every failure is a result here
            self[key] = {"error": f"{type(err).__name__}: {err}"[:2000], "trace": traceback.format_exc()[-3000:]}


def timed_steps(step, make_action, n: int, cap_s: float) -> dict:
    """Steps/s over up to n calls of step(make_action()), stopping early after cap_s seconds."""
    t0, done = time.perf_counter(), 0
    while done < n and time.perf_counter() - t0 < cap_s:
        step(make_action())
        done += 1
    dt = time.perf_counter() - t0
    return {"steps": done, "seconds": round(dt, 2)}


def save_png(name: str, img: np.ndarray) -> str:
    import imageio.v2 as imageio

    imageio.imwrite(OUT / name, np.asarray(img, dtype=np.uint8))
    return name


# ---------------------------------------------------------------- sections (each in its own process)

def sec_placement(rec: Recorder) -> None:
    import torch

    from robo_rl.distributed.placement import describe, devices_per_env, place_env_workers, visible_devices

    rec["torch"] = f"{torch.__version__} cuda={torch.version.cuda} available={torch.cuda.is_available()}"
    devices = visible_devices()
    rec["visible_devices"] = [f"{d.index}: {d.name}" for d in devices]
    for n in (1, 4, 16):
        rec[f"workers_{n}"] = describe(place_env_workers([1] * n, devices))
    rec["devices_per_env_8x2"] = devices_per_env(8, 2)


def sec_maniskill(rec: Recorder) -> None:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    import sapien

    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    rec["sapien_devices"] = sapien.render.get_device_summary()[:1500]

    def raw() -> dict:
        t0 = time.perf_counter()
        env = gym.make("PickCube-v1", obs_mode="rgb", sim_backend="physx_cpu", render_backend="gpu",
                       control_mode="pd_joint_delta_pos", sensor_configs=dict(width=128, height=128))
        obs, _ = env.reset(seed=0)
        made = time.perf_counter() - t0
        for _ in range(10):
            env.step(env.action_space.sample())

        def step(a):  # noqa: ANN001, ANN202
            _, _, term, trunc, _ = env.step(a)
            if bool(term.any() or trunc.any()):
                env.reset()

        r = timed_steps(step, env.action_space.sample, 100, 15)
        rgb = obs["sensor_data"]["base_camera"]["rgb"][0].cpu().numpy()
        r.update(steps_per_s=round(r["steps"] / r["seconds"], 1), make_reset_s=round(made, 1),
                 render_device=str(env.unwrapped.backend.render_device), rgb_mean=float(rgb.mean()),
                 png=save_png("maniskill_rgb.png", rgb))
        env.close()
        return r

    rec.attempt("raw_single_env", raw)
    for n in (1, 4, 8):
        def ours(n: int = n) -> dict:
            t0 = time.perf_counter()
            env = ManiSkillVecEnv(ManiSkillConfig(task="PickCube-v1", num_envs=n, obs_mode="rgb", backend="cpu",
                                                  render_device="auto", image_size=128))
            try:
                obs, _ = env.reset(seed=0)
                made = time.perf_counter() - t0
                spec = env.action_spec
                rng = np.random.default_rng(0)
                act = lambda: rng.uniform(spec.low, spec.high, (n, *spec.shape)).astype(np.float32)  # noqa: E731
                for _ in range(5):
                    env.step(act())
                r = timed_steps(env.step, act, 100, 12)
                r.update(env_steps_per_s=round(n * r["steps"] / r["seconds"], 1), make_reset_s=round(made, 1),
                         render_backends=sorted(set(env.render_backends)), rgb_mean=float(obs["rgb"].mean()))
                return r
            finally:
                env.close()

        rec.attempt(f"vecenv_{n}", ours)


def sec_maniskill_gpu_sim(rec: Recorder) -> None:
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    def gpu() -> dict:
        t0 = time.perf_counter()
        env = ManiSkillVecEnv(ManiSkillConfig(task="PickCube-v1", num_envs=64, backend="gpu", obs_mode="state"))
        try:
            env.reset(seed=0)
            spec = env.action_spec
            r = timed_steps(env.step, lambda: np.zeros((64, *spec.shape), np.float32), 50, 10)
            r.update(env_steps_per_s=round(64 * r["steps"] / r["seconds"], 1), make_s=round(time.perf_counter() - t0, 1))
            return r
        finally:
            env.close()

    rec.attempt("physx_cuda_64", gpu)


def sec_libero(rec: Recorder) -> None:
    from sims.libero.env import LiberoConfig, LiberoVecEnv

    for n in (1, 4):
        for fast in (False, True):
            def run(n: int = n, fast: bool = fast) -> dict:
                t0 = time.perf_counter()
                env = LiberoVecEnv(LiberoConfig(suite="libero_spatial", task_ids=(0,), num_envs=n, gl=GL,
                                                render_gpu="auto", fast_render=fast, image_size=128,
                                                max_episode_steps=10**6))
                try:
                    obs, _ = env.reset(seed=0)
                    made = time.perf_counter() - t0
                    rng = np.random.default_rng(0)
                    act = lambda: rng.uniform(-1, 1, (n, 7)).astype(np.float32)  # noqa: E731
                    env.step(act())
                    r = timed_steps(env.step, act, 30, 10)
                    r.update(env_steps_per_s=round(n * r["steps"] / r["seconds"], 1), make_reset_s=round(made, 1),
                             render_devices=env.render_devices, rgb_mean=float(obs["rgb"].mean()))
                    if n == 1 and not fast:
                        r["png"] = save_png("libero_agentview.png", obs["rgb"][0, 0])
                        r["png_wrist"] = save_png("libero_wrist.png", obs["rgb"][0, 1])
                    return r
                finally:
                    env.close()

            rec.attempt(f"vecenv_{n}_fast_{fast}", run)


# ---------------------------------------------------------------- driver

def run_section(name: str, timeout: float) -> dict:
    path = TMP / f"{name}.json"
    path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    status = "ok"
    # own process group, so a timeout also ends the section's env workers
    proc = subprocess.Popen([sys.executable, __file__, "--section", name], start_new_session=True)
    try:
        if proc.wait(timeout=timeout) != 0:
            status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        status = f"timeout after {timeout:.0f}s"
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers (workers of a crashed section)
    except ProcessLookupError:
        pass
    proc.wait()
    res = json.loads(path.read_text()) if path.is_file() else {}
    return {"status": status, "wall_s": round(time.perf_counter() - t0, 1), **res}


def summary_lines(results: dict) -> list[str]:
    lines = [f"{'section':18s} {'item':22s} result"]
    for sec, res in results.items():
        lines.append(f"{sec:18s} {'(status)':22s} {res['status']} in {res['wall_s']}s")
        for key, val in res.items():
            if key in ("status", "wall_s"):
                continue
            if isinstance(val, dict) and "error" in val:
                text = "ERROR " + val["error"].splitlines()[0][:150]
            elif isinstance(val, dict):
                keep = ("steps_per_s", "env_steps_per_s", "steps", "make_reset_s", "render_device",
                        "render_backends", "render_devices", "rgb_mean", "png")
                text = ", ".join(f"{k}={v}" for k, v in val.items() if k in keep)
            else:
                text = str(val).replace("\n", " | ")[:160]
            lines.append(f"{'':18s} {key:22s} {text}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    TMP.mkdir(parents=True, exist_ok=True)
    if args.section:  # child: run one section
        rec = Recorder(args.section)
        rec["started"] = time.strftime("%H:%M:%S")
        rec.attempt("_section", globals()[f"sec_{args.section}"], rec)
        if rec["_section"] is None:
            del rec["_section"]
            rec.path.write_text(json.dumps(rec, indent=1, default=str))
        return 0
    deadline = time.monotonic() + BUDGET_S
    results = {}
    for name in args.only:
        cap, what = SECTIONS[name]
        left = deadline - time.monotonic()
        if left < 10:
            results[name] = {"status": "skipped: out of time", "wall_s": 0}
            continue
        print(f"\n=== {name}: {what} (cap {min(cap, left):.0f}s)", flush=True)
        results[name] = run_section(name, min(cap, left))
        (OUT / "sims_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n=== summary")
    print("\n".join(summary_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
