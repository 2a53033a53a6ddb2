"""rclpy transport: a real ROS 2 client (the ``ros2`` extra installs rclpy, Fast DDS 3 and the message
packages from PyPI; a sourced ROS 2 install works the same).

Raw CDR both ways: subscriptions are created with ``raw=True`` (callbacks get the serialized bytes)
and publishers are handed bytes, which rclpy publishes as an already-serialized message; so this
transport moves exactly the bytes the cyclonedds transport does. The node spins in a background
executor thread. rclpy is initialised without its own signal handlers: the process that owns the
transport decides what SIGINT/SIGTERM do, so a final safe command can still be published through a
live context after Ctrl-C.
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any, Literal

from real_robot.transport.base import DEFAULT_QOS, QoS, RawCallback


def msg_class(msgtype: str) -> Any:
    """``sensor_msgs/msg/Image`` -> the rclpy message class."""
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def qos_profile(q: QoS) -> Any:
    """ROS 2 profiles (REP 2003): sensor data (best effort, keep last 5) or reliable, keep last ``depth``."""
    from rclpy.qos import QoSProfile, qos_profile_sensor_data

    if q.reliability == "best_effort":
        return qos_profile_sensor_data
    return QoSProfile(depth=q.depth)


def init_rclpy(domain_id: int | None = None, args: list[str] | None = None) -> bool:
    """Initialise rclpy once per process without its signal handlers; True if this call did it."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    if rclpy.ok():
        return False
    rclpy.init(args=args, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
    return True


class _Pub:
    def __init__(self, pub: Any) -> None:
        self._pub = pub

    def publish(self, cdr: bytes) -> None:
        self._pub.publish(bytes(cdr))

    def flush(self, timeout_s: float) -> bool:
        """Wait until every matched reliable reader acknowledged what was published (or the timeout)."""
        from rclpy.duration import Duration

        return bool(self._pub.wait_for_all_acked(Duration(nanoseconds=int(timeout_s * 1e9))))


class _Sub:
    def __init__(self, node: Any, sub: Any) -> None:
        self._node, self._sub = node, sub

    def close(self) -> None:
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
            self._sub = None


class RclpyTransport:
    """Publishes and subscribes through ``node`` (an rclpy Node, e.g. the lifecycle policy node) or a
    node of its own, spun by a background executor (``spin=False``: the caller spins the node)."""

    name = "rclpy"

    def __init__(self, node_name: str = "robo_rl_policy", domain_id: int | None = None, node: Any = None,
                 spin: bool = True) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        self._owns_context = init_rclpy(domain_id)
        self._rclpy = rclpy
        self._owns_node = node is None
        self.node = node if node is not None else rclpy.create_node(node_name)
        self._executor = None
        self._thread = None
        if spin:
            self._executor = SingleThreadedExecutor()
            self._executor.add_node(self.node)
            self._thread = threading.Thread(target=self._spin, daemon=True, name="rclpy-spin")
            self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        try:
            self._executor.spin()
        except ExternalShutdownException:
            pass

    def publisher(self, topic: str, msgtype: str, qos: QoS = DEFAULT_QOS) -> _Pub:
        return _Pub(self.node.create_publisher(msg_class(msgtype), topic, qos_profile(qos)))

    def subscribe(self, topic: str, msgtype: str, callback: RawCallback, qos: QoS = DEFAULT_QOS) -> _Sub:
        sub = self.node.create_subscription(msg_class(msgtype), topic,
                                            lambda raw: callback(bytes(raw), time.monotonic()),
                                            qos_profile(qos), raw=True)
        return _Sub(self.node, sub)

    def endpoint_types(self, topic: str, kind: Literal["publisher", "subscriber"]) -> set[str]:
        infos = (self.node.get_publishers_info_by_topic(topic) if kind == "publisher"
                 else self.node.get_subscriptions_info_by_topic(topic))
        me = (self.node.get_name(), self.node.get_namespace())
        return {info.topic_type for info in infos if (info.node_name, info.node_namespace) != me}

    def close(self) -> None:
        """Stop spinning, destroy our node and, if this transport initialised rclpy, shut it down."""
        if self._executor is not None:
            self._executor.shutdown(timeout_sec=1.0)
            self._executor = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        if self._owns_node and self.node is not None:
            self.node.destroy_node()
            self.node = None
        if self._owns_context and self._rclpy.ok():
            self._rclpy.try_shutdown()
            self._owns_context = False
