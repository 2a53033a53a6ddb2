"""ROS 2 messages through rosbags' CDR and the safety filter: round trips, malformed input rejected,
and safety properties under random commands (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_robot import messages as m
from real_robot.safety import SafetyConfig, SafetyFilter

JOINTS = [f"panda_joint{i}" for i in range(1, 8)]


def test_wire_names_follow_ros2_dds_mapping():
    assert m.dds_type_name("sensor_msgs/msg/JointState") == "sensor_msgs::msg::dds_::JointState_"
    assert m.dds_topic("/forward_position_controller/commands") == "rt/forward_position_controller/commands"


def test_round_trips_of_every_supported_type():
    rgb = np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    img = m.deserialize(m.serialize(m.image(rgb, 12.5), "sensor_msgs/msg/Image"), "sensor_msgs/msg/Image")
    np.testing.assert_array_equal(m.image_to_rgb(img, (24, 32)), rgb)
    assert m.stamp_seconds(img.header) == pytest.approx(12.5)
    js = m.deserialize(m.serialize(m.joint_state(JOINTS[::-1], np.arange(7.0), np.ones(7), 1.0),
                                   "sensor_msgs/msg/JointState"), "sensor_msgs/msg/JointState")
    q, qd = m.joints_in_order(js, JOINTS)
    np.testing.assert_array_equal(q, np.arange(7.0)[::-1])
    assert qd is not None and np.all(qd == 1)
    for msg, kind in [(m.string("pick up the cube"), "std_msgs/msg/String"), (m.boolean(True), "std_msgs/msg/Bool"),
                      (m.float64_array(np.arange(8.0)), "std_msgs/msg/Float64MultiArray"),
                      (m.joint_trajectory(JOINTS, np.zeros((3, 7)), 0.1, 2.0), "trajectory_msgs/msg/JointTrajectory"),
                      (m.twist_stamped([0.1, 0, 0], [0, 0, 0.2], 3.0), "geometry_msgs/msg/TwistStamped"),
                      (m.pose_stamped([0.3, 0, 0.2], [0, 0, 0, 1], 3.0), "geometry_msgs/msg/PoseStamped")]:
        data = m.serialize(msg, kind)
        assert m.serialize(m.deserialize(data, kind), kind) == data
    bgr = m.image(rgb[..., ::-1], 0.0)
    bgr.encoding = "bgr8"
    np.testing.assert_array_equal(m.image_to_rgb(bgr), rgb)


def test_bad_images_and_joint_states_are_rejected():
    img = m.image(np.zeros((8, 8, 3), np.uint8), 0.0)
    img.encoding = "mono16"
    with pytest.raises(m.MessageError, match="encoding 'mono16' is not supported"):
        m.image_to_rgb(img)
    img = m.image(np.zeros((8, 8, 3), np.uint8), 0.0)
    with pytest.raises(m.MessageError, match="expects 224x224"):
        m.image_to_rgb(img, (224, 224))
    img.height = 16
    with pytest.raises(m.MessageError, match="needs 384 bytes, got 192"):
        m.image_to_rgb(img)
    with pytest.raises(m.MessageError, match=r"lacks joints \['panda_joint7'\]"):
        m.joints_in_order(m.joint_state(JOINTS[:6], np.zeros(6), None, 0.0), JOINTS)
    bad = m.joint_state(JOINTS, np.array([0, 0, np.nan, 0, 0, 0, 0.0]), None, 0.0)
    with pytest.raises(m.MessageError, match="non-finite"):
        m.joints_in_order(bad, JOINTS)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["sensor_msgs/msg/JointState", "sensor_msgs/msg/Image", "std_msgs/msg/String"]))
def test_fuzzed_cdr_never_escapes_as_anything_but_message_error(data, kind):
    try:
        msg = m.deserialize(data, kind)
    except m.MessageError:
        return
    if kind == "sensor_msgs/msg/Image":  # decoded by luck: the conversion must still validate it
        try:
            m.image_to_rgb(msg)
        except m.MessageError:
            pass


def test_truncated_cdr_is_rejected():
    data = m.serialize(m.joint_state(JOINTS, np.zeros(7), None, 0.0), "sensor_msgs/msg/JointState")
    for cut in (4, len(data) // 2, len(data) - 3):
        with pytest.raises(m.MessageError):
            m.deserialize(data[:cut], "sensor_msgs/msg/JointState")


def _cfg(**kw) -> SafetyConfig:
    return SafetyConfig(position_lower=(-1.0,) * 7, position_upper=(1.0,) * 7, max_velocity=(0.9,) * 7,
                        max_delta=0.05, control_rate_hz=30.0, **kw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=7, max_size=7),
       st.lists(st.floats(-1, 1), min_size=7, max_size=7))
def test_every_sent_command_is_within_limits(target, measured):
    f = SafetyFilter(_cfg())
    d = f(np.array(target), np.array(measured), obs_age_s=0.01)
    assert np.all(np.isfinite(d.command))
    assert np.all(d.command >= -1) and np.all(d.command <= 1)
    assert np.all(np.abs(d.command - np.clip(measured, -1, 1)) <= 0.9 / 30 + 1e-9)
    if not np.all(np.isfinite(target)):
        assert d.held and d.interventions == ("non_finite_or_bad_shape",)


def test_watchdog_estop_policy_error_and_workspace_hold():
    f = SafetyFilter(_cfg(workspace_low=(-0.5, -0.5, 0.0), workspace_high=(0.5, 0.5, 0.8)),
                     fk=lambda q: np.array([q[0], q[1], 0.4]))
    q = np.zeros(7)
    ok = f(np.full(7, 0.01), q, 0.01)
    assert not ok.held and np.allclose(ok.command, 0.01)
    stale = f(np.full(7, 0.02), q, 0.5)
    assert stale.held and stale.interventions == ("stale_observation",) and np.allclose(stale.command, 0.01)
    f.estop(True)
    assert f(np.full(7, 0.02), q, 0.01).interventions == ("estop",)
    f.estop(False)  # a release message does not release the latch
    assert f(np.full(7, 0.02), q, 0.01).interventions == ("estop",)
    assert f.reset_estop(inputs_fresh=False)[0] is False and f.estopped
    assert f.reset_estop(inputs_fresh=True) == (True, "e-stop released") and not f.estopped
    assert f(None, q, 0.01).interventions == ("policy_error",)
    f.last, f.resync = np.array([0.49, 0, 0, 0, 0, 0, 0.0]), False
    out = f(np.array([0.6, 0, 0, 0, 0, 0, 0.0]), q, 0.01)  # FK x = 0.52 leaves the box
    assert out.held and "workspace" in out.interventions
    assert f.counts["stale_observation"] == 1 and f.counts["estop"] == 2 and f.counts["workspace"] == 1
    assert f.counts["estop_release_ignored"] == 1 and f.counts["estop_reset_refused"] == 1
    with pytest.raises(ValueError, match="same length"):
        SafetyConfig(position_lower=(0.0,), position_upper=(1.0, 2.0), max_velocity=(1.0,))


def test_transport_choice_and_errors():
    import importlib.util

    from real_robot.transport import make_transport
    from robo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="'zenoh' is unknown; choose one of auto, rclpy, cyclonedds, inprocess"):
        make_transport("zenoh")
    assert make_transport("inprocess").name == "inprocess"
    if importlib.util.find_spec("rclpy") is None:
        with pytest.raises(ConfigError, match="needs rclpy"):
            make_transport("rclpy")
        tr = make_transport("auto", domain_id=231)
        assert tr.name == "cyclonedds"
        tr.close()


def test_first_command_after_a_hold_or_release_starts_from_the_measured_position():
    """The arm moved 1 rad while held (pushed, or an e-stop released its brakes): neither the hold nor the
    first command after the release may jump back; each stays within one step limit of the measured position."""
    f = SafetyFilter(_cfg())
    step = 0.9 / 30
    q = np.zeros(7)
    for _ in range(5):
        f(np.full(7, 0.5), q, 0.01)
        q = f.last.copy()
    f.estop(True)
    moved = q - 1.0
    held = f(np.full(7, 0.5), moved, 0.01)
    assert held.held and np.all(np.abs(held.command - moved) <= step + 1e-9)
    assert f.reset_estop(inputs_fresh=True)[0]
    first = f(q, moved, 0.01)  # the policy still asks for the old position
    assert not first.held and np.all(np.abs(first.command - moved) <= step + 1e-9)
    second = f(q, moved, 0.01)  # from then on the reference is the last command again
    assert np.allclose(second.command, first.command + step)


def test_chunk_points_are_filtered_as_consecutive_steps():
    f = SafetyFilter(_cfg())
    step = 0.9 / 30
    targets = np.array([np.full(7, v) for v in (0.01, 0.5, 0.5, np.nan, 0.0)])
    ds = f.sequence(targets, np.zeros(7), 0.01)
    assert [d.held for d in ds] == [False, False, False, True]  # stops at the NaN point, which holds
    pts = np.stack([d.command for d in ds[:3]])
    assert np.allclose(pts[:, 0], [0.01, 0.01 + step, 0.01 + 2 * step])


@pytest.mark.parametrize("key,value", [("max_delta", float("nan")), ("max_delta", -0.1), ("stale_ms", float("inf")),
                                       ("stale_ms", float("nan")), ("control_rate_hz", 0.0)])
def test_unsafe_scalar_limits_are_refused(key, value):
    kw = {key: value} if key != "control_rate_hz" else {"control_rate_hz": value}
    with pytest.raises(ValueError, match=f"safety.{key} = .*finite number > 0"):
        SafetyConfig(position_lower=(-1.0,), position_upper=(1.0,), max_velocity=(1.0,), **kw)


@pytest.mark.parametrize("key,values", [("max_velocity", (-1.0,)), ("max_velocity", (float("nan"),)),
                                        ("position_lower", (float("nan"),)), ("position_upper", (float("inf"),))])
def test_unsafe_joint_limits_are_refused(key, values):
    kw = {"position_lower": (-1.0,), "position_upper": (1.0,), "max_velocity": (1.0,), key: values}
    with pytest.raises(ValueError, match=rf"safety.{key}\[0\]"):
        SafetyConfig(**kw)


def test_robot_yaml_with_nan_limits_fails_to_load_naming_the_key(tmp_path):
    import yaml

    from real_robot.config import load_robot
    from robo_rl.errors import ConfigError

    data = yaml.safe_load(open("configs/robots/panda_sim.yaml"))
    data["safety"]["max_delta"] = float("nan")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="safety.max_delta = nan"):
        load_robot(str(tmp_path / "r.yaml"))
