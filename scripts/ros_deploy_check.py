"""Deployment over ROS 2 equals evaluation in simulation: ``robo-rl deploy`` (each transport) drives a
simulated robot process (``python -m real_robot.sim_robot``: a ManiSkill env behind the robot config's
topics, on real rclpy with Fast DDS 3) over the same seeds as a direct ``robo-rl eval --num-envs 1``.
Prints both success rates with 95% intervals and the paired comparison (``robo-rl compare``).

    .venv/bin/python scripts/ros_deploy_check.py RUN --episodes 50 [--transports rclpy cyclonedds]

Everything runs on loopback on a random ROS domain; result files go to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from real_robot.loopback import loopback_env, random_domain  # noqa: E402
from robo_rl import checkpoint as ckpt_io  # noqa: E402
from robo_rl.eval.metrics import wilson_interval  # noqa: E402

ROBO_RL = [sys.executable, "-m", "robo_rl.cli"]


def deploy_episodes(run: str, robot: str, transport: str, episodes: int, seed: int, env_cfg: dict,
                    timeout: float) -> dict:
    """Run the simulated robot (rclpy) and ``robo-rl deploy`` (``transport``) until ``episodes`` ended."""
    env = {**os.environ, **loopback_env(random_domain())}
    sim_cmd = [sys.executable, "-m", "real_robot.sim_robot", "--robot", robot, "--task", env_cfg["task"],
               "--episodes", str(episodes), "--seed", str(seed), "--transport", "rclpy",
               "--control-mode", env_cfg.get("control_mode") or "pd_joint_pos"]
    if env_cfg.get("max_episode_steps"):
        sim_cmd += ["--max-episode-steps", str(env_cfg["max_episode_steps"])]
    t0 = time.time()
    sim = subprocess.Popen(sim_cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sim_log = []
    for line in sim.stderr:  # the env is built (seconds on a busy machine) before the node starts waiting
        sim_log.append(line)
        if "sim robot ready" in line:
            break
    dep = subprocess.Popen([*ROBO_RL, "deploy", run, "--robot", robot, "--transport", transport], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = sim.communicate(timeout=timeout)
    finally:
        dep.send_signal(signal.SIGINT)
        dep_out, dep_err = dep.communicate(timeout=30)
    if sim.returncode != 0:
        raise SystemExit(f"simulated robot failed: {''.join(sim_log)[-2000:]}{err[-2000:]}\ndeploy: {dep_err[-2000:]}")
    results = json.loads(out.strip().splitlines()[-1])["results"]
    summary = json.loads(dep_out[dep_out.index("{"):])
    wins = sum(bool(r["success"]) for r in results)
    lo, hi = wilson_interval(wins, len(results))
    return {"checkpoint": run, "via": f"robo-rl deploy ({transport}) -> rclpy sim robot", "episodes": len(results),
            "successes": wins, "success_rate": wins / len(results), "ci95_low": lo, "ci95_high": hi,
            "mean_return": sum(r["return"] for r in results) / len(results),
            "episode_success": [[int(bool(r["success"])) for r in results]], "deploy_summary": summary,
            "wall_s": time.time() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--robot", default="configs/robots/panda_sim_delta.yaml")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transports", nargs="+", default=["rclpy", "cyclonedds"])
    ap.add_argument("--out-dir", default="ros_deploy_check")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_cfg = ckpt_io.read_meta(ckpt_io.resolve(args.run))["config"]["env"]
    direct = out / "direct.json"
    subprocess.run([*ROBO_RL, "eval", args.run, "--episodes", str(args.episodes), "--num-envs", "1", "--seed",
                    str(args.seed), "--out", str(direct), "--no-video"], cwd=REPO, check=True, capture_output=True)
    d = json.loads(direct.read_text())
    rows = [("robo-rl eval (direct)", d["successes"], d["episodes"], d["ci95_low"], d["ci95_high"], "")]
    for tr in args.transports:
        res = deploy_episodes(args.run, args.robot, tr, args.episodes, args.seed, env_cfg, args.timeout)
        path = out / f"deploy_{tr}.json"
        path.write_text(json.dumps(res, indent=2))
        cmp = subprocess.run([*ROBO_RL, "compare", "--a", str(path), "--b", str(direct)], cwd=REPO,
                             capture_output=True, text=True)
        rows.append((f"robo-rl deploy --transport {tr}", res["successes"], res["episodes"], res["ci95_low"],
                     res["ci95_high"], f"{res['wall_s']:.0f} s; holds {res['deploy_summary']['interventions']}"))
        (out / f"compare_{tr}.txt").write_text(cmp.stdout + cmp.stderr)
        print((cmp.stdout.strip() or cmp.stderr.strip()).splitlines()[-1])
    print(f"{'path':36s} {'success':>9s} {'95% CI':>15s}  notes")
    for name, wins, n, lo, hi, note in rows:
        print(f"{name:36s} {wins:3d}/{n:<5d} [{lo:.2f}, {hi:.2f}]  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
