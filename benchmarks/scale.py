"""The whole rollout step at scale: a batch of ManiSkill envs (rgb) driven by an OpenVLA-style VLA's
batched action decoding, with env steps/s, the time split between env and policy, and the GPU's
utilization and memory sampled while it runs (``nvidia-smi`` every 100 ms; n/a on CPU).

    robo-rl bench scale --arch tiny --num-envs 4 --steps 10                       # CPU dry run
    robo-rl bench scale --arch openvla-7b --device cuda --dtype bfloat16 --env-backend gpu \\
        --num-envs 32 64 --steps 30 --json scale.json                                  # a GPU machine

``--env-backend gpu`` is ManiSkill's batched ``physx_cuda`` (``--scene-workers`` processes, each one scene
batch on the GPU; with ``--pipeline`` the rollout loop is also timed serial vs pipelined over them);
``cpu`` is our subprocess VecEnv (CPU physics, rendering on the GPU Ray/placement assigns when there is
one). If the GPU backend cannot start (SAPIEN fetches its PhysX GPU library on first use, so an offline
machine needs it placed beforehand), the error is reported and, with ``--fallback-cpu``, the bench goes
on with the CPU backend so the policy side is still measured.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

import numpy as np
import torch

from benchmarks.output import check_min, check_output, write_json


class GPUSampler:
    """Samples ``nvidia-smi`` utilization (%) and memory (MiB) of GPU 0 in a thread."""

    def __init__(self, period_ms: int = 100) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._period = period_ms
        self._thread: threading.Thread | None = None
        self.marks: list[int] = []

    def start(self) -> GPUSampler:
        if shutil.which("nvidia-smi") is None:
            return self
        self._proc = subprocess.Popen(["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu,memory.used",
                                       "--format=csv,noheader,nounits", f"-lms={self._period}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                util, mem = (float(x) for x in line.strip().split(","))
            except ValueError:
                continue
            self.samples.append((util, mem))

    def mark(self) -> None:
        """Start of the measured window (samples before it are warm-up)."""
        self.marks.append(len(self.samples))

    def stop(self) -> dict[str, float] | None:
        if self._proc is None:
            return None
        self._proc.terminate()
        self._proc.wait(timeout=5)
        window = self.samples[self.marks[-1]:] if self.marks else self.samples
        if not window:
            return None
        util = [u for u, _ in window]
        return {"util_mean": statistics.fmean(util), "util_p90": float(np.percentile(util, 90)),
                "mem_max_mib": max(m for _, m in window), "samples": len(window)}


def _env(args: argparse.Namespace, num_envs: int, backend: str, image_size: int, scenes: bool = True) -> Any:
    from sims.maniskill.env import ManiSkillConfig, ManiSkillVecEnv

    return ManiSkillVecEnv(ManiSkillConfig(task=args.task, num_envs=num_envs, obs_mode="rgb", image_size=image_size,
                                           control_mode="pd_ee_delta_pose", backend=backend,
                                           envs_per_worker=args.envs_per_worker,
                                           scene_workers=_scene_workers(args, num_envs, backend) if scenes else None))


def _scene_workers(args: argparse.Namespace, num_envs: int, backend: str) -> int | None:
    """``--scene-workers`` on the GPU backend; on CPU scenes hold one env each (0: single-env workers)."""
    if not args.scene_workers:
        return None
    return min(args.scene_workers, num_envs) if backend == "gpu" else num_envs


def collect_rates(env: Any, policy: Any, steps: int) -> dict[str, float]:
    """Env steps/s of the training rollout loop (``Collector``: act, step, store, GAE), serial and then
    pipelined (two worker groups stepping in turn while the policy acts for the other), same envs."""
    from robo_rl.rollout.collector import Collector

    out: dict[str, float] = {}
    for mode in ("serial", "pipelined"):
        col = Collector(env, policy, steps, pipeline=mode == "pipelined")
        if mode == "pipelined" and not col.pipeline:
            break
        col.reset(seed=0)
        t0 = time.perf_counter()
        _, n = col.collect()
        out[f"{mode}_steps_per_s"] = n / (time.perf_counter() - t0)
    if "pipelined_steps_per_s" in out:
        out["pipelined_over_serial"] = out["pipelined_steps_per_s"] / out["serial_steps_per_s"]
    return out


def run_one(args: argparse.Namespace, policy: Any, num_envs: int) -> dict[str, Any]:
    """One env batch of ``num_envs`` driven by ``policy`` for ``args.steps`` measured steps."""
    from robo_rl.errors import RoboRLError

    size = policy.model.arch.vision.image_size
    result: dict[str, Any] = {"num_envs": num_envs}
    try:
        env = _env(args, num_envs, args.env_backend, size)
        result["env_backend"] = args.env_backend
    except (RoboRLError, RuntimeError, OSError) as err:
        result["env_backend_error"] = f"{args.env_backend}: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
        print(result["env_backend_error"])
        if not args.fallback_cpu or args.env_backend == "cpu":
            raise
        env = _env(args, num_envs, "cpu", size, scenes=False)  # single-env workers (envs_per_worker), GPU rendering
        result["env_backend"] = "cpu (fallback)"
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sampler = GPUSampler().start()
    t_env: list[float] = []
    t_pol: list[float] = []
    try:
        obs, _ = env.reset(seed=0)
        for i in range(args.steps + 2):
            if i == 2:
                sampler.mark()
                t_start = time.perf_counter()
            t0 = time.perf_counter()
            with torch.inference_mode():
                actions = policy.act(obs, deterministic=False).actions.float().cpu().numpy()
            sync()
            t1 = time.perf_counter()
            obs = env.step(np.clip(actions, *env.action_spec.bounds())).obs
            t2 = time.perf_counter()
            if i >= 2:
                t_pol.append(t1 - t0)
                t_env.append(t2 - t1)
        wall = time.perf_counter() - t_start
        if args.pipeline:
            result.update(collect_rates(env, policy, args.steps))
    finally:
        gpu = sampler.stop()
        env.close()
    result.update({"env_steps_per_s": num_envs * args.steps / wall, "t_env_ms": 1e3 * statistics.median(t_env),
                   "t_policy_ms": 1e3 * statistics.median(t_pol),
                   "policy_share": sum(t_pol) / (sum(t_pol) + sum(t_env)), "gpu": gpu})
    if args.device.startswith("cuda"):
        result["torch_max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"{num_envs} envs ({result['env_backend']}): {result['env_steps_per_s']:.1f} env steps/s | per step of all "
          f"envs: env {result['t_env_ms']:.1f} ms, policy {result['t_policy_ms']:.1f} ms (policy share "
          f"{result['policy_share']:.2f}) | GPU: " + (f"utilization mean {gpu['util_mean']:.0f}% (p90 "
          f"{gpu['util_p90']:.0f}%), memory max {gpu['mem_max_mib']:.0f} MiB ({gpu['samples']} samples)"
                                                      if gpu else "n/a (no nvidia-smi)"), flush=True)
    if "serial_steps_per_s" in result:
        print(f"  rollout loop: serial {result['serial_steps_per_s']:.1f} env steps/s" + (
            f", pipelined {result['pipelined_steps_per_s']:.1f} (pipelined / serial = {result['pipelined_over_serial']:.2f})"
            if "pipelined_steps_per_s" in result else " (pipelining needs >= 2 env workers)"), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="tiny", help="OpenVLA-style preset of a random-init model (tiny, openvla-7b)")
    ap.add_argument("--checkpoint", default=None, help="local VLA directory instead of a random-init preset")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--task", default="PickCube-v1")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[4], help="env batch sizes, one after the other")
    ap.add_argument("--envs-per-worker", type=int, default=1, help="CPU backend: envs per worker process")
    ap.add_argument("--env-backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--scene-workers", type=int, default=0,
                    help="batched-scene env workers (GPU: physx_cuda scenes of num_envs/N envs each; CPU: one env each)")
    ap.add_argument("--pipeline", action="store_true",
                    help="also time the rollout loop serial vs pipelined (needs >= 2 env workers)")
    ap.add_argument("--fallback-cpu", action="store_true", help="use the CPU backend if the GPU one cannot start")
    ap.add_argument("--steps", type=int, default=10, help="measured steps (after 2 warm-up steps)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    check_min(ap, args, 1, "num_envs", "envs_per_worker", "steps")
    check_min(ap, args, 0, "scene_workers")
    check_output(ap, args, "json")
    from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy

    torch.manual_seed(0)
    with torch.device(args.device):
        policy = OpenVLAPolicy(OpenVLAConfig(arch=args.arch, checkpoint=args.checkpoint, dtype=args.dtype))
    policy = policy.to(args.device).eval()
    print(f"{args.checkpoint or args.arch} ({sum(p.numel() for p in policy.parameters()) / 1e6:.1f} M params, {args.dtype}, "
          f"{args.device}), {args.task} rgb {policy.model.arch.vision.image_size}px", flush=True)
    base: dict[str, Any] = {"arch": args.checkpoint or args.arch, "device": args.device, "dtype": args.dtype,
                            "task": args.task, "params_m": sum(p.numel() for p in policy.parameters()) / 1e6}
    rows = [run_one(args, policy, b) for b in args.num_envs]
    if args.json:
        write_json(args.json, {**base, "rows": rows})
    return 0
