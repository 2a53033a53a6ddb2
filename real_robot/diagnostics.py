"""The policy node's health as diagnostic_msgs/DiagnosticArray (what ``rqt_robot_monitor`` and the
diagnostic aggregator read from ``/diagnostics``): safety counters, rejected inputs, input ages and
control-loop timing."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from real_robot import messages as m

OK, WARN, ERROR = 0, 1, 2


class LoopTiming:
    """Control-loop statistics over the last ``window`` ticks: period and compute time (ms)."""

    def __init__(self, window: int = 300) -> None:
        self.periods: deque[float] = deque(maxlen=window)
        self.computes: deque[float] = deque(maxlen=window)
        self._last_start: float | None = None

    def tick(self, start: float, end: float) -> None:
        """Record one tick that began at ``start`` and ended at ``end`` (seconds, monotonic)."""
        if self._last_start is not None:
            self.periods.append(start - self._last_start)
        self._last_start = start
        self.computes.append(end - start)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, xs in (("period", self.periods), ("compute", self.computes)):
            if xs:
                a = 1000.0 * np.asarray(xs)
                out[f"{name}_p50_ms"] = float(np.percentile(a, 50))
                out[f"{name}_p99_ms"] = float(np.percentile(a, 99))
                out[f"{name}_max_ms"] = float(a.max())
        return out


def status_level(estopped: bool, stale: bool, recent_holds: int, recent_rejects: int) -> tuple[int, str]:
    """(level, message) of the node's status."""
    if estopped:
        return ERROR, "e-stop latched: holding (call the reset service to release)"
    if stale:
        return ERROR, "inputs stale or missing: holding"
    if recent_holds or recent_rejects:
        return WARN, f"{recent_holds} safety hold(s), {recent_rejects} rejected message(s) since the last report"
    return OK, "commanding"


def diagnostic_array(t: float, node_name: str, hardware_id: str, level: int, message: str,
                     values: Mapping[str, Any]) -> Any:
    """One DiagnosticStatus named ``<node_name>: policy`` with ``values`` as key/value strings."""
    ts = m.typestore().types
    kv = ts["diagnostic_msgs/msg/KeyValue"]
    status = ts["diagnostic_msgs/msg/DiagnosticStatus"](
        level=int(level), name=f"{node_name}: policy", message=message,
        hardware_id=hardware_id, values=[kv(key=str(k), value=_fmt(v)) for k, v in values.items()])
    return ts["diagnostic_msgs/msg/DiagnosticArray"](header=m.header(t), status=[status])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)
