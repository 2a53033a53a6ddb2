"""``robo-rl deploy`` against a robot played by a separate rclpy process (rclpy's public API only, Fast
DDS 3 from PyPI): both project transports, SIGINT/SIGTERM shutdown with the final hold, the latched
e-stop and its reset service, the lifecycle node with ROS parameters and /diagnostics, and
JointTrajectory commands. Loopback only, random ROS domain."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("cyclonedds")

from real_robot.loopback import loopback_env, random_domain  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.real_robot.checkpoints import JOINTS, mlp_checkpoint, robot_yaml  # noqa: E402

ROBOT_SCRIPT = str(Path(__file__).with_name("rclpy_robot.py"))
STEP = 0.05  # min(max_delta 0.05, max_velocity 1.5 / 30 Hz) of the test robot config
CAMERA = {"topic": "/camera/image_raw", "height": 32, "width": 32}


class Session:
    """A robot process and a ``robo-rl deploy`` process on one fresh loopback ROS domain."""

    def __init__(self, tmp_path: Path, transport: str, spec: dict, deploy_args: tuple[str, ...] = (),
                 **robot_over: object) -> None:
        self.env = {**os.environ, **loopback_env(random_domain()), "PYTHONPATH": str(REPO)}
        run = mlp_checkpoint(tmp_path / "run")
        cfg = robot_yaml(tmp_path / f"robot_{transport}.yaml", transport, **robot_over)
        spec = {"joints": JOINTS, "command_topic": "/arm_controller/commands", "seconds": 60, "quiet_exit": 1.5, **spec}
        self.robot = subprocess.Popen([sys.executable, ROBOT_SCRIPT, json.dumps(spec)], env=self.env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.deploy = subprocess.Popen([sys.executable, "-m", "robo_rl.cli", "deploy", str(run), "--robot", str(cfg),
                                        *deploy_args], env=self.env, cwd=REPO, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the robot received its first command."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([self.robot.stdout], [], [], 0.5)
            if r:
                line = self.robot.stdout.readline()
                if line.strip() == "READY":
                    return
                if not line:
                    break
            if self.deploy.poll() is not None:
                break
        self.kill()
        pytest.fail(f"no command reached the robot: deploy rc={self.deploy.returncode}\n"
                    f"{self.deploy.stderr.read()[-3000:]}\nrobot: {self.robot.stderr.read()[-2000:]}")

    def robot_result(self, timeout: float = 60.0) -> dict:
        out, err = self.robot.communicate(timeout=timeout)
        assert self.robot.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        for p in (self.deploy, self.robot):
            if p.poll() is None:
                p.kill()


def _summary(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{"):])


@pytest.mark.parametrize("transport,sig,camera_qos", [("rclpy", signal.SIGINT, "sensor_data"),
                                                      ("rclpy", signal.SIGTERM, "reliable"),
                                                      ("cyclonedds", signal.SIGINT, "reliable"),
                                                      ("cyclonedds", signal.SIGTERM, "sensor_data")])
def test_signal_sends_the_final_hold_and_exits_within_a_second(tmp_path, transport, sig, camera_qos):
    bag = tmp_path / "bag"
    s = Session(tmp_path, transport, {"camera": CAMERA, "camera_qos": camera_qos}, ("--record", str(bag)),
                cameras=[{k: CAMERA[k] for k in ("topic", "height", "width")}])
    try:
        s.wait_ready()
        time.sleep(2.0)
        t_sig = time.time()
        s.deploy.send_signal(sig)
        out, err = s.deploy.communicate(timeout=10)
        t_exit = time.time()
        res = s.robot_result()
    finally:
        s.kill()
    assert s.deploy.returncode == 0, err[-3000:]
    summary = _summary(out)
    assert summary["stopped_by"] == signal.Signals(sig).name and summary["transport"] == transport
    assert summary["interventions"].get("stopped") == 1 and not summary["rejected"], (summary, err[-3000:])
    cmds = res["commands"]
    assert len(cmds) >= 5, (len(cmds), err[-3000:])  # commands flowed (with rclpy a ~0.3 s start-up stall is sometimes seen)
    last = cmds[-1]
    assert last["t"] >= t_sig, "no command arrived after the signal"
    assert t_exit - last["t"] < 1.0, f"deploy exited {t_exit - last['t']:.2f} s after its final hold arrived"
    before = [c["data"] for c in cmds if c["t"] < t_sig]
    assert np.all(np.abs(np.array(last["data"]) - np.array(before[-1])) <= STEP + 1e-9)  # the hold: no jump
    assert "Traceback" not in err and "context is invalid" not in err
    # the recording converts into training episodes: one step per command, the final hold dropped
    demos = tmp_path / "demos.h5"
    conv = subprocess.run([sys.executable, "-m", "robo_rl.cli", "demos", "convert", str(bag), "--robot",
                           str(tmp_path / f"robot_{transport}.yaml"), "--out", str(demos)], cwd=REPO, env=s.env,
                          capture_output=True, text=True, timeout=120)
    assert conv.returncode == 0, conv.stderr[-2000:]
    info = json.loads(conv.stdout)
    assert info["episodes"] == 1 and abs(info["steps"] - (summary["commands_sent"] - 1)) <= 2, info


def test_estop_latches_until_the_reset_service_with_fresh_inputs(tmp_path):
    # the push holds the arm for 0.8 s: a hold computed before the node saw the push and arriving after it
    # would otherwise move the simulated arm straight back (under load the node's ticks lag the robot's)
    pushed = [0.8] * len(JOINTS)
    events = [{"after": 1.0, "estop": True}, {"after": 1.0, "estop": False}, {"after": 0.5, "push": pushed, "hold": 0.8},
              {"after": 1.0, "silent": 1.6}, {"after": 0.9, "reset": True}, {"after": 1.7, "reset": True},
              {"after": 1.5, "end": True}]
    s = Session(tmp_path, "rclpy", {"events": events, "quiet_exit": 1.0})
    try:
        s.wait_ready()
        res = s.robot_result()
        s.deploy.send_signal(signal.SIGINT)
        out, err = s.deploy.communicate(timeout=10)
    finally:
        s.kill()
    assert s.deploy.returncode == 0, err[-3000:]
    ev = {k: e["t"] for e in res["events"] for k in e if k in ("push",)}
    t_engage = res["events"][0]["t"]
    refused, accepted = res["replies"]
    assert refused["success"] is False and "older than stale_ms" in refused["message"], refused
    assert accepted["success"] is True, accepted
    cmds = [(c["t"], np.array(c["data"])) for c in res["commands"]]
    latched = [c for t, c in cmds if ev["push"] + 0.2 < t < accepted["t"] - 0.05]
    assert latched and all(np.all(np.abs(c - pushed) <= STEP + 1e-6) for c in latched)  # the False did not release
    # from the last latched hold on (the reply may reach the robot after the first released command): every
    # command within one step of the one before, i.e. the first after the release starts at the measured position
    t_held = max(t for t, c in cmds if ev["push"] + 0.2 < t < accepted["t"] - 0.05)
    after = [c for t, c in cmds if t >= t_held]
    assert len(after) > 2, "no command after the reset"
    assert all(np.all(np.abs(b - a) <= STEP + 1e-6) for a, b in zip(after, after[1:]))
    assert any(np.any(np.abs(c - pushed) > 2 * STEP) for c in after), "the policy never commanded again"
    assert all(t < t_engage + 0.2 or t > accepted["t"] or np.all(np.abs(c - latched[-1]) <= 1.0) for t, c in cmds)
    summary = _summary(out)["interventions"]
    assert summary["estop_release_ignored"] == 1 and summary["estop_reset_refused"] == 1
    assert summary["estop_reset"] == 1 and summary["estop"] >= 60


def test_managed_lifecycle_ros_parameters_and_diagnostics(tmp_path):
    events = [{"after": 0.0, "transition": "configure", "wait": True}, {"after": 0.5, "transition": "activate"},
              {"after": 3.0, "transition": "deactivate", "wait": True}, {"after": 1.0, "end": True}]
    s = Session(tmp_path, "rclpy", {"events": events, "events_from": "start", "command_topic": "/other/commands",
                                    "quiet_exit": 0.8},
                ("--managed", "--ros-args", "-p", "control_rate_hz:=15.0", "-p", "command_topic:=/other/commands"))
    try:
        res = s.robot_result(timeout=90)
        s.deploy.send_signal(signal.SIGTERM)
        out, err = s.deploy.communicate(timeout=10)
    finally:
        s.kill()
    assert s.deploy.returncode == 0, err[-3000:]
    assert [(r["transition"], r["success"]) for r in res["replies"]] == [("configure", True), ("activate", True),
                                                                        ("deactivate", True)], res["replies"]
    t_act, t_deact = res["replies"][1]["t"], res["replies"][2]["t"]
    active = [c["t"] for c in res["commands"] if t_act + 0.3 < c["t"] < t_deact - 0.1]
    assert len(active) > 10, (len(active), res["diagnostics"][-1:], err[-2000:])
    rate = (len(active) - 1) / (active[-1] - active[0])
    assert 12.0 < rate < 18.0, (f"commands at {rate:.1f} Hz, the parameter asked for 15", res["diagnostics"][-1:])
    assert not [c for c in res["commands"] if c["t"] > t_deact + 0.2], "commands after deactivate"
    diag = res["diagnostics"][-1]
    assert diag["name"] == "robo_rl_policy: policy" and diag["values"]["estop_latched"] == "False"
    assert int(diag["values"]["commands_sent"]) > 0 and "age_ms/joint_states" in diag["values"]
    assert abs(float(diag["values"]["loop/period_p50_ms"]) - 1000 / 15) < 10


def test_joint_trajectory_commands_carry_time_from_start(tmp_path):
    s = Session(tmp_path, "rclpy", {"command_type": "JointTrajectory", "quiet_exit": 1.0},
                command_type="trajectory_msgs/msg/JointTrajectory")
    try:
        s.wait_ready()
        time.sleep(1.0)
        s.deploy.send_signal(signal.SIGINT)
        out, err = s.deploy.communicate(timeout=10)
        res = s.robot_result()
    finally:
        s.kill()
    assert s.deploy.returncode == 0, err[-3000:]
    trajs = res["commands"]
    assert len(trajs) >= 10
    for tr in trajs:
        assert tr["joint_names"] == JOINTS
        assert np.allclose(tr["times"], (np.arange(len(tr["points"])) + 1) / 30.0, atol=1e-6)
    pts = np.array([tr["points"][0] for tr in trajs])
    assert np.all(np.abs(np.diff(pts, axis=0)) <= STEP + 1e-6)
