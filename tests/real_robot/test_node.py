"""Policy node logic over the in-process transport (CDR bytes both ways), with a stub policy: the
commands it publishes respect the limits, hold on stale data, e-stop and policy failure, and bad
messages are counted and dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from real_robot import messages as m
from real_robot.config import load_robot
from real_robot.node import PolicyNode
from real_robot.transport import make_transport
from robo_rl.contracts import PolicyOutput
from robo_rl.errors import ConfigError

ROBOT = load_robot("configs/robots/panda_sim.yaml")
J = len(ROBOT.joint_names)


class StubPolicy:
    def __init__(self, action):
        self.action = action
        self.seen = []

    def act(self, obs, deterministic=False):
        self.seen.append(obs)
        if isinstance(self.action, Exception):
            raise self.action
        return PolicyOutput(actions=torch.as_tensor(self.action, dtype=torch.float32)[None])


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _setup(action):
    tr = make_transport("inprocess")
    clock = Clock()
    policy = StubPolicy(action)
    node = PolicyNode(ROBOT, policy, tr, clock=clock)
    sent = []
    tr.subscribe(ROBOT.command_topic, ROBOT.command_type,
                 lambda raw, t: sent.append(np.asarray(m.deserialize(raw, ROBOT.command_type).data)))
    js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
    cam = tr.publisher(ROBOT.cameras[0].topic, "sensor_msgs/msg/Image")

    def feed(q=None):
        q = np.zeros(J) if q is None else q
        js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), q, np.zeros(J), 0.0), "sensor_msgs/msg/JointState"))
        cam.publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))

    return tr, clock, policy, node, sent, feed


def test_observation_contract_and_clamped_commands():
    tr, clock, policy, node, sent, feed = _setup(np.full(J, 5.0))
    assert node.control_tick() is None and not sent  # nothing before data arrives
    lo, hi = np.array(ROBOT.safety.position_lower), np.array(ROBOT.safety.position_upper)
    q0 = (lo + hi) / 2
    feed(q0)
    assert node.infer_once()
    obs = policy.seen[-1]
    assert obs["rgb"].shape == (1, 1, 128, 128, 3) and obs["state"].shape == (1, 2 * J)
    assert obs["instruction"] == [ROBOT.default_instruction]
    d = node.control_tick()
    assert d is not None and not d.held and set(d.interventions) == {"position_limit", "rate_limit"}
    step = np.minimum(ROBOT.safety.max_delta, np.array(ROBOT.safety.max_velocity) / ROBOT.safety.control_rate_hz)
    np.testing.assert_allclose(sent[-1], q0 + np.clip(hi - q0, -step, step))
    tr.publisher(ROBOT.instruction_topic, "std_msgs/msg/String").publish(m.serialize(m.string("open the drawer"), "std_msgs/msg/String"))
    node.infer_once()
    assert policy.seen[-1]["instruction"] == ["open the drawer"]


def test_stale_data_estop_and_policy_failures_hold():
    tr, clock, policy, node, sent, feed = _setup(np.full(J, 0.01))
    feed()
    node.infer_once()
    first = node.control_tick()
    assert not first.held
    clock.t += 0.5  # no new observations for 500 ms > stale_ms
    node.infer_once()
    d = node.control_tick()
    assert d.held and d.interventions == ("stale_observation",) and np.array_equal(sent[-1], first.command)
    feed()
    tr.publisher(ROBOT.estop_topic, "std_msgs/msg/Bool").publish(m.serialize(m.boolean(True), "std_msgs/msg/Bool"))
    node.infer_once()
    assert node.control_tick().interventions == ("estop",)  # the very next control period
    tr.publisher(ROBOT.estop_topic, "std_msgs/msg/Bool").publish(m.serialize(m.boolean(False), "std_msgs/msg/Bool"))
    node.infer_once()
    assert node.control_tick().interventions == ("estop",)  # a False message does not release the latch
    clock.t += 1.0  # inputs now 1 s old (stale_ms 200): the reset is refused
    assert node.reset_estop()[0] is False and node.safety.estopped
    feed()
    assert node.reset_estop() == (True, "e-stop released")
    policy.action = np.full(J, np.nan)
    node.infer_once()
    assert node.control_tick().interventions == ("non_finite_or_bad_shape",)
    policy.action = RuntimeError("CUDA out of memory")
    assert not node.infer_once()
    assert node.control_tick().held and node.rejected["policy_error"] == 1
    assert all(np.all(np.isfinite(c)) for c in sent)


def test_bad_messages_are_counted_and_dropped():
    tr, clock, policy, node, sent, feed = _setup(np.zeros(J))
    js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
    js.publish(b"\x00\x01\x00\x00garbage")
    js.publish(m.serialize(m.joint_state(["other_joint"], np.zeros(1), None, 0.0), "sensor_msgs/msg/JointState"))
    cam = tr.publisher(ROBOT.cameras[0].topic, "sensor_msgs/msg/Image")
    cam.publish(m.serialize(m.image(np.zeros((64, 64, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
    assert node.rejected["joint_states"] == 2 and node.rejected["image"] == 1
    assert node.observation() is None and node.control_tick() is None and not sent
    feed()
    assert node.observation() is not None


def test_unknown_robot_config_key_is_one_line(tmp_path):
    from robo_rl.errors import ConfigError

    bad = tmp_path / "r.yaml"
    bad.write_text(open("configs/robots/panda_sim.yaml").read() + "\nmax_speed: 3\n")
    with pytest.raises(ConfigError, match="max_speed"):
        load_robot(str(bad))


def test_deploy_rejects_a_policy_that_does_not_fit_the_robot():
    from real_robot.deploy import check_fit
    from robo_rl.errors import ConfigError

    check_fit(ROBOT, {"rgb": [1, 128, 128, 3], "state": [2 * J]}, [J])
    with pytest.raises(ConfigError, match="outputs 7-D actions but robot 'panda_sim' has 8 joints"):
        check_fit(ROBOT, {"state": [2 * J]}, [7])
    with pytest.raises(ConfigError, match="trained on a 29-D state"):
        check_fit(ROBOT, {"state": [29]}, [J])
    with pytest.raises(ConfigError, match="is 128x128, the policy was trained on 224x224"):
        check_fit(ROBOT, {"rgb": [1, 224, 224, 3]}, [J])


def test_episode_recorded_as_mcap_bag_replays_into_observations(tmp_path):
    from real_robot.recorder import BagRecorder, replay

    tr = make_transport("inprocess")
    rec = BagRecorder(tmp_path / "episode", ROBOT)
    node = PolicyNode(ROBOT, StubPolicy(np.full(J, 5.0)), tr, recorder=rec)
    js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
    cam = tr.publisher(ROBOT.cameras[0].topic, "sensor_msgs/msg/Image")
    rgbs = [np.full((128, 128, 3), k, np.uint8) for k in range(3)]
    for k in range(3):
        cam.publish(m.serialize(m.image(rgbs[k], float(k)), "sensor_msgs/msg/Image"))
        js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), np.full(J, 0.01 * k), None, float(k)),
                               "sensor_msgs/msg/JointState"))
        node.infer_once()
        node.control_tick()
    rec.close()
    assert list((tmp_path / "episode").glob("*.mcap"))
    steps = list(replay(tmp_path / "episode", ROBOT))
    assert len(steps) == 3
    for k, step in enumerate(steps):
        assert step["rgb"].shape == (1, 1, 128, 128, 3) and int(step["rgb"][0, 0, 0, 0, 0]) == k
        np.testing.assert_allclose(step["state"][0, :J], 0.01 * k, atol=1e-6)
        assert step["command"] is not None and np.all(step["command"] <= np.array(ROBOT.safety.position_upper) + 1e-9)
    with pytest.raises(FileExistsError):
        BagRecorder(tmp_path / "episode", ROBOT)


TOPICS = {"joints": (ROBOT.joint_states_topic, "sensor_msgs/msg/JointState"),
          "image": (ROBOT.cameras[0].topic, "sensor_msgs/msg/Image"),
          "instruction": (ROBOT.instruction_topic, "std_msgs/msg/String"),
          "estop": (ROBOT.estop_topic, "std_msgs/msg/Bool")}


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(TOPICS)), st.binary(max_size=300))
def test_fuzzed_messages_never_become_commands_or_crash_the_node(topic, data):
    """Every other input is valid; the fuzzed one is bytes. A rejected joint state or image leaves the
    observation incomplete (no command); otherwise every command sent is finite and within limits."""
    tr = make_transport("inprocess")
    node = PolicyNode(ROBOT, StubPolicy(np.full(J, 0.01)), tr)
    sent = []
    tr.subscribe(ROBOT.command_topic, ROBOT.command_type,
                 lambda raw, t: sent.append(np.asarray(m.deserialize(raw, ROBOT.command_type).data)))
    if topic != "joints":
        tr.publisher(*TOPICS["joints"]).publish(
            m.serialize(m.joint_state(list(ROBOT.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    if topic != "image":
        tr.publisher(*TOPICS["image"]).publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), 0.0),
                                                           "sensor_msgs/msg/Image"))
    tr.publisher(*TOPICS[topic]).publish(data)
    node.infer_once()
    node.control_tick()
    kind = {"joints": "joint_states"}.get(topic, topic)
    if topic in ("joints", "image") and node.rejected[kind]:
        assert not sent and node.observation() is None
    else:
        assert len(sent) == 1  # the node kept serving the valid inputs
        lo, hi = np.array(ROBOT.safety.position_lower), np.array(ROBOT.safety.position_upper)
        assert np.all(np.isfinite(sent[0])) and np.all(sent[0] >= lo) and np.all(sent[0] <= hi)
    if topic == "estop" and node.rejected["estop"]:  # an unreadable e-stop message latches the stop
        assert node.safety.estopped and node.safety.counts["estop"] == 1


def test_startup_names_type_mismatches_and_missing_inputs_before_any_command():
    from robo_rl.errors import ConfigError

    tr = make_transport("inprocess")
    node = PolicyNode(ROBOT, StubPolicy(np.zeros(J)), tr)
    sent = []
    tr.subscribe(ROBOT.command_topic, ROBOT.command_type, lambda raw, t: sent.append(raw))
    js = tr.publisher(ROBOT.joint_states_topic, "sensor_msgs/msg/JointState")
    js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    with pytest.raises(ConfigError, match=r"nothing valid within 0.1 s on /camera/color/image_raw \(sensor_msgs/msg/Image; "
                                          r"no publisher\); check the drivers"):
        node.wait_ready(0.1)
    tr.publisher(ROBOT.cameras[0].topic, "sensor_msgs/msg/Image").publish(
        m.serialize(m.image(np.zeros((64, 64, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
    with pytest.raises(ConfigError, match=r"publishers seen but no valid message\); rejected so far: \{'image': 1\}"):
        node.wait_ready(0.1)
    tr.publisher(ROBOT.estop_topic, "std_msgs/msg/String")
    with pytest.raises(ConfigError, match="topic /estop is published as std_msgs/msg/String; robot config 'panda_sim' "
                                          "subscribes to it as std_msgs/msg/Bool"):
        node.wait_ready(5.0)
    assert not sent and node.sent == 0


def test_twist_commands_are_bounded_and_hold_is_a_stop():
    robot = load_robot("configs/robots/panda_servo_twist.yaml")
    tr = make_transport("inprocess")
    clock = Clock()
    node = PolicyNode(robot, StubPolicy(np.array([1.0, -1.0, 0.05, 0.0, 0.0, 9.0])), tr, clock=clock)
    sent = []
    tr.subscribe(robot.command_topic, robot.command_type,
                 lambda raw, t: sent.append(m.deserialize(raw, robot.command_type)))
    js = tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
    cam = tr.publisher(robot.cameras[0].topic, "sensor_msgs/msg/Image")
    js.publish(m.serialize(m.joint_state(list(robot.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    cam.publish(m.serialize(m.image(np.zeros((224, 224, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
    step = np.minimum(robot.safety.max_delta, np.array(robot.safety.max_velocity) / robot.control_rate_hz)
    twists = []
    for _ in range(8):
        node.infer_once()
        node.control_tick()
        tw = sent[-1].twist
        twists.append([tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z])
    assert sent[-1].header.frame_id == "panda_link0"
    t = np.array(twists)
    np.testing.assert_allclose(t[0], np.clip([1.0, -1.0, 0.05, 0.0, 0.0, 9.0], -step, step))  # ramped from rest
    np.testing.assert_allclose(t[-1], [0.2, -0.2, 0.05, 0.0, 0.0, 0.6])  # then clamped to the limits
    assert (np.abs(np.diff(t, axis=0)) <= step + 1e-12).all()
    clock.t += 1.0  # stale data: the hold is a stop, not the last twist
    d = node.control_tick()
    assert d.held and np.array_equal(d.command, np.zeros(6))
    with pytest.raises(ConfigError, match="takes 6-D end-effector twists"):
        from real_robot.deploy import check_fit

        check_fit(robot, {"rgb": [1, 224, 224, 3]}, [J])


def test_twist_command_type_needs_the_twist_action_mode(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(open("configs/robots/panda_servo_twist.yaml").read().replace("action_mode: ee_twist", "action_mode: absolute_joint"))
    with pytest.raises(ConfigError, match="TwistStamped commands go with action_mode ee_twist"):
        load_robot(str(bad))


def _robot(**changes):
    import dataclasses

    return dataclasses.replace(ROBOT, **changes)


def test_wrong_length_actions_hold_and_the_control_thread_survives_errors():

    robot = _robot(action_mode="delta_joint")
    for bad in (np.full(1, 0.03), np.full(J - 1, 0.03), np.zeros((2, 3, J))):
        tr = make_transport("inprocess")
        node = PolicyNode(robot, StubPolicy(bad), tr, clock=Clock())
        tr.publisher(*TOPICS["joints"]).publish(
            m.serialize(m.joint_state(list(ROBOT.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
        tr.publisher(*TOPICS["image"]).publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), 0.0),
                                                           "sensor_msgs/msg/Image"))
        assert not node.infer_once() and node.rejected["policy_error"] == 1
        d = node.control_tick()  # a length-1 delta would broadcast onto every joint: it must be a hold instead
        assert d.held and np.array_equal(d.command, np.clip(np.zeros(J), ROBOT.safety.position_lower,
                                                            ROBOT.safety.position_upper))
    # a failing recorder (full disk) is counted and control goes on; any other exception inside a tick
    # becomes a counted hold, not a dead control thread

    class BrokenRecorder:
        def write(self, *a):
            raise OSError("No space left on device")

        def intervention(self, *a):
            raise OSError("No space left on device")

    node.recorder = BrokenRecorder()
    node.policy = StubPolicy(np.full(J, 0.01))
    node.infer_once()
    sent = node.sent
    d = node.safe_tick()
    assert d is not None and not d.held and node.sent == sent + 1 and node.rejected["record_error"] >= 1

    def broken_tick():
        raise RuntimeError("bug in a tick")

    node.control_tick = broken_tick
    d = node.safe_tick()
    assert d is not None and d.held and d.interventions == ("control_error",) and node.rejected["control_error"] == 1
    assert node.sent == sent + 2


def test_passthrough_stop_sends_the_zero_command():
    robot = load_robot("configs/robots/panda_sim_delta.yaml")
    tr = make_transport("inprocess")
    node = PolicyNode(robot, StubPolicy(np.full(J, 0.7)), tr, clock=Clock())
    sent = []
    tr.subscribe(robot.command_topic, robot.command_type,
                 lambda raw, t: sent.append(np.asarray(m.deserialize(raw, robot.command_type).data)))
    js = tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
    js.publish(m.serialize(m.joint_state(list(robot.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    if robot.state_source == "topic":
        tr.publisher(robot.state_topic, "std_msgs/msg/Float64MultiArray").publish(
            m.serialize(m.float64_array(np.zeros(2 * J)), "std_msgs/msg/Float64MultiArray"))
    for cam in robot.cameras:
        tr.publisher(cam.topic, "sensor_msgs/msg/Image").publish(
            m.serialize(m.image(np.zeros((cam.height, cam.width, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
    node.infer_once()
    assert not node.control_tick().held and np.any(sent[-1] != 0)  # a raw (velocity-like) action went out
    node.stop()
    assert np.array_equal(sent[-1], np.zeros(J))  # stop: the zero action, not the last one re-sent


def test_control_loop_skips_missed_ticks_instead_of_bursting():
    """A 0.3 s stall in one publish (GC pause, slow middleware) at 30 Hz: the ticks it missed are
    dropped, so no two commands go out closer than a fraction of the period."""
    import time

    tr = make_transport("inprocess")
    node = PolicyNode(ROBOT, StubPolicy(np.full(J, 2.0)), tr)
    stamps = []

    def on_cmd(raw, t):
        stamps.append(time.monotonic())
        if len(stamps) == 3:
            time.sleep(0.3)

    tr.subscribe(ROBOT.command_topic, ROBOT.command_type, on_cmd)
    js = tr.publisher(*TOPICS["joints"])
    cam = tr.publisher(*TOPICS["image"])
    node.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.8:
            js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), np.zeros(J), None, 0.0),
                                   "sensor_msgs/msg/JointState"))
            cam.publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
            time.sleep(0.01)
    finally:
        node.stop()
    gaps = np.diff(stamps[:-1])  # the last one is stop()'s hold
    assert node.missed_ticks >= 5 and len(stamps) >= 10
    assert gaps.min() > 0.3 / ROBOT.control_rate_hz, gaps  # a burst would send the missed ticks ~0 s apart


def test_reactive_mode_runs_an_action_chunk_open_loop_in_order():
    chunk = np.linspace(0.0, 0.01, 60)[:, None] * np.ones(J)  # 60 steps: longer than any old queue bound
    tr = make_transport("inprocess")
    node = PolicyNode(ROBOT, StubPolicy(chunk), tr, reactive=True)
    sent = []
    tr.subscribe(ROBOT.command_topic, ROBOT.command_type,
                 lambda raw, t: sent.append(np.asarray(m.deserialize(raw, ROBOT.command_type).data)))
    tr.publisher(*TOPICS["image"]).publish(m.serialize(m.image(np.zeros((128, 128, 3), np.uint8), 0.0),
                                                       "sensor_msgs/msg/Image"))
    js = tr.publisher(*TOPICS["joints"])
    for _ in range(61):
        js.publish(m.serialize(m.joint_state(list(ROBOT.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    assert len(node.policy.seen) == 2  # one inference per chunk, the second after all 60 steps ran
    lo, hi = np.array(ROBOT.safety.position_lower), np.array(ROBOT.safety.position_upper)
    np.testing.assert_allclose(np.array(sent[:60]), np.clip(chunk, lo, hi))  # every step, in order
    assert len(sent) == 61


def test_state_topic_robot_records_and_replays(tmp_path):
    from real_robot.recorder import BagRecorder, replay

    robot = load_robot("configs/robots/panda_sim_state.yaml")
    assert robot.state_source == "topic"
    tr = make_transport("inprocess")
    rec = BagRecorder(tmp_path / "episode", robot)
    node = PolicyNode(robot, StubPolicy(np.full(robot.command_dim, 0.01)), tr, recorder=rec)
    js = tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState")
    state = tr.publisher(robot.state_topic, "std_msgs/msg/Float64MultiArray")
    for k in range(3):
        state.publish(m.serialize(m.float64_array(np.full(5, float(k))), "std_msgs/msg/Float64MultiArray"))
        for cam in robot.cameras:
            tr.publisher(cam.topic, "sensor_msgs/msg/Image").publish(
                m.serialize(m.image(np.zeros((cam.height, cam.width, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
        js.publish(m.serialize(m.joint_state(list(robot.joint_names), np.zeros(len(robot.joint_names)), None, 0.0),
                               "sensor_msgs/msg/JointState"))
        assert node.infer_once()
        node.control_tick()
    rec.close()
    assert node.sent == 3 and not node.rejected
    steps = list(replay(tmp_path / "episode", robot))
    assert [float(s["state"][0, 0]) for s in steps] == [0.0, 1.0, 2.0]
    assert all(s["command"] is not None for s in steps) and ("rgb" in steps[0]) == bool(robot.cameras)


def test_twist_recording_replays_commands(tmp_path):
    from real_robot.recorder import BagRecorder, replay

    robot = load_robot("configs/robots/panda_servo_twist.yaml")
    tr = make_transport("inprocess")
    rec = BagRecorder(tmp_path / "tw", robot)
    node = PolicyNode(robot, StubPolicy(np.array([0.01, 0, 0, 0, 0, 0.02])), tr, recorder=rec, clock=Clock())
    cam = robot.cameras[0]
    tr.publisher(cam.topic, "sensor_msgs/msg/Image").publish(
        m.serialize(m.image(np.zeros((cam.height, cam.width, 3), np.uint8), 0.0), "sensor_msgs/msg/Image"))
    tr.publisher(robot.joint_states_topic, "sensor_msgs/msg/JointState").publish(
        m.serialize(m.joint_state(list(robot.joint_names), np.zeros(J), None, 0.0), "sensor_msgs/msg/JointState"))
    node.infer_once()
    node.control_tick()
    rec.close()
    (step,) = list(replay(tmp_path / "tw", robot))
    np.testing.assert_allclose(step["command"], [0.01, 0, 0, 0, 0, 0.02])


def test_robot_config_rates_and_workspace_are_checked(tmp_path):
    import dataclasses

    with pytest.raises(ConfigError, match="control_rate_hz is 200 but safety.control_rate_hz is 30"):
        _robot(control_rate_hz=200.0)
    box = dataclasses.replace(ROBOT.safety, workspace_low=(0.2, -0.3, 0.05), workspace_high=(0.7, 0.3, 0.6))
    with pytest.raises(ConfigError, match="workspace box needs 'urdf' and 'ee_link'"):
        _robot(safety=box)
    with pytest.raises(ConfigError, match="is not a readable URDF file"):
        _robot(safety=box, urdf=str(tmp_path / "none.urdf"), ee_link="tcp").forward_kinematics()
