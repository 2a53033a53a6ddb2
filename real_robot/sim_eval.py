"""Evaluate a trained policy through the ROS 2 bridge against the simulated robot process:
`robo-rl eval RUN --via-ros configs/robots/<sim robot>.yaml`. The loop is the one every simulator
evaluation runs (``robo_rl.runners.evaluate.evaluate_policy``) over a ``RobotEnv``: the robot as a
VecEnv of one env, its commands through the bridge's safety filter. The simulated robot seeds episode k
with ``seed + k``, so ``episode_success`` pairs with a direct ``robo-rl eval --num-envs 1 --seed SEED``
in ``robo-rl compare``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from real_robot.loopback import loopback_env, random_domain
from robo_rl.errors import ConfigError, RoboRLError


def _sim_robot_cmd(robot_path: str, env_cfg: dict[str, Any], episodes: int, seed: int, domain: int) -> list[str]:
    cmd = [sys.executable, "-m", "real_robot.sim_robot", "--robot", robot_path, "--task", env_cfg["task"],
           "--episodes", str(episodes), "--seed", str(seed), "--domain", str(domain),
           "--control-mode", env_cfg.get("control_mode") or "pd_joint_pos"]
    if env_cfg.get("max_episode_steps"):
        cmd += ["--max-episode-steps", str(env_cfg["max_episode_steps"])]
    return cmd


def evaluate_over_ros(checkpoint: str, robot_path: str, episodes: int, seed: int, timeout: float = 3600) -> dict[str, Any]:
    import importlib.util

    from real_robot.bridge import RosBridge
    from real_robot.config import load_robot
    from real_robot.deploy import check_fit
    from real_robot.robot_env import OutcomeSource, RobotEnv
    from robo_rl.build import load_run, policy_from_checkpoint
    from robo_rl.runners.evaluate import evaluate_policy

    run = load_run(checkpoint)
    env_cfg = run.meta["config"]["env"]
    if env_cfg.get("name") != "maniskill":
        raise ConfigError(f"evaluation over ROS 2 drives the simulated ManiSkill robot; this run used env {env_cfg.get('name')!r}")
    if importlib.util.find_spec("cyclonedds") is None:
        raise ConfigError("evaluation over ROS 2 needs the cyclonedds package: pip install 'robo-rl[ros2]'")
    from real_robot.transport.dds import CycloneTransport

    robot = load_robot(robot_path)
    check_fit(robot, run.meta.get("obs_spec", {}), list(run.action_spec.shape))
    if (env_cfg.get("control_mode") or "pd_joint_pos") != "pd_joint_pos" and robot.action_mode != "passthrough":
        raise ConfigError(f"this run's actions are {env_cfg.get('control_mode')!r}; use a robot config with "
                          "action_mode: passthrough (e.g. configs/robots/panda_sim_delta.yaml)")
    policy, _, _ = policy_from_checkpoint(run)
    domain = random_domain()
    loopback = loopback_env(domain)
    # the bridge and the simulated robot both on the loopback settings, whatever CYCLONEDDS_URI says
    tr = CycloneTransport(domain, config=loopback["CYCLONEDDS_URI"])
    state = run.obs_spec.get("state")
    bridge = RosBridge(robot, tr, state_dim=int(state.shape[-1]) if state is not None else None)
    env = RobotEnv(bridge, OutcomeSource(tr), run.obs_spec, run.action_spec)
    proc = subprocess.Popen(_sim_robot_cmd(robot_path, env_cfg, episodes, seed, domain), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path.cwd(), env={**os.environ, **loopback})
    error: Exception | None = None
    try:
        result = evaluate_policy(env, policy, episodes, seed=seed)
    except RoboRLError as err:
        error = err
    finally:
        env.close()
        try:
            out, err_text = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err_text = proc.communicate()
        tr.close()
    if proc.returncode != 0 or error is not None:
        last = err_text.strip().splitlines()[-1] if err_text.strip() else f"exit code {proc.returncode}"
        seen = (f"the bridge received {dict(bridge.received)} and sent {bridge.sent} command(s)" if bridge.received
                else "no observation reached the bridge (DDS discovery between the two processes failed)")
        raise RoboRLError(f"evaluation over ROS 2 failed: {error or 'the simulated robot ' + last}; {seen}")
    sim = json.loads(out.strip().splitlines()[-1])["results"]
    if [int(bool(r["success"])) for r in sim] != [int(x) for x in result.episode_success[0]]:
        raise RoboRLError("the simulated robot's episode outcomes differ from the ones the evaluation counted: "
                          f"{[r['success'] for r in sim]} vs {result.episode_success[0]}")
    return {"checkpoint": checkpoint, "via": "ros2 (cyclonedds, loopback)", "robot": robot.name,
            **result.as_dict(), "interventions": dict(bridge.safety.counts), "rejected": dict(bridge.rejected),
            "commands_sent": bridge.sent}
