"""GPU check of ``run.device`` in the single-process trainer: the same short runs on ``cpu`` and ``cuda``
(PPO with the MLP, GRPO with the tiny OpenVLA-style token policy, Flow-Noise PPO with the tiny pi0-style
policy) on the simulator-free point-reach env of the test suite, then the CUDA run's checkpoint resumed
on the CPU. Prints env steps/s per device, how far the greedy actions of the CPU run's checkpoint on the
GPU are from the same checkpoint's on the CPU (one fixed batch of observations: kernel rounding only; the
runs themselves differ, CUDA sampling draws from its own generator), the GPU's memory peak, and writes
$OUT/train_gpu.json. Needs only torch with CUDA and the repo's pure-Python dependencies:

    OUT=/tmp/out python3 scripts/device/gpu_train_check.py        # from the repo root
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

CASES = {
    "ppo-mlp": ({"name": "mlp", "hidden": [64, 64]}, {"name": "ppo", "epochs": 2, "minibatches": 2}, 32, 4000),
    "grpo-openvla-tiny": ({"name": "openvla", "arch": "tiny", "chunk": 4, "exec_steps": 2},
                          {"name": "grpo", "group_size": 4, "min_groups": 1, "max_rounds": 2, "minibatches": 2},
                          16, 1200),
    "ppo-pi0-tiny-flow-noise": ({"name": "pi0", "arch": "tiny", "exec_steps": 2, "sampler": "noise"},
                                {"name": "ppo", "epochs": 1, "minibatches": 2}, 16, 1200),
}


def run_case(name: str, device: str, out_dir: Path) -> dict:
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import resume, train

    policy, algo, envs, steps = CASES[name]
    cfg = from_dict(TrainConfig, {
        "env": {"name": "fake_reach", "num_envs": envs, "max_episode_steps": 8, "image_size": 32},
        "policy": policy, "algo": algo,
        "run": {"total_env_steps": steps, "rollout_steps": 8, "eval_every_steps": 0, "final_eval_episodes": 8,
                "video": False, "progress": False, "tensorboard": False, "out_dir": str(out_dir),
                "name": f"{name}-{device.replace(':', '')}", "device": device, "seed": 3}})
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    summary = train(cfg)
    wall = time.monotonic() - t0
    run_dir = Path(summary["run_dir"])
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    first = {k: float(v) for k, v in rows[0].items() if k.startswith("loss/") and v}
    res = {"device": device, "run_dir": str(run_dir), "env_steps": summary["env_steps"], "wall_s": round(wall, 2),
           "steps_per_s": round(summary["env_steps"] / wall, 1), "first_losses": first,
           "final_success": summary.get("final_eval", {}).get("success_rate")}
    if device.startswith("cuda"):
        res["peak_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        resumed = resume(run_dir, [f"run.total_env_steps={summary['env_steps'] + steps // 4}", "run.device=cpu"])
        res["resumed_on_cpu_to"] = resumed["env_steps"]
    return res


def greedy_gap(run_dir: str) -> float:
    """max |greedy action on the GPU - greedy action on the CPU| of one checkpoint over one fixed batch."""
    from robo_rl.boundary import obs_to_torch
    from robo_rl.build import build_env, load_run, policy_from_checkpoint
    from robo_rl.rollout.device import OnDevice

    run = load_run(run_dir)
    env = build_env(run.config.env)
    try:
        obs = obs_to_torch(env.reset(seed=123)[0])
    finally:
        env.close()
    cpu_policy = policy_from_checkpoint(run)[0].eval()
    gpu_policy = OnDevice(policy_from_checkpoint(run)[0].to("cuda").eval(), torch.device("cuda"))
    with torch.no_grad():
        a = cpu_policy.act(obs, deterministic=True).actions
        b = gpu_policy.act(obs, deterministic=True).actions
    return float((a - b).abs().max())


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    from robo_rl.registry import ENVS

    ENVS.register("fake_reach", "tests.fakes.vec:PointReachVecEnv")
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    report: dict = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            report[name] = {}
            for dev in devices:
                try:
                    report[name][dev] = run_case(name, dev, Path(tmp))
                except Exception as err:  # report every case, then fail
                    ok = False
                    report[name][dev] = {"error": f"{type(err).__name__}: {err}"}
                    traceback.print_exc()
                print(name, dev, json.dumps(report[name][dev]), flush=True)
            if "cpu" in report[name] and "cuda" in report[name] and "steps_per_s" in report[name]["cuda"]:
                c, g = report[name]["cpu"], report[name]["cuda"]
                report[name]["cuda_over_cpu_steps_per_s"] = round(g["steps_per_s"] / c["steps_per_s"], 2)
                try:
                    report[name]["greedy_action_gap_cpu_ckpt"] = greedy_gap(c["run_dir"])
                except Exception as err:
                    ok = False
                    report[name]["greedy_action_gap_cpu_ckpt"] = f"{type(err).__name__}: {err}"
                    traceback.print_exc()
                print(name, "cuda/cpu steps/s", report[name]["cuda_over_cpu_steps_per_s"], "greedy action gap",
                      report[name]["greedy_action_gap_cpu_ckpt"], flush=True)
    (out / "train_gpu.json").write_text(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
