"""ROS 2 messages as CDR bytes, through ``rosbags``' typestore of the standard definitions (no ROS
install needed), plus conversions between messages and the Observation contract's arrays.

Wire names follow ROS 2's DDS mapping: topic ``rt/<name>``, type ``<pkg>::msg::dds_::<Name>_``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

SUPPORTED = (
    "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState", "std_msgs/msg/String", "std_msgs/msg/Bool",
    "std_msgs/msg/Float64MultiArray", "trajectory_msgs/msg/JointTrajectory", "geometry_msgs/msg/TwistStamped",
    "geometry_msgs/msg/PoseStamped", "diagnostic_msgs/msg/DiagnosticArray",
)
# sensor_msgs/Image encodings we turn into (H, W, 3) uint8 RGB.
IMAGE_ENCODINGS = {"rgb8": (3, False), "bgr8": (3, True), "rgba8": (4, False), "bgra8": (4, True)}


class MessageError(ValueError):
    """A message that cannot be decoded or does not fit what the node expects."""


@functools.cache
def typestore() -> Any:
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE)


def dds_type_name(msgtype: str) -> str:
    """``sensor_msgs/msg/Image`` -> ``sensor_msgs::msg::dds_::Image_`` (ROS 2's DDS type name)."""
    pkg, kind, name = msgtype.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def ros_type_name(dds_name: str) -> str:
    """``sensor_msgs::msg::dds_::Image_`` -> ``sensor_msgs/msg/Image`` (other names are returned as is)."""
    parts = dds_name.split("::")
    if len(parts) == 4 and parts[2] == "dds_" and parts[3].endswith("_"):
        return f"{parts[0]}/{parts[1]}/{parts[3][:-1]}"
    return dds_name


def dds_topic(topic: str) -> str:
    """``/joint_states`` -> ``rt/joint_states``."""
    return "rt/" + topic.lstrip("/")


def serialize(msg: Any, msgtype: str) -> bytes:
    return bytes(typestore().serialize_cdr(msg, msgtype))


def deserialize(data: bytes, msgtype: str) -> Any:
    """CDR bytes -> message; anything malformed (truncated, wrong type) is a ``MessageError``."""
    try:
        return typestore().deserialize_cdr(bytes(data), msgtype)
    except Exception as err:  # rosbags raises struct/index/value errors on bad bytes
        raise MessageError(f"cannot decode {msgtype} ({type(err).__name__}: {err})") from None


def _cls(msgtype: str) -> Any:
    return typestore().types[msgtype]


def stamp(t: float) -> Any:
    sec = int(t)
    return _cls("builtin_interfaces/msg/Time")(sec=sec, nanosec=int(round((t - sec) * 1e9)) % 1_000_000_000)


def header(t: float, frame_id: str = "") -> Any:
    return _cls("std_msgs/msg/Header")(stamp=stamp(t), frame_id=frame_id)


def stamp_seconds(h: Any) -> float:
    return float(h.stamp.sec) + float(h.stamp.nanosec) * 1e-9


# --- constructors -------------------------------------------------------------------------------------

def image(rgb: np.ndarray, t: float, frame_id: str = "camera") -> Any:
    """(H, W, 3) uint8 -> sensor_msgs/Image (rgb8)."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w = rgb.shape[:2]
    return _cls("sensor_msgs/msg/Image")(header=header(t, frame_id), height=h, width=w, encoding="rgb8",
                                         is_bigendian=0, step=w * 3, data=rgb.reshape(-1))


def joint_state(names: list[str], position: np.ndarray, velocity: np.ndarray | None, t: float) -> Any:
    pos = np.asarray(position, dtype=np.float64)
    vel = np.asarray(velocity if velocity is not None else [], dtype=np.float64)
    return _cls("sensor_msgs/msg/JointState")(header=header(t), name=list(names), position=pos, velocity=vel,
                                              effort=np.zeros(0, np.float64))


def string(text: str) -> Any:
    return _cls("std_msgs/msg/String")(data=text)


def boolean(value: bool) -> Any:
    return _cls("std_msgs/msg/Bool")(data=bool(value))


def float64_array(values: np.ndarray) -> Any:
    layout = _cls("std_msgs/msg/MultiArrayLayout")(dim=[], data_offset=0)
    return _cls("std_msgs/msg/Float64MultiArray")(layout=layout, data=np.asarray(values, dtype=np.float64))


def joint_trajectory(names: list[str], positions: np.ndarray, dt: float, t: float) -> Any:
    """(T, J) positions, one point every ``dt`` seconds."""
    point_cls = _cls("trajectory_msgs/msg/JointTrajectoryPoint")
    dur = _cls("builtin_interfaces/msg/Duration")
    pts = []
    for i, q in enumerate(np.atleast_2d(positions)):
        s = (i + 1) * dt
        pts.append(point_cls(positions=np.asarray(q, np.float64), velocities=np.zeros(0), accelerations=np.zeros(0),
                             effort=np.zeros(0), time_from_start=dur(sec=int(s), nanosec=int(round((s - int(s)) * 1e9)))))
    return _cls("trajectory_msgs/msg/JointTrajectory")(header=header(t), joint_names=list(names), points=pts)


def twist_stamped(linear: np.ndarray, angular: np.ndarray, t: float, frame_id: str = "base_link") -> Any:
    v3 = _cls("geometry_msgs/msg/Vector3")
    twist = _cls("geometry_msgs/msg/Twist")(linear=v3(*map(float, linear)), angular=v3(*map(float, angular)))
    return _cls("geometry_msgs/msg/TwistStamped")(header=header(t, frame_id), twist=twist)


def pose_stamped(position: np.ndarray, quat_xyzw: np.ndarray, t: float, frame_id: str = "base_link") -> Any:
    p = _cls("geometry_msgs/msg/Point")(*map(float, position))
    q = _cls("geometry_msgs/msg/Quaternion")(*map(float, quat_xyzw))
    return _cls("geometry_msgs/msg/PoseStamped")(header=header(t, frame_id), pose=_cls("geometry_msgs/msg/Pose")(p, q))


# --- to the Observation contract ------------------------------------------------------------------------

def image_to_rgb(msg: Any, expect_hw: tuple[int, int] | None = None) -> np.ndarray:
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB; unknown encodings, short buffers or a size other
    than ``expect_hw`` raise ``MessageError``."""
    enc = str(msg.encoding).lower()
    if enc not in IMAGE_ENCODINGS:
        raise MessageError(f"image encoding {msg.encoding!r} is not supported; use one of {', '.join(IMAGE_ENCODINGS)}")
    ch, bgr = IMAGE_ENCODINGS[enc]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    data = np.asarray(msg.data, dtype=np.uint8)
    if h <= 0 or w <= 0 or step < w * ch or data.size < step * h:
        raise MessageError(f"image {w}x{h} {enc} with step {step} needs {step * h} bytes, got {data.size}")
    if expect_hw is not None and (h, w) != tuple(expect_hw):
        raise MessageError(f"image is {h}x{w}, the robot config expects {expect_hw[0]}x{expect_hw[1]}")
    img = data[: step * h].reshape(h, step)[:, : w * ch].reshape(h, w, ch)[..., :3]
    return np.ascontiguousarray(img[..., ::-1] if bgr else img)


def joints_in_order(msg: Any, names: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """sensor_msgs/JointState -> positions (J,) (and velocities or None) in ``names`` order.

    Missing or duplicate joint names, a position or velocity array whose length differs from the
    names (velocity may be empty), or non-finite values raise ``MessageError``."""
    msg_names = list(msg.name)
    if len(set(msg_names)) != len(msg_names):
        dups = sorted({n for n in msg_names if msg_names.count(n) > 1})
        raise MessageError(f"joint_states names joints {dups} more than once")
    index = {n: i for i, n in enumerate(msg_names)}
    missing = [n for n in names if n not in index]
    if missing:
        raise MessageError(f"joint_states lacks joints {missing} (has {msg_names})")
    pos = np.asarray(msg.position, dtype=np.float64)
    if pos.size != len(msg_names):
        raise MessageError(f"joint_states has {len(msg_names)} names but {pos.size} positions")
    q = pos[[index[n] for n in names]]
    if not np.all(np.isfinite(q)):
        raise MessageError("joint_states holds non-finite positions")
    vel = np.asarray(msg.velocity, dtype=np.float64)
    if vel.size not in (0, len(msg_names)):
        raise MessageError(f"joint_states has {len(msg_names)} names but {vel.size} velocities (0 or one per name)")
    qd = vel[[index[n] for n in names]] if vel.size else None
    if qd is not None and not np.all(np.isfinite(qd)):
        raise MessageError("joint_states holds non-finite velocities")
    return q, qd


def state_vector(msg: Any, dim: int | None) -> np.ndarray:
    """std_msgs/Float64MultiArray -> (D,) float64; a length other than ``dim`` or non-finite values
    raise ``MessageError``."""
    x = np.asarray(msg.data, dtype=np.float64)
    if dim is not None and x.size != dim:
        raise MessageError(f"state has {x.size} values, the policy takes {dim}")
    if not np.all(np.isfinite(x)):
        raise MessageError("state holds non-finite values")
    return x
