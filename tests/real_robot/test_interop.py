"""Interop matrix over real DDS on loopback: each of our transports (``rclpy``: RclpyTransport on Fast DDS 3;
``cyclonedds``: CycloneTransport) against separate peer processes written without project code (``rclpy``:
rclpy_peer.py on Fast DDS 3; ``cyclonedds``: plain cyclonedds with hand-written IDL, ros2_idl.PEER_MAIN),
for every message type we use, both directions, reliable and sensor-data QoS.

One peer process per (transport, peer, direction) carries every type and QoS on its own topic; senders
publish their messages round after round until the receiver holds each distinct message (so discovery
is waited for by polling, and best-effort loss only delays). Each cell asserts that the distinct
messages received equal the messages sent, compared as plain JSON values (byte sequences as hex)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

from real_robot import messages as m  # noqa: E402
from real_robot.loopback import FASTDDS_LOOPBACK, loopback_env, random_domain  # noqa: E402
from real_robot.transport import QoS, make_transport  # noqa: E402
from tests.real_robot.ros2_idl import IDL_TYPES, PEER_MAIN  # noqa: E402

RCLPY_PEER = Path(__file__).with_name("rclpy_peer.py")
TIMEOUT_S = 25.0  # per exchange; a healthy one takes a few seconds
PARTIAL_TIMEOUT_S = 10.0  # an exchange where some types cannot match (see PLAIN_CYCLONE_VS_FASTDDS) runs this long
PERIOD_S = 0.05  # between publishing rounds
QOS = {"reliable": QoS.default(), "sensor_data": QoS.sensor_data()}


def _header(i: int) -> dict:
    return {"stamp": {"sec": 1_700_000_000 + i, "nanosec": 250_000 * i}, "frame_id": f"frame_{i}"}


def _image(i: int, height: int, width: int) -> dict:
    pixels = (np.arange(height * width * 3, dtype=np.uint32) * (7 + i) % 251).astype(np.uint8)
    return {"header": _header(i), "height": height, "width": width, "encoding": "rgb8", "is_bigendian": 0,
            "step": width * 3, "data": pixels.tobytes().hex()}


def _point(i: int) -> dict:
    return {"positions": [0.5 * i, -1.25], "velocities": [0.0, 0.25], "accelerations": [],
            "effort": [], "time_from_start": {"sec": i, "nanosec": 500_000_000}}


SAMPLES: dict[str, list[dict]] = {
    "sensor_msgs/msg/Image": [_image(0, 3, 4), _image(1, 224, 224)],  # the large one is fragmented
    "sensor_msgs/msg/JointState": [
        {"header": _header(i), "name": ["shoulder", "elbow", "wrist"], "position": [0.5 * i, -1.0, 2.25],
         "velocity": [0.0, 0.125, -0.5], "effort": [] if i else [1.5, 2.5, 3.5]} for i in range(3)],
    "std_msgs/msg/Float64MultiArray": [
        {"layout": {"dim": [{"label": "joints", "size": 2, "stride": 2}], "data_offset": 0},
         "data": [0.25 * i, -3.5]} for i in range(2)] + [{"layout": {"dim": [], "data_offset": 0}, "data": []}],
    "trajectory_msgs/msg/JointTrajectory": [
        {"header": _header(i), "joint_names": ["j1", "j2"], "points": [_point(k) for k in range(i + 1)]}
        for i in range(2)],
    "std_msgs/msg/String": [{"data": "pick up the red cube"}, {"data": ""}, {"data": "grüne Tasse ✓"}],
    "std_msgs/msg/Bool": [{"data": True}, {"data": False}],
    "diagnostic_msgs/msg/DiagnosticArray": [
        {"header": _header(i), "status": [
            {"level": 2 * i, "name": "policy", "message": f"status {i}", "hardware_id": "arm",
             "values": [{"key": "rate_hz", "value": "30"}, {"key": "i", "value": str(i)}]}]} for i in range(2)],
    "geometry_msgs/msg/TwistStamped": [
        {"header": _header(i), "twist": {"linear": {"x": 0.1 * i, "y": 0.0, "z": -0.5},
                                         "angular": {"x": 0.0, "y": 0.25, "z": 1.0 * i}}} for i in range(2)],
}
TRANSPORTS = ("rclpy", "cyclonedds")
PEERS = ("rclpy", "cyclonedds")
DIRECTIONS = ("to_peer", "from_peer")


def topic_of(msgtype: str, qos: str) -> str:
    """``sensor_msgs/msg/Image``, ``reliable`` -> ``/interop/reliable/image``."""
    return f"/interop/{qos}/{msgtype.split('/')[-1].lower()}"


def topic_specs() -> list[dict]:
    return [{"topic": topic_of(t, q), "type": t, "qos": q, "messages": msgs}
            for t, msgs in SAMPLES.items() for q in QOS]


# --- messages: JSON values <-> rosbags messages <-> CDR ---------------------------------------------------

def _sequence_value(node: tuple[Any, Any], value: Any) -> Any:
    """A sequence field's value as rosbags holds it (messages, numpy arrays, strings)."""
    from rosbags.interfaces import Nodetype

    kind, detail = node
    if kind == Nodetype.NAME:
        return [to_msg(detail, v) for v in value]
    typ = detail[0]
    if typ in ("uint8", "byte"):
        return np.frombuffer(bytes.fromhex(value), dtype=np.uint8).copy()
    if typ == "string":
        return list(value)
    return np.asarray(value, dtype=np.bool_ if typ == "bool" else np.dtype(typ))


def to_msg(msgtype: str, data: dict) -> Any:
    """A rosbags message of ``msgtype`` from JSON values."""
    from rosbags.interfaces import Nodetype

    ts = m.typestore()
    kwargs = {}
    for name, (kind, detail) in ts.fielddefs[msgtype][1]:
        value = data[name]
        if kind == Nodetype.NAME:
            value = to_msg(detail, value)
        elif kind in (Nodetype.SEQUENCE, Nodetype.ARRAY):
            value = _sequence_value(detail[0], value)
        kwargs[name] = value
    return ts.types[msgtype](**kwargs)


def to_json(msg: Any) -> Any:
    """A rosbags message as JSON values (uint8 arrays as hex)."""
    if hasattr(msg, "__msgtype__"):  # fields only, not the constants rosbags also keeps on messages
        return {name: to_json(getattr(msg, name)) for name, _ in m.typestore().fielddefs[msg.__msgtype__][1]}
    if isinstance(msg, np.ndarray):
        return msg.tobytes().hex() if msg.dtype == np.uint8 else msg.tolist()
    if isinstance(msg, list):
        return [to_json(v) for v in msg]
    return msg


# --- one exchange: our transport <-> one peer process, all topics -------------------------------------------

@dataclasses.dataclass
class Exchange:
    received: dict[str, list[dict]]
    seconds: float
    log: str = ""
    unmatched: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # CycloneTransport only


def peer_command(peer: str, spec_path: Path) -> list[str]:
    """The command line of a peer process reading its spec from ``spec_path``."""
    if peer == "rclpy":
        return [sys.executable, str(RCLPY_PEER), f"@{spec_path}"]
    script = spec_path.with_suffix(".py")
    script.write_text(IDL_TYPES + PEER_MAIN)
    return [sys.executable, str(script), f"@{spec_path}"]


class Peer:
    """A peer process whose stdout and stderr are drained by threads (its result is larger than a pipe)."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._drain, args=(self.proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._drain, args=(self.proc.stderr, self.err), daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _drain(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self) -> tuple[list[dict], str]:
        """Closes stdin, waits for the exit (kills after 10 s); returns the JSON lines printed and a log line."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(timeout=5)
        lines = [json.loads(line) for line in self.out if line.startswith("{")]
        return lines, f"peer exit {self.proc.returncode}; stderr: {''.join(self.err)[-1500:]}"

    def kill(self) -> None:
        if self.running():
            self.proc.kill()


def start_peer(peer: str, mode: str, domain: int, tmp: Path, topics: list[dict] | None = None,
               timeout: float = TIMEOUT_S) -> Peer:
    """Starts a ``peer`` process in ``mode`` (pub or sub) over ``topics`` (default: every topic), confined
    to loopback."""
    spec = {"mode": mode, "domain": domain, "timeout": timeout, "period": PERIOD_S,
            "topics": topic_specs() if topics is None else topics}
    path = tmp / f"{peer}_{mode}.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, **loopback_env(domain), "PYTHONUNBUFFERED": "1"}
    return Peer(peer_command(peer, path), env)


def exchange_domain(kind: str) -> int:
    """A random domain, or the domain of an rclpy context that is already up (the rclpy transport joins it)."""
    if kind == "rclpy":
        import rclpy

        if rclpy.ok():
            return rclpy.get_default_context().get_domain_id()
    return random_domain()


def send_to_peer(kind: str, peer: str, tmp: Path, timeout: float = TIMEOUT_S) -> Exchange:
    """Our transport publishes every topic's messages in rounds until the subscribing peer exits."""
    domain, t0 = exchange_domain(kind), time.monotonic()
    transport = make_transport(kind, domain)
    proc = None
    try:
        pubs = [(transport.publisher(s["topic"], s["type"], QOS[s["qos"]]),
                 [m.serialize(to_msg(s["type"], msg), s["type"]) for msg in s["messages"]]) for s in topic_specs()]
        proc = start_peer(peer, "sub", domain, tmp, timeout=timeout)
        while proc.running() and time.monotonic() - t0 < timeout + 5:
            for pub, cdrs in pubs:
                for cdr in cdrs:
                    pub.publish(cdr)
            time.sleep(PERIOD_S)
        lines, log = proc.finish()
    finally:
        if proc is not None:
            proc.kill()
        transport.close()
    received = next((x["received"] for x in lines if "received" in x), {})
    return Exchange(received, time.monotonic() - t0, log)


def receive_from_peer(kind: str, peer: str, tmp: Path, timeout: float = TIMEOUT_S) -> Exchange:
    """Our transport subscribes to every topic; the peer publishes in rounds until we hold every message."""
    domain, t0 = exchange_domain(kind), time.monotonic()
    transport = make_transport(kind, domain)
    specs = topic_specs()
    received: dict[str, list[dict]] = {s["topic"]: [] for s in specs}
    errors: list[str] = []
    lock = threading.Lock()

    def callback(topic: str, msgtype: str):
        def on_raw(raw: bytes, _t: float) -> None:
            try:
                data = to_json(m.deserialize(raw, msgtype))
            except Exception as err:  # reported in the cell, not lost in a DDS thread
                errors.append(f"{topic}: {err}")
                return
            with lock:
                if data not in received[topic]:
                    received[topic].append(data)
        return on_raw

    def complete() -> bool:
        with lock:
            return all(len(received[s["topic"]]) >= len(s["messages"]) for s in specs)

    proc = None
    try:
        for s in specs:
            transport.subscribe(s["topic"], s["type"], callback(s["topic"], s["type"]), QOS[s["qos"]])
        proc = start_peer(peer, "pub", domain, tmp, timeout=timeout)
        while not complete() and proc.running() and time.monotonic() - t0 < timeout:
            time.sleep(0.02)
        unmatched = ({s["topic"]: transport.unmatched_peers(s["topic"]) for s in specs}
                     if hasattr(transport, "unmatched_peers") else {})
        _, log = proc.finish()
    finally:
        if proc is not None:
            proc.kill()
        transport.close()
    with lock:
        got = {k: list(v) for k, v in received.items()}
    return Exchange(got, time.monotonic() - t0, f"decode errors: {errors[:3]}; {log}", unmatched)


_RESULTS: dict[tuple[str, str, str], Exchange] = {}


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
    """``exchange(transport, peer, direction)``: the exchange's result, run once and kept for the module."""
    tmp = tmp_path_factory.mktemp("interop")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in loopback_env(random_domain()).items():  # rclpy in this process: loopback only
            mp.setenv(key, value)

        def run(kind: str, peer: str, direction: str) -> Exchange:
            key = (kind, peer, direction)
            if key not in _RESULTS:
                fn = send_to_peer if direction == "to_peer" else receive_from_peer
                partial = (kind, peer) == ("rclpy", "cyclonedds") and FASTDDS_SENDS_TYPES  # never completes
                _RESULTS[key] = fn(kind, peer, tmp, PARTIAL_TIMEOUT_S if partial else TIMEOUT_S)
            return _RESULTS[key]

        yield run
    _RESULTS.clear()


def _short(msgs: list[dict]) -> str:
    return "; ".join(json.dumps(x)[:160] for x in msgs)


# Cyclone 11 rejects the XTypes type information Fast DDS 3 sends (CycloneTransport ignores it itself); a
# plain cyclonedds peer matches rclpy only when Fast DDS does not send it (fastdds.type_propagation).
FASTDDS_SENDS_TYPES = "fastdds.type_propagation" not in FASTDDS_LOOPBACK
PLAIN_CYCLONE_VS_FASTDDS = pytest.mark.xfail(
    FASTDDS_SENDS_TYPES, strict=True,
    reason="the loopback Fast DDS profile sends XTypes type information, which a plain Cyclone 11 peer rejects; "
           "set the participant property fastdds.type_propagation=disabled")


def _cell(k: str, p: str, d: str, t: str, q: str) -> Any:
    with_sequences = t.split("/")[-1] not in ("String", "Bool", "TwistStamped")  # their type objects have sequences
    marks = [PLAIN_CYCLONE_VS_FASTDDS] if (k, p) == ("rclpy", "cyclonedds") and with_sequences else []
    return pytest.param(k, p, d, t, q, marks=marks, id=f"{k}-{p}peer-{d}-{t.split('/')[-1]}-{q}")


CELLS = [_cell(k, p, d, t, q) for k in TRANSPORTS for p in PEERS for d in DIRECTIONS for t in SAMPLES for q in QOS]


@pytest.mark.parametrize(("transport", "peer", "direction", "msgtype", "qos"), CELLS)
def test_interop(exchange, transport, peer, direction, msgtype, qos):
    if "rclpy" in (transport, peer):
        pytest.importorskip("rclpy")
    result = exchange(transport, peer, direction)
    sent, got = SAMPLES[msgtype], result.received.get(topic_of(msgtype, qos), [])
    missing = [x for x in sent if x not in got]
    unexpected = [x for x in got if x not in sent]
    assert not missing and not unexpected, (
        f"{transport} {direction} {peer} peer, {msgtype} ({qos}): missing {_short(missing)}; unexpected "
        f"{_short(unexpected)}; {result.log}")


@pytest.mark.parametrize("peer", PEERS)
def test_cyclone_transport_reports_no_unmatched_peer_once_data_flows(exchange, peer):
    if peer == "rclpy":
        pytest.importorskip("rclpy")
    result = exchange("cyclonedds", peer, "from_peer")
    assert result.unmatched and not any(result.unmatched.values()), result.unmatched


def test_unmatched_peers_names_a_fastdds_publisher_with_incompatible_qos(tmp_path, monkeypatch):
    pytest.importorskip("rclpy")
    domain = random_domain()
    for key, value in loopback_env(domain).items():
        monkeypatch.setenv(key, value)
    topic, msgtype = "/interop/qos_mismatch", "std_msgs/msg/String"
    transport = make_transport("cyclonedds", domain)
    proc = None
    try:
        transport.subscribe(topic, msgtype, lambda raw, t: None, QoS.default())  # reliable reader
        proc = start_peer("rclpy", "pub", domain, tmp_path,  # best-effort writer: never matches
                          [{"topic": topic, "type": msgtype, "qos": "sensor_data", "messages": [{"data": "x"}]}])
        deadline = time.monotonic() + TIMEOUT_S
        while not transport.unmatched_peers(topic) and proc.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = transport.unmatched_peers(topic)
        problem = transport.interop_problem()
        _, log = proc.finish()
    finally:
        if proc is not None:
            proc.kill()
        transport.close()
    assert len(lines) == 1, log
    assert lines[0].startswith("publisher ") and lines[0].endswith(f"(Fast DDS) type {msgtype}"), lines
    assert lines[0] in problem and problem.endswith("use transport: rclpy in the robot config"), problem
