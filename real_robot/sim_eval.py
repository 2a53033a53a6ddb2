"""Evaluate a trained policy through the ROS 2 bridge against the simulated robot process:
`robo-rl eval RUN --via-ros configs/robots/<sim robot>.yaml`. Same success statistics as a direct
evaluation, so the two can be compared (they should agree within the confidence interval). The simulated
robot seeds episode k with ``seed + k``, so ``episode_success`` (one env's outcomes in order) pairs with a
direct ``robo-rl eval --num-envs 1 --seed SEED`` in ``robo-rl compare``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from real_robot.loopback import loopback_env, random_domain
from robo_rl.errors import ConfigError, RoboRLError


def evaluate_over_ros(checkpoint: str, robot_path: str, episodes: int, seed: int, timeout: float = 3600) -> dict[str, Any]:
    from real_robot.deploy import build
    from real_robot.node import PolicyNode
    from robo_rl.build import load_run
    from robo_rl.eval.metrics import wilson_interval

    env_cfg = load_run(checkpoint).meta["config"]["env"]
    if env_cfg.get("name") != "maniskill":
        raise ConfigError(f"evaluation over ROS 2 drives the simulated ManiSkill robot; this run used env {env_cfg.get('name')!r}")
    domain = random_domain()
    loopback = loopback_env(domain)
    import importlib.util

    if importlib.util.find_spec("cyclonedds") is None:
        raise ConfigError("evaluation over ROS 2 needs the cyclonedds package: pip install 'robo-rl[ros2]'")
    from real_robot.transport.dds import CycloneTransport

    policy, robot = build(checkpoint, robot_path)
    if (env_cfg.get("control_mode") or "pd_joint_pos") != "pd_joint_pos" and robot.action_mode != "passthrough":
        raise ConfigError(f"this run's actions are {env_cfg.get('control_mode')!r}; use a robot config with "
                          "action_mode: passthrough (e.g. configs/robots/panda_sim_delta.yaml)")
    # the node and the simulated robot both on the loopback settings, whatever CYCLONEDDS_URI says
    tr = CycloneTransport(domain, config=loopback["CYCLONEDDS_URI"])
    cmd = [sys.executable, "-m", "real_robot.sim_robot", "--robot", robot_path, "--task", env_cfg["task"],
           "--episodes", str(episodes), "--seed", str(seed), "--domain", str(domain),
           "--control-mode", env_cfg.get("control_mode") or "pd_joint_pos"]
    if env_cfg.get("max_episode_steps"):
        cmd += ["--max-episode-steps", str(env_cfg["max_episode_steps"])]
    node = PolicyNode(robot, policy, tr, reactive=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=Path.cwd(),
                              env={**os.environ, **loopback})
    finally:
        node.stop()
        tr.close()
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        seen = (f"the policy node received {dict(node.received)} and sent {node.sent} command(s)" if node.received
                else "no observation reached the policy node (DDS discovery between the two processes failed)")
        raise RoboRLError(f"the simulated robot failed: {last}; {seen}")
    results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    successes = sum(bool(r["success"]) for r in results)
    lo, hi = wilson_interval(successes, len(results))
    return {"checkpoint": checkpoint, "via": "ros2 (cyclonedds, loopback)", "robot": robot.name, "episodes": len(results),
            "successes": successes, "success_rate": successes / max(1, len(results)), "ci95_low": lo, "ci95_high": hi,
            "mean_return": sum(r["return"] for r in results) / max(1, len(results)),
            "episode_success": [[int(bool(r["success"])) for r in results]],
            "interventions": dict(node.safety.counts), "rejected": dict(node.rejected), "commands_sent": node.sent}
