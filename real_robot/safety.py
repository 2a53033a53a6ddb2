"""Safety filter applied to every command before it leaves the node.

Order of checks per control step (the first that fires decides; clamps compose):
1. e-stop latched -> hold; 2. observation older than ``stale_ms`` -> hold; 3. command not finite
(NaN/inf, or the policy raised) -> hold; 4. clamp to joint position limits; 5. limit the change from
the last sent command to ``min(max_delta, max_velocity / rate)`` per joint (position limits still
win when the robot is measured outside them); 6. if a forward-kinematics function is given (the
robot config's ``urdf`` + ``ee_link``), a target whose end effector leaves the workspace box -> hold.
"Hold" re-sends the last safe command (or the measured position before any command was sent); for
velocity commands (``hold_zero``) a hold is the zero command, i.e. stop. Every intervention is
counted by kind and logged.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SafetyConfig:
    """Limits for one arm (joint order = the robot config's joint names)."""

    position_lower: tuple[float, ...]
    """Lower joint position limits (rad or m)."""
    position_upper: tuple[float, ...]
    """Upper joint position limits."""
    max_velocity: tuple[float, ...]
    """Per-joint speed limit (units/s)."""
    max_delta: float = 0.05
    """Largest change of a joint target per control step (rad or m)."""
    control_rate_hz: float = 30.0
    """Command rate; velocity limits become per-step limits through it."""
    stale_ms: float = 200.0
    """Hold when the newest observation is older than this (milliseconds)."""
    workspace_low: tuple[float, float, float] | None = None
    """End-effector box lower corner (m, base frame), used with a forward-kinematics function."""
    workspace_high: tuple[float, float, float] | None = None
    """End-effector box upper corner (m)."""

    def __post_init__(self) -> None:
        n = len(self.position_lower)
        if not n or len(self.position_upper) != n or len(self.max_velocity) != n:
            raise ValueError("safety limits need position_lower, position_upper and max_velocity of the same length (one per joint)")
        if any(lo >= hi for lo, hi in zip(self.position_lower, self.position_upper)):
            raise ValueError("each safety position_lower must be < position_upper")
        if self.control_rate_hz <= 0 or self.max_delta <= 0 or self.stale_ms <= 0:
            raise ValueError("control_rate_hz, max_delta and stale_ms must be > 0")


@dataclass
class Decision:
    """What to send this step. ``command`` (J,) is always safe to send; ``held`` says it is a hold."""

    command: np.ndarray
    held: bool
    interventions: tuple[str, ...]


class SafetyFilter:
    """Stateful filter: remembers the last command sent and the e-stop latch."""

    def __init__(self, cfg: SafetyConfig, fk: Callable[[np.ndarray], np.ndarray] | None = None,
                 hold_zero: bool = False) -> None:
        self.cfg = cfg
        self.fk = fk
        self.hold_zero = hold_zero
        self.lo = np.asarray(cfg.position_lower, np.float64)
        self.hi = np.asarray(cfg.position_upper, np.float64)
        self.step_limit = np.minimum(cfg.max_delta, np.asarray(cfg.max_velocity, np.float64) / cfg.control_rate_hz)
        self.last: np.ndarray | None = None
        self.estopped = False
        self.counts: Counter[str] = Counter()

    def estop(self, engaged: bool) -> None:
        """Latch (True) or release (False) the emergency stop."""
        if engaged and not self.estopped:
            log.warning("e-stop engaged: holding position")
        self.estopped = bool(engaged)

    def hold(self, measured: np.ndarray, kinds: list[str]) -> Decision:
        """A hold decision (counted under ``kinds``): the last safe command, the clamped ``measured``
        (J,) position before any, or the zero command with ``hold_zero``."""
        for k in kinds:
            self.counts[k] += 1
        log.warning("safety hold (%s)", ", ".join(kinds))
        if self.hold_zero:
            cmd = np.clip(np.zeros_like(self.lo), self.lo, self.hi)
        else:
            cmd = self.last if self.last is not None else np.clip(measured, self.lo, self.hi)
        self.last = cmd
        return Decision(cmd.copy(), True, tuple(kinds))

    def __call__(self, target: np.ndarray | None, measured: np.ndarray, obs_age_s: float) -> Decision:
        """``target`` (J,) joint command from the policy (None = the policy failed), ``measured`` (J,)
        current joint positions, ``obs_age_s`` age of the newest observation."""
        measured = np.asarray(measured, np.float64)
        if self.estopped:
            return self.hold(measured, ["estop"])
        if obs_age_s * 1000.0 > self.cfg.stale_ms:
            return self.hold(measured, ["stale_observation"])
        if target is None:
            return self.hold(measured, ["policy_error"])
        t = np.asarray(target, np.float64)
        if t.shape != self.lo.shape or not np.all(np.isfinite(t)):
            return self.hold(measured, ["non_finite_or_bad_shape"])
        kinds: list[str] = []
        clamped = np.clip(t, self.lo, self.hi)
        if not np.array_equal(clamped, t):
            kinds.append("position_limit")
        ref = self.last if self.last is not None else measured
        limited = ref + np.clip(clamped - ref, -self.step_limit, self.step_limit)
        if not np.allclose(limited, clamped):
            kinds.append("rate_limit")
        # position limits are hard: a robot measured outside them is commanded back to the limit
        limited = np.clip(limited, self.lo, self.hi)
        if self.fk is not None and self.cfg.workspace_low is not None and self.cfg.workspace_high is not None:
            ee = np.asarray(self.fk(limited), np.float64)
            if np.any(ee < self.cfg.workspace_low) or np.any(ee > self.cfg.workspace_high):
                return self.hold(measured, kinds + ["workspace"])
        for k in kinds:
            self.counts[k] += 1
        self.last = limited
        return Decision(limited.copy(), False, tuple(kinds))
