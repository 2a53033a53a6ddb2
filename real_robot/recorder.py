"""Record a deployed episode as a ROS 2 bag (mcap storage, rosbags' writer) and replay it into the
Observation contract.

Topics recorded: every camera (sensor_msgs/Image), ``/joint_states``, the instruction
(std_msgs/String), the state topic (std_msgs/Float64MultiArray) with ``state_source: topic``, the
commands actually sent, and ``/robo_rl/interventions`` (std_msgs/String with
JSON ``{"held": bool, "kinds": [...]}`` per control step). The bag opens in ROS 2 tools as is.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from real_robot import messages as m
from real_robot.config import RobotConfig

INTERVENTIONS = "/robo_rl/interventions"


def check_new_recording(path: str | Path) -> None:
    """One-line error unless ``path`` is a new directory in an existing, writable parent."""
    from robo_rl.errors import ConfigError

    p = Path(path)
    if p.exists():
        raise ConfigError(f"--record {p}: already exists; give a new directory for the rosbag2 recording")
    parent = p.absolute().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"--record {p}: the parent directory {parent} is missing or not writable")


class BagRecorder:
    """Thread-safe writer of CDR messages into ``path`` (a new rosbag2 directory)."""

    def __init__(self, path: str | Path, robot: RobotConfig) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        self.path = Path(path)
        if self.path.exists():
            raise FileExistsError(f"recording '{self.path}' already exists; choose a new path")
        self.robot = robot
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self._lock = threading.Lock()
        self._closed = False
        ts = m.typestore()
        topics = [(cam.topic, "sensor_msgs/msg/Image") for cam in robot.cameras] + [
            (robot.joint_states_topic, "sensor_msgs/msg/JointState"), (robot.instruction_topic, "std_msgs/msg/String"),
            (robot.command_topic, robot.command_type), (INTERVENTIONS, "std_msgs/msg/String")]
        if robot.state_source == "topic":
            topics.append((robot.state_topic, "std_msgs/msg/Float64MultiArray"))
        self._conns = {t: self._writer.add_connection(t, typ, typestore=ts) for t, typ in topics}

    def write(self, topic: str, cdr: bytes, t_ns: int) -> None:
        """Append one message; after ``close`` (a subscription callback still in flight at shutdown) a no-op."""
        with self._lock:
            if self._closed:
                return
            self._writer.write(self._conns[topic], int(t_ns), cdr)

    def intervention(self, held: bool, kinds: tuple[str, ...], t_ns: int) -> None:
        msg = m.string(json.dumps({"held": held, "kinds": list(kinds)}))
        self.write(INTERVENTIONS, m.serialize(msg, "std_msgs/msg/String"), t_ns)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._writer.close()


def replay(path: str | Path, robot: RobotConfig) -> Iterator[dict[str, Any]]:
    """Yield one Observation (B = 1, as the node builds it) per recorded joint state that has every
    camera (and, with ``state_source: topic``, a state vector) before it, plus the command sent after it
    (``command`` (command_dim,): the array's data, the trajectory point's positions or the twist's
    linear then angular velocity; or None). ``rgb`` is absent for a robot without cameras."""
    from rosbags.rosbag2 import Reader

    images: dict[str, np.ndarray] = {}
    instruction = robot.default_instruction
    pending: dict[str, Any] | None = None
    state: np.ndarray | None = None
    want_state = robot.state_source == "topic"
    cams = [c.topic for c in robot.cameras]
    with Reader(path) as reader:
        for conn, _t, raw in reader.messages():
            topic = conn.topic
            if topic in cams:
                cam = robot.cameras[cams.index(topic)]
                images[topic] = m.image_to_rgb(m.deserialize(raw, conn.msgtype), (cam.height, cam.width))
            elif topic == robot.instruction_topic:
                instruction = str(m.deserialize(raw, conn.msgtype).data)
            elif want_state and topic == robot.state_topic:
                state = np.asarray(m.deserialize(raw, conn.msgtype).data, dtype=np.float64)
            elif topic == robot.joint_states_topic and len(images) == len(cams) and (state is not None or not want_state):
                if pending is not None:
                    yield pending
                q, qd = m.joints_in_order(m.deserialize(raw, conn.msgtype), list(robot.joint_names))
                qd = qd if qd is not None else np.zeros_like(q)
                vec = state if want_state and state is not None else np.concatenate([q, qd])
                pending = {"state": vec[None].astype(np.float32), "instruction": [instruction], "command": None}
                if cams:
                    pending["rgb"] = np.stack([images[c] for c in cams])[None]
            elif topic == robot.command_topic and pending is not None and pending["command"] is None:
                pending["command"] = _command_vector(m.deserialize(raw, conn.msgtype))
    if pending is not None:
        yield pending


def _command_vector(msg: Any) -> np.ndarray:
    """The numbers of one recorded command message (Float64MultiArray, JointTrajectory, TwistStamped)."""
    if hasattr(msg, "data"):
        data = msg.data
    elif hasattr(msg, "points"):
        data = msg.points[0].positions
    else:
        tw = msg.twist
        data = [tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z]
    return np.asarray(data, dtype=np.float64)
