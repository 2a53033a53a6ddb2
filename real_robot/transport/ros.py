"""rclpy transport, for machines with a ROS 2 installation (Humble or newer).

Raw CDR both ways: subscriptions are created with ``raw=True`` (callbacks get the serialized bytes)
and publishers are handed bytes, which rclpy publishes as an already-serialized message; so this
transport moves exactly the bytes the cyclonedds transport does. The node spins in a background
executor thread. Not exercised on our machines (no ROS 2 there); the cyclonedds transport is tested
against a plain DDS peer instead.
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any, Literal

from real_robot.transport.base import DEFAULT_QOS, QoS, RawCallback


def _msg_class(msgtype: str) -> Any:
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def _profile(q: QoS) -> Any:
    from rclpy.qos import QoSProfile, qos_profile_sensor_data

    if q.reliability == "best_effort":
        return qos_profile_sensor_data
    return QoSProfile(depth=q.depth)


class RclpyTransport:
    name = "rclpy"

    def __init__(self, node_name: str = "robo_rl_policy") -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        if not rclpy.ok():
            rclpy.init()
        self._rclpy = rclpy
        self.node = rclpy.create_node(node_name)
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, daemon=True, name="rclpy-spin")
        self._thread.start()

    def publisher(self, topic: str, msgtype: str, qos: QoS = DEFAULT_QOS) -> Any:
        pub = self.node.create_publisher(_msg_class(msgtype), topic, _profile(qos))

        class _Pub:
            def publish(self, cdr: bytes) -> None:
                pub.publish(bytes(cdr))

        return _Pub()

    def subscribe(self, topic: str, msgtype: str, callback: RawCallback, qos: QoS = DEFAULT_QOS) -> Any:
        sub = self.node.create_subscription(_msg_class(msgtype), topic, lambda raw: callback(bytes(raw), time.monotonic()),
                                            _profile(qos), raw=True)
        node = self.node

        class _Sub:
            def close(self) -> None:
                node.destroy_subscription(sub)

        return _Sub()

    def endpoint_types(self, topic: str, kind: Literal["publisher", "subscriber"]) -> set[str]:
        infos = (self.node.get_publishers_info_by_topic(topic) if kind == "publisher"
                 else self.node.get_subscriptions_info_by_topic(topic))
        me = self.node.get_name()
        return {info.topic_type for info in infos if info.node_name != me}

    def close(self) -> None:
        self._executor.shutdown()
        self.node.destroy_node()
