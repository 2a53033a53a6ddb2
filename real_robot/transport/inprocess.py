"""In-process transport for unit tests: publishers hand CDR bytes straight to subscribers."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from real_robot.transport.base import DEFAULT_QOS, QoS, RawCallback


@dataclass
class _Sub:
    owner: InProcessTransport
    key: tuple[str, str]
    callback: RawCallback

    def close(self) -> None:
        subs = self.owner._subs.get(self.key, [])
        if self in subs:
            subs.remove(self)


@dataclass
class _Pub:
    owner: InProcessTransport
    key: tuple[str, str]

    def publish(self, cdr: bytes) -> None:
        now = time.monotonic()
        for sub in list(self.owner._subs.get(self.key, [])):
            sub.callback(bytes(cdr), now)

    def flush(self, timeout_s: float) -> bool:
        return True  # delivered synchronously


class InProcessTransport:
    name = "inprocess"

    def __init__(self) -> None:
        self._subs: dict[tuple[str, str], list[_Sub]] = defaultdict(list)
        self._types: dict[str, dict[str, set[str]]] = {"publisher": defaultdict(set), "subscriber": defaultdict(set)}

    def publisher(self, topic: str, msgtype: str, qos: QoS = DEFAULT_QOS) -> _Pub:
        self._types["publisher"][topic].add(msgtype)
        return _Pub(self, (topic, msgtype))

    def subscribe(self, topic: str, msgtype: str, callback: RawCallback, qos: QoS = DEFAULT_QOS) -> _Sub:
        self._types["subscriber"][topic].add(msgtype)
        sub = _Sub(self, (topic, msgtype), callback)
        self._subs[(topic, msgtype)].append(sub)
        return sub

    def endpoint_types(self, topic: str, kind: Literal["publisher", "subscriber"]) -> set[str]:
        """Types every user of this transport has published / subscribed on ``topic`` (one process,
        so "other participants" are all of them)."""
        return set(self._types[kind].get(topic, ()))

    def close(self) -> None:
        self._subs.clear()
