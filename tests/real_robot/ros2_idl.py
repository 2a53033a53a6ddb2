"""Shared by the DDS peer tests: a loopback-only Cyclone DDS config, the ROS 2 message types declared
by hand with plain cyclonedds IDL (no project code), as text to start peer scripts with, and
``PEER_MAIN``: a generic publisher/subscriber program over those types (``IDL_TYPES + PEER_MAIN``)
speaking the same JSON protocol as ``rclpy_peer.py``."""

LOOPBACK = ('<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
            '<AllowMulticast>false</AllowMulticast></General><Discovery><Peers><Peer address="127.0.0.1"/></Peers>'
            '</Discovery></Domain></CycloneDDS>')

IDL_TYPES = r'''
import json, sys, threading, time
from dataclasses import dataclass
from cyclonedds.core import Listener, Policy, Qos
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl import types as t
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: t.int32
    nanosec: t.uint32

@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time
    frame_id: str

@dataclass
class JointState(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    header: Header
    name: t.sequence[str]
    position: t.sequence[t.float64]
    velocity: t.sequence[t.float64]
    effort: t.sequence[t.float64]

@dataclass
class Image(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    header: Header
    height: t.uint32
    width: t.uint32
    encoding: str
    is_bigendian: t.uint8
    step: t.uint32
    data: t.sequence[t.byte]

@dataclass
class Bool(IdlStruct, typename="std_msgs::msg::dds_::Bool_"):
    data: bool

@dataclass
class MultiArrayDimension(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    label: str
    size: t.uint32
    stride: t.uint32

@dataclass
class MultiArrayLayout(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    dim: t.sequence[MultiArrayDimension]
    data_offset: t.uint32

@dataclass
class Float64MultiArray(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    layout: MultiArrayLayout
    data: t.sequence[t.float64]

@dataclass
class String(IdlStruct, typename="std_msgs::msg::dds_::String_"):
    data: str

@dataclass
class Duration(IdlStruct, typename="builtin_interfaces::msg::dds_::Duration_"):
    sec: t.int32
    nanosec: t.uint32

@dataclass
class JointTrajectoryPoint(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectoryPoint_"):
    positions: t.sequence[t.float64]
    velocities: t.sequence[t.float64]
    accelerations: t.sequence[t.float64]
    effort: t.sequence[t.float64]
    time_from_start: Duration

@dataclass
class JointTrajectory(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectory_"):
    header: Header
    joint_names: t.sequence[str]
    points: t.sequence[JointTrajectoryPoint]

@dataclass
class KeyValue(IdlStruct, typename="diagnostic_msgs::msg::dds_::KeyValue_"):
    key: str
    value: str

@dataclass
class DiagnosticStatus(IdlStruct, typename="diagnostic_msgs::msg::dds_::DiagnosticStatus_"):
    level: t.byte
    name: str
    message: str
    hardware_id: str
    values: t.sequence[KeyValue]

@dataclass
class DiagnosticArray(IdlStruct, typename="diagnostic_msgs::msg::dds_::DiagnosticArray_"):
    header: Header
    status: t.sequence[DiagnosticStatus]

@dataclass
class Vector3(IdlStruct, typename="geometry_msgs::msg::dds_::Vector3_"):
    x: t.float64
    y: t.float64
    z: t.float64

@dataclass
class Twist(IdlStruct, typename="geometry_msgs::msg::dds_::Twist_"):
    linear: Vector3
    angular: Vector3

@dataclass
class TwistStamped(IdlStruct, typename="geometry_msgs::msg::dds_::TwistStamped_"):
    header: Header
    twist: Twist
'''

PEER_MAIN = r'''
# Usage: python peer.py '<json>' | @spec.json, with {"mode": "pub" | "sub", "domain": id, "timeout": s,
# "topics": [{"topic": "/x", "type": "sensor_msgs/msg/JointState", "qos": "reliable" | "sensor_data",
# "messages": [...]}]}; the protocol of rclpy_peer.py (byte sequences as hex strings in JSON).
import dataclasses, os, typing

def struct_in(ann):
    """The IdlStruct an annotation names, directly or as sequence element; else None."""
    if isinstance(ann, type) and issubclass(ann, IdlStruct):
        return ann
    for meta in getattr(ann, "__metadata__", ()):
        if hasattr(meta, "subtype"):
            return struct_in(meta.subtype)
    return None

def to_json(obj):
    """An IDL sample as plain JSON values (byte sequences, which cyclonedds reads as lists, as hex)."""
    if dataclasses.is_dataclass(obj):
        hints = typing.get_type_hints(type(obj), include_extras=True)
        return {f.name: bytes(getattr(obj, f.name)).hex() if "sequence[byte" in repr(hints[f.name])
                else to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj).hex()
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj

def from_json(cls, data):
    """Builds a ``cls`` sample from ``to_json``-style values."""
    hints = typing.get_type_hints(cls, include_extras=True)
    kwargs = {}
    for name, value in data.items():
        sub = struct_in(hints[name])
        if sub is not None:
            value = [from_json(sub, v) for v in value] if isinstance(value, list) else from_json(sub, value)
        elif isinstance(value, str) and "sequence[byte" in repr(hints[name]):
            value = bytes.fromhex(value)
        kwargs[name] = value
    return cls(**kwargs)

def qos(name):
    if name == "sensor_data":
        return Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(5), Policy.Durability.Volatile)
    return Qos(Policy.Reliability.Reliable(duration(milliseconds=100)), Policy.History.KeepLast(10),
               Policy.Durability.Volatile)

def emit(obj):
    print(json.dumps(obj), flush=True)

def dds_topic(spec):
    return Topic(dp, "rt/" + spec["topic"].lstrip("/"), globals()[spec["type"].split("/")[-1]])

def run_pub(spec):
    """Publishes every topic's messages in rounds until stdin closes or the timeout passes."""
    pubs = []
    for tp in spec["topics"]:
        cls = globals()[tp["type"].split("/")[-1]]
        pubs.append((DataWriter(dp, dds_topic(tp), qos=qos(tp["qos"])), [from_json(cls, m) for m in tp["messages"]]))
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    emit({"ready": True})
    deadline = time.monotonic() + spec.get("timeout", 30)
    while not closed.is_set() and time.monotonic() < deadline:
        for w, msgs in pubs:
            for m in msgs:
                w.write(m)
        closed.wait(spec.get("period", 0.05))
    return 0

def run_sub(spec):
    """Collects distinct messages per topic until each has as many as listed, or the timeout passes.
    Readers are polled from this thread, so decoding runs outside Cyclone's threads."""
    received = {tp["topic"]: [] for tp in spec["topics"]}
    wanted = {tp["topic"]: len(tp["messages"]) for tp in spec["topics"]}
    readers = [(tp["topic"], DataReader(dp, dds_topic(tp), qos=qos(tp["qos"]))) for tp in spec["topics"]]
    emit({"ready": True, "subscriptions": len(readers)})
    deadline = time.monotonic() + spec.get("timeout", 30)
    while time.monotonic() < deadline and not all(len(received[k]) >= n for k, n in wanted.items()):
        for topic, reader in readers:
            for sample in reader.take(N=64):
                data = to_json(sample)
                if data not in received[topic]:
                    received[topic].append(data)
        time.sleep(0.01)
    ok = all(len(received[k]) >= n for k, n in wanted.items())
    emit({"received": received})
    return 0 if ok else 1

arg = sys.argv[1]
spec = json.loads(open(arg[1:]).read() if arg.startswith("@") else arg)
dp = DomainParticipant(int(spec["domain"]))
code = run_pub(spec) if spec["mode"] == "pub" else run_sub(spec)
sys.stdout.flush()
os._exit(code)  # no teardown of the DDS entities by the garbage collector at exit
'''
