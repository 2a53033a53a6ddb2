"""A simulated robot that speaks ROS 2: a ManiSkill env in its own process behind the robot
config's topics, so the whole sim-to-real path (DDS, messages, node, safety) runs on a machine without a robot.

Lockstep loop: publish the camera image (if configured), the task state (with ``state_source:
topic``) and ``/joint_states`` (the first J joints of the agent's
qpos/qvel, J = the robot config's joints), wait for the next command on the command topic, apply it
as the env action (``pd_joint_pos`` targets by default, or the controller given), publish the step's
outcome (reward, terminated, truncated, success) as JSON on ``/robo_rl/sim/step`` (std_msgs/String; what
``real_robot.robot_env.RobotEnv`` steps on), repeat. When an episode ends the result is published as JSON
on ``/robo_rl/sim/episode`` (std_msgs/String) and the env resets with the next seed.

    python -m real_robot.sim_robot --robot configs/robots/panda_sim.yaml --task PickCube-v1 --episodes 10
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from typing import Any

import numpy as np

from real_robot import messages as m
from real_robot.config import RobotConfig, load_robot
from real_robot.transport import QoS, make_transport

RESULTS = "/robo_rl/sim/episode"
STEP_TOPIC = "/robo_rl/sim/step"  # real_robot.robot_env.STEP_TOPIC


class SimRobot:
    def __init__(self, robot: RobotConfig, task: str, transport: Any, max_episode_steps: int | None = None,
                 control_mode: str = "pd_joint_pos") -> None:
        from sims.maniskill.env import ManiSkillConfig, ManiSkillSingleEnv

        if len(robot.cameras) > 1 or any(c.height != c.width for c in robot.cameras):
            raise ValueError("the simulated robot serves at most one square camera")
        cam = robot.cameras[0] if robot.cameras else None
        self.robot = robot
        self.env = ManiSkillSingleEnv(ManiSkillConfig(task=task, obs_mode="rgb" if cam else "state",
                                                      control_mode=control_mode, image_size=cam.height if cam else 128,
                                                      max_episode_steps=max_episode_steps))
        self.j = len(robot.joint_names)
        if self.env.action_spec.shape[-1] != self.j:
            raise ValueError(f"{task} with {control_mode} takes {self.env.action_spec.shape[-1]}-D actions; "
                             f"the robot config has {self.j} joints")
        self.tr = transport
        self.img_pub = transport.publisher(cam.topic, "sensor_msgs/msg/Image", QoS.sensor_data()) if cam else None
        self.state_pub = (transport.publisher(robot.state_topic, "std_msgs/msg/Float64MultiArray")
                          if robot.state_source == "topic" else None)
        self.js_pub = transport.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
        self.res_pub = transport.publisher(RESULTS, "std_msgs/msg/String")
        self.step_pub = transport.publisher(STEP_TOPIC, "std_msgs/msg/String")
        self.commands: queue.Queue[np.ndarray] = queue.Queue()
        transport.subscribe(robot.command_topic, robot.command_type, self._on_command)

    def _on_command(self, raw: bytes, _t: float) -> None:
        try:
            msg = m.deserialize(raw, self.robot.command_type)
        except m.MessageError:
            return
        data = msg.data if hasattr(msg, "data") else msg.points[0].positions
        self.commands.put(np.asarray(data, dtype=np.float32))

    def _publish(self, obs: dict[str, Any]) -> None:
        agent = self.env.env.unwrapped.agent
        qpos = np.asarray(agent.robot.get_qpos().cpu()).reshape(-1)[: self.j]
        qvel = np.asarray(agent.robot.get_qvel().cpu()).reshape(-1)[: self.j]
        now = time.time()
        if self.img_pub is not None:
            self.img_pub.publish(m.serialize(m.image(obs["rgb"][0], now), "sensor_msgs/msg/Image"))
        if self.state_pub is not None:  # the task state the sim policy sees (published before the joints)
            self.state_pub.publish(m.serialize(m.float64_array(obs["state"]), "std_msgs/msg/Float64MultiArray"))
        self.js_pub.publish(m.serialize(m.joint_state(list(self.robot.joint_names), qpos, qvel, now),
                                        "sensor_msgs/msg/JointState"))

    def _first_command(self, obs: dict[str, Any], timeout: float) -> np.ndarray:
        """Until the first command arrives the policy node may not be matched yet (DDS discovery is slower
        under load, and a volatile sample sent before the match is lost): re-send the observation every
        0.5 s; then drop the extra answers to the re-sent copies."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                action = self.commands.get(timeout=0.5)
                break
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no command within {timeout}s of the first observation") from None
                self._publish(obs)
        time.sleep(0.3)
        while not self.commands.empty():
            self.commands.get_nowait()
        return action

    def run(self, episodes: int, seed: int, command_timeout: float = 10.0,
            startup_timeout: float = 60.0) -> list[dict[str, Any]]:
        results = []
        linked = False
        for ep in range(episodes):
            obs = self.env.reset(seed=seed + ep)
            steps, ret, success = 0, 0.0, False
            while True:
                while not self.commands.empty():  # only a command sent after this observation counts
                    self.commands.get_nowait()
                self._publish(obs)
                if not linked:
                    action, linked = self._first_command(obs, startup_timeout), True
                else:
                    try:
                        action = self.commands.get(timeout=command_timeout)
                    except queue.Empty:
                        raise TimeoutError(f"no command within {command_timeout}s") from None
                obs, rew, term, trunc, info = self.env.step(action)
                steps, ret = steps + 1, ret + rew
                success = success or bool(info["success"])
                outcome = {"reward": float(rew), "terminated": bool(term), "truncated": bool(trunc), "success": success}
                self.step_pub.publish(m.serialize(m.string(json.dumps(outcome)), "std_msgs/msg/String"))
                if term or trunc:
                    break
            res = {"episode": ep, "seed": seed + ep, "steps": steps, "return": ret, "success": success}
            results.append(res)
            self.res_pub.publish(m.serialize(m.string(json.dumps(res)), "std_msgs/msg/String"))
        # like a VecEnv's auto-reset: the last episode's end is followed by the next episode's first
        # observation, so a lockstep client (RobotEnv) always has an observation to return
        self._publish(self.env.reset(seed=seed + episodes))
        return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robot", default="configs/robots/panda_sim.yaml")
    ap.add_argument("--task", default="PickCube-v1")
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-episode-steps", type=int, default=None)
    ap.add_argument("--control-mode", default="pd_joint_pos", help="ManiSkill controller the commands drive")
    ap.add_argument("--transport", default="cyclonedds")
    ap.add_argument("--domain", type=int, default=None)
    args = ap.parse_args(argv)
    robot = load_robot(args.robot)
    if args.transport == "rclpy":
        from real_robot.transport.ros import RclpyTransport

        tr = RclpyTransport("robo_rl_sim_robot", domain_id=args.domain)
    else:
        tr = make_transport(args.transport, args.domain)
    sim = SimRobot(robot, args.task, tr, args.max_episode_steps, args.control_mode)
    print("sim robot ready", file=sys.stderr, flush=True)
    time.sleep(1.5)  # DDS discovery
    results = sim.run(args.episodes, args.seed)
    print(json.dumps({"results": results}))
    time.sleep(0.5)
    tr.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
