"""Policy node input validation, chunk trajectories, throttled logs and diagnostics over the in-process
transport: malformed, wrong-length, duplicate and stale inputs never produce a command other than a
hold, are counted per reason and logged once per reason."""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from real_robot import messages as m
from real_robot.config import load_robot
from real_robot.node import PolicyNode
from real_robot.transport import make_transport
from robo_rl.contracts import PolicyOutput

ROBOT = load_robot("configs/robots/panda_sim.yaml")
NAMES = list(ROBOT.joint_names)
J = len(NAMES)


class ConstPolicy:
    def __init__(self, actions):
        self.actions = np.asarray(actions, np.float32)

    def act(self, obs, deterministic=False):
        return PolicyOutput(actions=torch.as_tensor(self.actions)[None])


def _node(robot=ROBOT, actions=None, state_dim=None):
    tr = make_transport("inprocess")
    node = PolicyNode(robot, ConstPolicy(np.zeros(J) if actions is None else actions), tr, state_dim=state_dim)
    sent = []
    tr.subscribe(robot.command_topic, robot.command_type, lambda raw, t: sent.append(m.deserialize(raw, robot.command_type)))
    diags = []
    tr.subscribe("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray",
                 lambda raw, t: diags.append(m.deserialize(raw, "diagnostic_msgs/msg/DiagnosticArray")))
    js = tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
    cam = tr.publisher(robot.cameras[0].topic, "sensor_msgs/msg/Image") if robot.cameras else None

    def joints(names=None, pos=None, vel=None, stamp=None):
        names = NAMES if names is None else names
        pos = np.zeros(len(names)) if pos is None else pos
        msg = m.joint_state(names, pos, vel, time.time() if stamp is None else stamp)
        js.publish(m.serialize(msg, "sensor_msgs/msg/JointState"))

    def image(stamp=None):
        if cam is not None:
            cam.publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), time.time() if stamp is None else stamp),
                                    "sensor_msgs/msg/Image"))

    return tr, node, sent, diags, joints, image


def test_duplicate_names_and_wrong_length_velocities_are_refused_at_the_subscription():
    tr, node, sent, _, joints, image = _node()
    joints(names=NAMES[:-1] + [NAMES[0]])  # duplicate joint, one missing
    joints(names=NAMES + [NAMES[2]], pos=np.zeros(J + 1))  # all present, one twice
    joints(vel=np.zeros(J - 2))
    assert node.rejected["joint_states"] == 3 and node.observation() is None
    image()
    assert node.control_tick() is None and not sent  # no valid joint state yet: nothing is sent
    joints(vel=np.zeros(J))
    assert node.observation() is not None


def test_state_vector_of_the_wrong_length_never_reaches_the_policy():
    robot = dataclasses.replace(ROBOT, state_source="topic", cameras=())
    tr, node, sent, _, joints, _ = _node(robot, state_dim=35)
    st = tr.publisher(robot.state_topic, "std_msgs/msg/Float64MultiArray")
    st.publish(m.serialize(m.float64_array(np.zeros(38)), "std_msgs/msg/Float64MultiArray"))
    st.publish(m.serialize(m.float64_array(np.full(35, np.inf)), "std_msgs/msg/Float64MultiArray"))
    joints()
    assert node.rejected["state"] == 2 and node.observation() is None
    st.publish(m.serialize(m.float64_array(np.zeros(35)), "std_msgs/msg/Float64MultiArray"))
    assert node.observation()[0]["state"].shape == (1, 35)


def test_header_stamps_decide_staleness_with_stale_by_header():
    robot = dataclasses.replace(ROBOT, stale_by="header")
    tr, node, sent, _, joints, image = _node(robot)
    hour_ago = time.time() - 3600
    joints(stamp=hour_ago)
    image(stamp=hour_ago)
    node.infer_once()
    d = node.control_tick()
    assert d.held and d.interventions == ("stale_observation",)  # arrived just now, stamped an hour ago
    joints(stamp=time.time() + 60)  # from the future: refused, counted
    assert node.rejected["joint_states"] == 1
    joints()
    image()
    node.infer_once()
    assert not node.control_tick().held
    # by arrival (the default) the hour-old stamps count as fresh
    tr2, node2, _, _, joints2, image2 = _node()
    joints2(stamp=hour_ago)
    image2(stamp=hour_ago)
    node2.infer_once()
    assert not node2.control_tick().held


def test_a_flood_of_bad_messages_logs_once_per_reason(caplog):
    tr, node, sent, _, joints, image = _node()
    js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
    with caplog.at_level(logging.WARNING, logger="real_robot"):
        for _ in range(200):
            js.publish(b"\x00\x01\x00\x00garbage")
            joints(names=NAMES + [NAMES[0]], pos=np.zeros(J + 1))
    assert node.rejected["joint_states"] == 400 and not sent
    lines = [r for r in caplog.records if "rejected joint_states" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


def test_a_chunk_goes_out_as_one_trajectory_whose_points_pass_the_filter():
    robot = dataclasses.replace(ROBOT, command_type="trajectory_msgs/msg/JointTrajectory")
    lo, hi = np.array(robot.safety.position_lower), np.array(robot.safety.position_upper)
    mid = (lo + hi) / 2
    chunk = np.stack([mid + 0.02 * (i + 1) for i in range(8)])
    chunk[5, 0] = 10.0  # outside the joint limit
    tr, node, sent, _, joints, image = _node(robot, actions=chunk)
    joints(pos=mid)
    image()
    assert node.infer_once()
    node.control_tick()
    assert len(sent) == 1
    traj = sent[0]
    assert list(traj.joint_names) == NAMES and len(traj.points) == 8
    times = [p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec for p in traj.points]
    assert np.allclose(times, np.arange(1, 9) / robot.control_rate_hz)
    pts = np.array([p.positions for p in traj.points])
    step = np.minimum(robot.safety.max_delta, np.array(robot.safety.max_velocity) / robot.control_rate_hz)
    assert np.all(pts >= lo - 1e-9) and np.all(pts <= hi + 1e-9)
    assert np.all(np.abs(np.diff(np.vstack([mid, pts]), axis=0)) <= step + 1e-9)
    assert node.control_tick() is None and len(sent) == 1  # the trajectory runs; nothing new is due
    node.safety.estop(True)
    d = node.control_tick()  # the e-stop replaces the running trajectory with a one-point hold at once
    assert d.held and len(sent) == 2 and len(sent[1].points) == 1


def test_diagnostics_report_counters_ages_and_the_estop():
    tr, node, sent, diags, joints, image = _node()
    joints()
    image()
    node.infer_once()
    node.control_tick()
    node.safety.estop(True)
    node.control_tick()
    node.publish_diagnostics()
    st = diags[-1].status[0]
    values = {kv.key: kv.value for kv in st.values}
    assert st.level == 2 and "e-stop latched" in st.message and st.hardware_id == ROBOT.name
    assert values["estop_latched"] == "True" and values["safety/estop"] == "1" and values["commands_sent"] == "2"
    assert float(values["age_ms/joint_states"]) < 1000 and f"age_ms/{ROBOT.cameras[0].topic}" in values
