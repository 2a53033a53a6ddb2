"""A ROS 2 peer process written only with rclpy's public API and the standard message packages (no
project code), for interop tests. Middleware and domain come from the environment (RMW_IMPLEMENTATION,
ROS_DOMAIN_ID, FASTDDS_DEFAULT_PROFILES_FILE).

Usage: ``python rclpy_peer.py '<json>'`` (or ``@file.json``) with ``{"mode": "pub" | "sub", "domain": id
(optional, else ROS_DOMAIN_ID), "timeout": seconds, "period": seconds between rounds, "topics":
[{"topic": "/x", "type": "sensor_msgs/msg/JointState", "qos": "reliable" | "sensor_data", "messages":
[{field: value, ...}, ...]}, ...]}``. Message values are plain JSON: nested messages as objects,
sequences as lists, ``uint8``/``byte`` sequences as hex strings.

``pub``: prints ``{"ready": true}``, then publishes every topic's messages in order, round after round
(so late discovery and best-effort loss only delay delivery), until stdin closes or the timeout passes.
``sub``: prints ``{"ready": true}``, then collects messages until every topic holds as many distinct
messages as listed (their content is not used), and prints ``{"received": {topic: [message, ...]}}``
(distinct messages in arrival order) and exits 0, or exits 1 after printing what it has at the timeout.
"""

from __future__ import annotations

import array
import importlib
import json
import sys
import threading
import time

import rclpy
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions

BYTE_TYPES = ("sequence<uint8>", "sequence<octet>", "sequence<byte>")


def msg_class(name: str):
    """``sensor_msgs/msg/Image`` or ``sensor_msgs/Image`` -> the generated Python class."""
    parts = name.split("/")
    pkg, cls = parts[0], parts[-1]
    return getattr(importlib.import_module(f"{pkg}.msg"), cls)


def element_type(field_type: str) -> str:
    """``sequence<std_msgs/Foo, 3>`` / ``std_msgs/Foo[3]`` -> ``std_msgs/Foo``; others as is."""
    if field_type.startswith("sequence<"):
        return field_type[len("sequence<"):-1].split(",")[0].strip()
    return field_type.split("[")[0]


def to_json(msg) -> dict:
    """A message as plain JSON values (byte sequences as hex strings)."""
    out = {}
    for field, ftype in msg.get_fields_and_field_types().items():
        value = getattr(msg, field)
        if ftype in BYTE_TYPES:
            out[field] = bytes(value).hex() if not isinstance(value, list) else b"".join(value).hex()
        elif ftype == "octet":  # a ROS ``byte``: one bytes object in rclpy, an integer in JSON
            out[field] = value[0] if isinstance(value, bytes) else int(value)
        elif hasattr(value, "get_fields_and_field_types"):
            out[field] = to_json(value)
        elif isinstance(value, (list, tuple, array.array)) or type(value).__name__ == "ndarray":
            out[field] = [to_json(v) if hasattr(v, "get_fields_and_field_types") else v for v in list(value)]
        else:
            out[field] = value
    return out


def from_json(cls, data: dict):
    """Builds a ``cls`` message from ``to_json``-style values."""
    msg = cls()
    types = cls.get_fields_and_field_types()
    for field, value in data.items():
        ftype = types[field]
        inner = element_type(ftype)
        if ftype in BYTE_TYPES:
            raw = bytes.fromhex(value)
            value = array.array("B", raw) if ftype == "sequence<uint8>" else [bytes([b]) for b in raw]
        elif ftype == "octet":
            value = bytes([value])
        elif "/" in inner and isinstance(value, list):
            value = [from_json(msg_class(inner), v) for v in value]
        elif "/" in inner:
            value = from_json(msg_class(inner), value)
        setattr(msg, field, value)
    return msg


def profile(name: str) -> QoSProfile:
    """``reliable``: ROS 2 default (reliable, volatile, keep last 10); ``sensor_data``: best effort, keep last 5."""
    return qos_profile_sensor_data if name == "sensor_data" else QoSProfile(depth=10)


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def spin_in_background(node):
    """Spins ``node`` in a thread; returns the executor and the thread."""
    from rclpy.executors import SingleThreadedExecutor

    executor = SingleThreadedExecutor()
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    return executor, thread


def run_pub(node, spec: dict) -> int:
    """Publishes every topic's messages in rounds until stdin closes or the timeout passes."""
    pubs = []
    for t in spec["topics"]:
        cls = msg_class(t["type"])
        pubs.append((node.create_publisher(cls, t["topic"], profile(t["qos"])),
                     [from_json(cls, m) for m in t["messages"]]))
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    emit({"ready": True})
    deadline = time.monotonic() + spec.get("timeout", 30)
    while not closed.is_set() and time.monotonic() < deadline:
        for pub, msgs in pubs:
            for m in msgs:
                pub.publish(m)
        closed.wait(spec.get("period", 0.05))
    return 0


def run_sub(node, spec: dict) -> int:
    """Collects distinct messages per topic until each has as many as listed, or the timeout passes."""
    received: dict[str, list[dict]] = {t["topic"]: [] for t in spec["topics"]}
    wanted = {t["topic"]: len(t["messages"]) for t in spec["topics"]}
    lock, done = threading.Lock(), threading.Event()

    def callback(topic: str):
        def on_msg(msg) -> None:
            data = to_json(msg)
            with lock:
                if data not in received[topic]:
                    received[topic].append(data)
                if all(len(received[k]) >= n for k, n in wanted.items()):
                    done.set()
        return on_msg

    subs = [node.create_subscription(msg_class(t["type"]), t["topic"], callback(t["topic"]), profile(t["qos"]))
            for t in spec["topics"]]
    emit({"ready": True, "subscriptions": len(subs)})
    ok = done.wait(spec.get("timeout", 30))
    with lock:
        emit({"received": received})
    return 0 if ok else 1


def load_spec(arg: str) -> dict:
    """The JSON spec from the argument itself or, for ``@path``, from that file."""
    if arg.startswith("@"):
        with open(arg[1:]) as fh:
            return json.load(fh)
    return json.loads(arg)


def main() -> int:
    spec = load_spec(sys.argv[1])
    rclpy.init(domain_id=spec.get("domain"), signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(spec.get("node", "interop_peer"))
    executor, thread = spin_in_background(node)
    try:
        return run_pub(node, spec) if spec["mode"] == "pub" else run_sub(node, spec)
    finally:
        executor.shutdown()
        thread.join(5)
        node.destroy_node()
        rclpy.shutdown()


if __name__ == "__main__":
    sys.exit(main())
