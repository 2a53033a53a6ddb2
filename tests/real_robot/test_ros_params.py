"""ROS parameters put over a robot config: numbers of either type, topic names, camera topics; wrong
types, counts or unsafe values are one-line ConfigErrors."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from real_robot.config import load_robot  # noqa: E402
from real_robot.ros_node import apply_parameters  # noqa: E402
from robo_rl.errors import ConfigError  # noqa: E402

ROBOT = load_robot("configs/robots/panda_sim.yaml")


def test_parameters_override_rate_topics_and_cameras():
    r = apply_parameters(ROBOT, {"control_rate_hz": 20, "command_topic": "/arm/commands",
                                 "camera_topics": ["/wrist/image"], "startup_timeout_s": 3})
    assert r.control_rate_hz == 20.0 and r.safety.control_rate_hz == 20.0  # the per-step limits follow
    assert r.command_topic == "/arm/commands" and r.cameras[0].topic == "/wrist/image"
    assert r.cameras[0].height == ROBOT.cameras[0].height and r.startup_timeout_s == 3.0


@pytest.mark.parametrize("params,match", [
    ({"control_rate_hz": "fast"}, "control_rate_hz = 'fast'; it must be a number"),
    ({"control_rate_hz": float("nan")}, "control_rate_hz"),
    ({"control_rate_hz": -5.0}, "control_rate_hz"),
    ({"command_topic": 3}, "command_topic = 3; it must be a topic name"),
    ({"camera_topics": ["/a", "/b"]}, "camera_topics has 2 topic"),
])
def test_bad_parameters_are_one_line_errors(params, match):
    with pytest.raises(ConfigError, match=match):
        apply_parameters(ROBOT, params)
