"""Pure-pip DDS transport with ``cyclonedds``, wire-compatible with ROS 2.

Topics are ``rt/<name>``; types are named ``<pkg>::msg::dds_::<Name>_`` and declared from the
standard ROS 2 definitions in ``rosbags``' typestore (``uint8[]`` as a byte sequence, as Cyclone
0.10 peers in Humble/Jazzy expect). Samples travel as the CDR bytes ``rosbags`` writes: the IDL
class only names and shapes the type for matching; its (de)serializers are bypassed, which is ~25x
faster than cyclonedds' Python serializer for images. QoS: ROS 2 default (reliable, keep last 10)
or sensor data (best effort, keep last 5), both volatile.

Fast DDS peers (rclpy's default middleware) are matched by type name, as ROS 2 does: Cyclone is told to
ignore the XTypes type information of vendor 1.15 (eProsima). Fast DDS 3 announces type objects whose
sequence element flags are 0 (no try-construct bit: invalid by the XTypes spec), which Cyclone 11 rejects
("ddsi_xt_type_init_impl with invalid type object"); the peer's type then never resolves, and no type
with a sequence (Image, JointState, Float64MultiArray, JointTrajectory, DiagnosticArray) matches, in
either direction. Accepting those flags (``AllowInvalidTryConstruct``) is not enough: the assignability
check then rejects the types declared here ("wr type not delimited"). Cyclone peers keep the type check.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Literal

from real_robot.messages import dds_topic, dds_type_name, ros_type_name, typestore
from real_robot.transport.base import DEFAULT_QOS, QoS, RawCallback

log = logging.getLogger(__name__)

# vendor ids (major.minor) whose endpoints are matched by type name only: eProsima Fast DDS
IGNORE_TYPE_INFORMATION = "1.15"
# appended to the CYCLONEDDS_URI configuration for the domains this module creates
COMPAT_CONFIG = ('<CycloneDDS><Domain id="any"><Compatibility>'
                 f"<IgnoreTypeInformation>{IGNORE_TYPE_INFORMATION}</IgnoreTypeInformation>"
                 "</Compatibility></Domain></CycloneDDS>")

_domains: dict[int, list[Any]] = {}  # domain id -> [cyclonedds Domain or None, number of transports using it]
_domains_lock = threading.Lock()


def domain_config(base: str | None = None) -> str:
    """``base`` (default: CYCLONEDDS_URI; files and/or XML, comma-separated) followed by ``COMPAT_CONFIG``."""
    import os

    base = os.environ.get("CYCLONEDDS_URI", "") if base is None else base
    return ",".join(part for part in (base.strip(), COMPAT_CONFIG) if part)


def _acquire_domain(domain_id: int, base: str | None = None) -> None:
    """Creates the Cyclone domain ``domain_id`` with ``domain_config(base)`` for the first transport on it.

    A domain that cannot be made so (e.g. one already made in this process by other code) is left to
    ``DomainParticipant``, with CYCLONEDDS_URI alone; that is logged as a warning."""
    from cyclonedds.core import DDSException
    from cyclonedds.domain import Domain

    with _domains_lock:
        if domain_id not in _domains:
            try:
                domain: Any = Domain(domain_id, domain_config(base))
            except DDSException as err:
                log.warning("DDS domain %d runs without the Fast DDS compatibility setting (%s); Fast DDS peers "
                            "may not match", domain_id, err)
                domain = None
            _domains[domain_id] = [domain, 0]
        _domains[domain_id][1] += 1


def _release_domain(domain_id: int) -> None:
    """Deletes the domain when the last transport on it is closed."""
    with _domains_lock:
        entry = _domains.get(domain_id)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _domains[domain_id]
            if entry[0] is not None:
                entry[0].__del__()


def _base(typ: str, in_sequence: bool) -> Any:
    from cyclonedds.idl import types as t

    table = {"bool": bool, "byte": t.byte, "char": t.char, "int8": t.int8, "uint8": t.uint8, "int16": t.int16,
             "uint16": t.uint16, "int32": t.int32, "uint32": t.uint32, "int64": t.int64, "uint64": t.uint64,
             "float32": t.float32, "float64": t.float64, "string": str}
    if typ == "uint8" and in_sequence:
        return t.byte
    if typ not in table:
        raise TypeError(f"ROS type {typ!r} has no DDS mapping here")
    return table[typ]


def _field_type(node: tuple[Any, Any], in_sequence: bool = False) -> Any:
    from cyclonedds.idl import types as t
    from rosbags.interfaces import Nodetype

    kind, detail = node
    if kind == Nodetype.BASE:
        typ, bound = detail
        if typ == "string" and bound:
            return t.bounded_str[bound]
        return _base(typ, in_sequence)
    if kind == Nodetype.NAME:
        return idl_class(detail)
    if kind == Nodetype.ARRAY:
        sub, length = detail
        return t.array[_field_type(sub), length]
    if kind == Nodetype.SEQUENCE:
        sub, bound = detail
        inner = _field_type(sub, in_sequence=True)
        return t.sequence[inner, bound] if bound else t.sequence[inner]
    raise TypeError(f"unsupported ROS field node {kind}")


@functools.cache
def idl_class(msgtype: str) -> type:
    """A cyclonedds IDL struct named and shaped like the ROS 2 type ``msgtype``."""
    from cyclonedds.idl import make_idl_struct

    _, fields = typestore().fielddefs[msgtype]
    ann = {name: _field_type(node) for name, node in fields}
    if not ann:  # ROS 2 gives empty messages one uint8 member
        from cyclonedds.idl import types as t

        ann = {"structure_needs_at_least_one_member": t.uint8}
    return make_idl_struct(msgtype.replace("/", "_"), dds_type_name(msgtype), ann)


@functools.cache
def raw_class(msgtype: str) -> type:
    """Subclass of ``idl_class`` whose samples carry ready-made CDR bytes both ways."""
    base = idl_class(msgtype)

    def serialize(self: Any, buffer: Any = None, endianness: Any = None, use_version_2: Any = None) -> bytes:
        return self._raw

    def deserialize(cls: type, data: bytes, has_header: bool = True, use_version_2: Any = None) -> Any:
        obj = object.__new__(cls)
        obj._raw = bytes(data)
        return obj

    return type(f"Raw_{base.__name__}", (base,), {"serialize": serialize, "deserialize": classmethod(deserialize),
                                                 "__module__": __name__})


def _vendor(participant_key: Any) -> str:
    """The DDS vendor a participant GUID names in its first two bytes, where vendors put their id."""
    return {b"\x01\x0f": "Fast DDS", b"\x01\x01": "RTI Connext", b"\x01\x10": "Cyclone DDS"}.get(
        participant_key.bytes[:2], "DDS")


def _qos(q: QoS) -> Any:
    from cyclonedds.core import Policy, Qos
    from cyclonedds.util import duration

    rel = Policy.Reliability.Reliable(duration(milliseconds=100)) if q.reliability == "reliable" else Policy.Reliability.BestEffort
    return Qos(rel, Policy.History.KeepLast(q.depth), Policy.Durability.Volatile)


class _Publisher:
    def __init__(self, writer: Any, cls: type) -> None:
        self.writer, self.cls = writer, cls

    def publish(self, cdr: bytes) -> None:
        sample = object.__new__(self.cls)
        sample._raw = bytes(cdr)
        self.writer.write(sample)

    def flush(self, timeout_s: float) -> bool:
        """Block until every matched reliable reader acknowledged what was written (True) or ``timeout_s``
        passed (False). Calls the C function directly: cyclonedds 11.0.1's ``DataWriter.wait_for_acks``
        raises AttributeError instead of returning False on a timeout."""
        from cyclonedds.core import DDSException

        ret = self.writer._wait_for_acks(self.writer._ref, int(timeout_s * 1e9))
        if ret == DDSException.DDS_RETCODE_TIMEOUT:
            return False
        if ret != 0:
            raise DDSException(ret, "while waiting for acknowledgements")
        return True


class _Subscription:
    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def close(self) -> None:
        self.reader = None


class CycloneTransport:
    """One DDS participant on ``domain_id`` (default: ROS_DOMAIN_ID or 0). ``config``: Cyclone XML used
    instead of CYCLONEDDS_URI when this transport is the first on its domain in the process (e.g. the
    loopback settings of ``real_robot.loopback`` for a sim-in-the-loop run, whatever the shell set)."""

    name = "cyclonedds"

    def __init__(self, domain_id: int | None = None, config: str | None = None) -> None:
        import os

        from cyclonedds.domain import DomainParticipant

        self.domain_id = int(os.environ.get("ROS_DOMAIN_ID", 0)) if domain_id is None else domain_id
        _acquire_domain(self.domain_id, config)
        try:
            self.participant = DomainParticipant(self.domain_id)
        except Exception:
            _release_domain(self.domain_id)
            raise
        self._topics: dict[tuple[str, str], Any] = {}
        self._keep: list[Any] = []
        self._endpoints: dict[str, list[Any]] = {}  # DDS topic name -> our readers and writers on it
        self._discovery: dict[str, Any] = {}
        self._closed = False

    def _topic(self, topic: str, msgtype: str) -> Any:
        from cyclonedds.topic import Topic

        key = (topic, msgtype)
        if key not in self._topics:
            # the DDS topic is made from the IDL class, so the wire carries the ROS 2 type name and type
            # information; readers and writers then use its raw-bytes subclass (cyclonedds takes the
            # sample class from ``Topic.data_type`` when it (de)serializes)
            t = Topic(self.participant, dds_topic(topic), idl_class(msgtype))
            t.data_type = raw_class(msgtype)
            self._topics[key] = t
        return self._topics[key]

    def publisher(self, topic: str, msgtype: str, qos: QoS = DEFAULT_QOS) -> _Publisher:
        from cyclonedds.pub import DataWriter

        writer = DataWriter(self.participant, self._topic(topic, msgtype), qos=_qos(qos))
        self._keep.append(writer)
        self._endpoints.setdefault(dds_topic(topic), []).append(writer)
        return _Publisher(writer, raw_class(msgtype))

    def subscribe(self, topic: str, msgtype: str, callback: RawCallback, qos: QoS = DEFAULT_QOS) -> _Subscription:
        from cyclonedds.core import Listener
        from cyclonedds.sub import DataReader

        def on_data_available(reader: Any) -> None:
            if reader is None or self._closed:  # data arriving while the reader is being torn down
                return
            for sample in reader.take(N=64):
                raw = getattr(sample, "_raw", None)
                if raw is not None:
                    callback(raw, time.monotonic())

        reader = DataReader(self.participant, self._topic(topic, msgtype), qos=_qos(qos),
                            listener=Listener(on_data_available=on_data_available))
        self._keep.append(reader)
        self._endpoints.setdefault(dds_topic(topic), []).append(reader)
        return _Subscription(reader)

    def _remote_endpoints(self, topic: str, kind: Literal["publisher", "subscriber"]) -> list[Any]:
        """Other participants' publications or subscriptions on ``topic`` known from DDS discovery (the
        DCPSPublication / DCPSSubscription built-in topics)."""
        from cyclonedds.builtin import (
            BuiltinDataReader,
            BuiltinTopicDcpsPublication,
            BuiltinTopicDcpsSubscription,
        )

        if kind not in self._discovery:
            builtin = BuiltinTopicDcpsPublication if kind == "publisher" else BuiltinTopicDcpsSubscription
            self._discovery[kind] = BuiltinDataReader(self.participant, builtin)
        name, me = dds_topic(topic), self.participant.guid
        return [s for s in self._discovery[kind].read(N=4096) if s.topic_name == name and s.participant_key != me]

    def endpoint_types(self, topic: str, kind: Literal["publisher", "subscriber"]) -> set[str]:
        """ROS type names of the other participants' publishers or subscribers discovered on ``topic``."""
        return {ros_type_name(s.type_name) for s in self._remote_endpoints(topic, kind)}

    def unmatched_peers(self, topic: str) -> list[str]:
        """Other participants' endpoints on ``topic`` that none of our readers (for publishers) or writers
        (for subscribers) on it matched, one line each: ``publisher <guid> (Fast DDS) type <ROS type>``.

        A peer that is discovered but stays unmatched has an incompatible QoS (e.g. a best-effort publisher
        for our reliable reader) or a type that DDS type matching rejects. A peer is listed between its
        discovery and the match too, so callers poll until the list is empty or a deadline passes."""
        from cyclonedds.pub import DataWriter

        lines: list[str] = []
        for entity in self._endpoints.get(dds_topic(topic), []):
            if isinstance(entity, DataWriter):
                kind: Literal["publisher", "subscriber"] = "subscriber"
                matched = [entity.get_matched_subscription_data(h) for h in entity.get_matched_subscriptions()]
            else:
                kind = "publisher"
                matched = [entity.get_matched_publication_data(h) for h in entity.get_matched_publications()]
            keys = {m.key for m in matched if m is not None}
            lines += [f"{kind} {s.key} ({_vendor(s.participant_key)}) type {ros_type_name(s.type_name)}"
                      for s in self._remote_endpoints(topic, kind) if s.key not in keys]
        return sorted(set(lines))

    def interop_problem(self) -> str | None:
        """One line naming the endpoints of other participants on our topics that never matched ours and
        the fix, or None (asked by the policy node when an input never arrived)."""
        lines = sorted({line for topic in self._endpoints for line in self.unmatched_peers(topic[len("rt"):])})
        if not lines:
            return None
        return (f"DDS endpoints seen on our topics but not matched (QoS or type information): {'; '.join(lines[:4])}"
                f"; with ROS 2 peers use transport: rclpy in the robot config")

    def close(self) -> None:
        """Delete the DDS entities now, here, readers first (each waits for its running callback).

        Only dropping the references left the deletion to the garbage collector, which may run in a DDS
        listener thread: a reader collected inside its own callback then waits for that callback forever
        (a CI run hung so, in ``dds_delete``). cyclonedds has no public delete; ``Entity.__del__`` is it,
        and it is idempotent (a later collection finds the entity gone and does nothing)."""
        if self._closed:
            return
        self._closed = True
        entities = [*self._keep, *self._discovery.values(), *self._topics.values(), self.participant]
        entities.sort(key=lambda e: type(e).__name__ != "DataReader")  # readers (and their listeners) first
        self._discovery.clear()
        self._keep.clear()
        self._endpoints.clear()
        self._topics.clear()
        for entity in entities:
            entity.__del__()
        _release_domain(self.domain_id)
