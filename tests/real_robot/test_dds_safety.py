"""Safety over real DDS, against a separate robot process written only with ``cyclonedds`` (its own
hand-declared ROS 2 IDL types; no project code). The robot process publishes joint states and a
128x128 rgb8 camera at 30 Hz, tracks the commands it receives, and goes through phases: normal
running, silence (the watchdog must hold), bad messages only (rejected, counted, never commands),
running again, then an e-stop (the motion must halt within one control period, measured at the robot: two periods, allowing one DDS transit). Loopback only,
random ROS domain. The policy asks for targets far outside the joint limits throughout, so every
command the robot receives must have been clamped and rate-limited."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytest.importorskip("cyclonedds")

from real_robot.config import load_robot  # noqa: E402
from robo_rl.contracts import PolicyOutput  # noqa: E402
from tests.real_robot.ros2_idl import IDL_TYPES, LOOPBACK  # noqa: E402

ROBOT_PROCESS = IDL_TYPES + r'''
domain, spec = int(sys.argv[1]), json.loads(sys.argv[2])
names, q = spec["names"], list(spec["q0"])
reliable = Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepLast(10), Policy.Durability.Volatile)
sensor = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(5), Policy.Durability.Volatile)
dp = DomainParticipant(domain)
js_w = DataWriter(dp, Topic(dp, "rt/joint_states", JointState), qos=reliable)
img_w = DataWriter(dp, Topic(dp, "rt/camera/color/image_raw", Image), qos=sensor)
estop_w = DataWriter(dp, Topic(dp, "rt/estop", Bool), qos=reliable)
received, lock = [], threading.Lock()

def on_command(reader):
    now = time.time()
    for s in reader.take(N=64):
        with lock:
            received.append((now, list(s.data)))
            q[:] = list(s.data)  # a robot that tracks its commands perfectly

reader = DataReader(dp, Topic(dp, "rt/forward_position_controller/commands", Float64MultiArray), qos=reliable,
                    listener=Listener(on_data_available=on_command))
pixels = bytes([spec["pixel"]]) * (128 * 128 * 3)

def stamp():
    now = time.time()
    return Header(Time(int(now), int((now % 1) * 1e9)), "base")

def good():
    with lock:
        pos = list(q)
    js_w.write(JointState(stamp(), names, pos, [0.0] * len(names), []))
    img_w.write(Image(stamp(), 128, 128, "rgb8", 0, 128 * 3, pixels))

def bad(i):
    with lock:
        pos = list(q)
    kind = i % 4
    if kind == 0:
        js_w.write(JointState(stamp(), names, [float("nan")] + pos[1:], [], []))
    elif kind == 1:
        js_w.write(JointState(stamp(), ["wrong_joint"] + names[1:], pos, [], []))
    elif kind == 2:
        img_w.write(Image(stamp(), 64, 64, "rgb8", 0, 64 * 3, bytes(64 * 64 * 3)))
    else:
        img_w.write(Image(stamp(), 128, 128, "16UC1", 0, 128 * 2, bytes(128 * 128 * 2)))

def run(seconds, send):
    end, i = time.time() + seconds, 0
    while time.time() < end:
        send(i)
        i += 1
        time.sleep(1 / 30)

events = {}
deadline = time.time() + 20
while not received and time.time() < deadline:  # discovery: until the first command arrives
    good()
    time.sleep(1 / 30)
events["first_command"] = time.time()
run(1.5, lambda i: good())
events["silence"] = time.time()
run(1.0, lambda i: None)
events["bad"] = time.time()
run(1.0, bad)
events["resume"] = time.time()
run(1.0, lambda i: good())
estop_w.write(Bool(True))
events["estop"] = time.time()
run(1.0, lambda i: good())
events["end"] = time.time()
with lock:
    print(json.dumps({"received": received, "events": events}))
'''


class OutOfRangePolicy:
    """Asks for joint targets 5 rad beyond every limit, switching side every 0.5 s."""

    def __init__(self, joints: int) -> None:
        self.joints = joints
        self.seen_rgb: list[np.ndarray] = []

    def act(self, obs, deterministic=False):
        self.seen_rgb.append(np.asarray(obs["rgb"]))
        sign = 1.0 if int(time.monotonic() * 2) % 2 else -1.0
        return PolicyOutput(actions=torch.full((1, self.joints), 5.0 * sign))


def _moving(cmds: list[list[float]], start: int) -> list[int]:
    """Indices i >= start (i > 0) whose command differs from command i-1."""
    return [i for i in range(max(1, start), len(cmds)) if not np.allclose(cmds[i], cmds[i - 1], atol=1e-12)]


@pytest.mark.timeout(120)
def test_watchdog_estop_limits_and_bad_messages_against_a_dds_robot_process(tmp_path, monkeypatch):
    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport

    robot = load_robot("configs/robots/panda_sim.yaml")
    domain = random.randint(10, 200)
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK)
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    lo, hi = np.array(robot.safety.position_lower), np.array(robot.safety.position_upper)
    policy = OutOfRangePolicy(len(robot.joint_names))
    transport = make_transport("cyclonedds", domain)
    node = PolicyNode(robot, policy, transport)
    node.start()
    script = tmp_path / "robot.py"
    script.write_text(ROBOT_PROCESS)
    spec = {"names": list(robot.joint_names), "q0": ((lo + hi) / 2).tolist(), "pixel": 77}
    try:
        proc = subprocess.run([sys.executable, str(script), str(domain), json.dumps(spec)], capture_output=True,
                              text=True, timeout=90, env={**os.environ})
    finally:
        node.stop()
        transport.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ev = out["events"]
    stamps = np.array([t for t, _ in out["received"]])
    cmds = [c for _, c in out["received"]]
    period = 1.0 / robot.control_rate_hz
    stale = robot.safety.stale_ms / 1000.0

    # the camera arrived intact through DDS: the policy saw the robot's pixels, in the Observation layout
    assert policy.seen_rgb and policy.seen_rgb[-1].shape == (1, 1, 128, 128, 3)
    assert (policy.seen_rgb[-1] == 77).all()

    # limits: every command the robot received is inside the joint limits and moved at most one step
    arr = np.array(cmds)
    assert len(arr) > 4 * robot.control_rate_hz, f"only {len(arr)} commands in ~5.5 s at 30 Hz"
    assert (arr >= lo - 1e-12).all() and (arr <= hi + 1e-12).all()
    assert (np.abs(np.diff(arr, axis=0)) <= node.safety.step_limit + 1e-9).all()
    assert node.safety.counts["position_limit"] > 0 and node.safety.counts["rate_limit"] > 0
    running = [i for i in range(len(cmds)) if ev["first_command"] + 0.2 < stamps[i] < ev["silence"]]
    assert len(_moving(cmds, running[0])) >= len(running) // 2  # while data flows, the arm moves

    # watchdog: once the data is older than stale_ms, every command is a hold (and holds keep coming)
    held = [i for i in range(len(cmds)) if ev["silence"] + stale + 2 * period < stamps[i] < ev["resume"]]
    assert len(held) > 30, f"{len(held)} commands while the robot was silent or sent only bad messages"
    assert not [i for i in _moving(cmds, held[0]) if i <= held[-1]], "the arm moved on stale data"
    assert node.safety.counts["stale_observation"] > 0

    # bad messages were rejected and counted, none produced a command (checked above: all holds)
    for kind in ("joint_states", "image"):
        assert node.rejected[kind] > 0, dict(node.rejected)

    # running again after the bad phase, then the e-stop halts motion within one control period (seen at the robot within two)
    assert [i for i in _moving(cmds, 1) if ev["resume"] < stamps[i] < ev["estop"]], "no motion after resuming"
    # stamps are the robot process's receive times: a command published just before the node saw the
    # e-stop can arrive up to one DDS transit later, which on a loaded 2-core machine has reached ~1 period
    late = [i for i in _moving(cmds, 1) if stamps[i] > ev["estop"] + 2 * period]
    assert not late, f"{len(late)} moving commands later than two control periods after the e-stop"
    assert sum(stamps > ev["estop"] + period) > 20 and node.safety.counts["estop"] > 0


def test_dds_discovery_shows_ros_type_names_and_catches_mismatches(monkeypatch):
    """Two DDS participants over loopback: our writers announce ROS 2 type names (what Fast DDS
    peers match on), and the node refuses to start against a peer using its topics with other types."""
    from real_robot import messages as m
    from real_robot.node import PolicyNode
    from real_robot.transport import make_transport
    from robo_rl.errors import ConfigError

    robot = load_robot("configs/robots/panda_sim.yaml")
    domain = random.randint(10, 200)
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK)
    ours, peer = make_transport("cyclonedds", domain), make_transport("cyclonedds", domain)
    try:
        node = PolicyNode(robot, OutOfRangePolicy(len(robot.joint_names)), ours)

        def seen(tr, topic, kind, want):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and want not in tr.endpoint_types(topic, kind):
                time.sleep(0.05)
            return tr.endpoint_types(topic, kind)

        assert seen(peer, robot.command_topic, "publisher", robot.command_type) == {robot.command_type}
        assert seen(peer, robot.joint_states_topic, "subscriber", "sensor_msgs/msg/JointState") == {"sensor_msgs/msg/JointState"}
        js = peer.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
        seen(ours, robot.joint_states_topic, "publisher", "sensor_msgs/msg/JointState")
        js.publish(m.serialize(m.joint_state(list(robot.joint_names), np.zeros(len(robot.joint_names)), None, 0.0),
                               "sensor_msgs/msg/JointState"))
        with pytest.raises(ConfigError, match=r"/camera/color/image_raw \(sensor_msgs/msg/Image; no publisher\)"):
            node.wait_ready(0.5)
        peer.subscribe(robot.command_topic, "trajectory_msgs/msg/JointTrajectory", lambda raw, t: None)
        seen(ours, robot.command_topic, "subscriber", "trajectory_msgs/msg/JointTrajectory")
        with pytest.raises(ConfigError, match="controller listens on /forward_position_controller/commands for "
                                              "trajectory_msgs/msg/JointTrajectory"):
            node.wait_ready(5.0)
        assert node.sent == 0
    finally:  # close in this thread: cyclonedds entities finalized elsewhere can crash the process
        ours.close()
        peer.close()
