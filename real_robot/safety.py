"""Safety filter applied to every command before it leaves the node.

Order of checks per control step (the first that fires decides; clamps compose):
1. e-stop latched -> hold; 2. observation older than ``stale_ms`` -> hold; 3. command not finite
(NaN/inf, or the policy raised) -> hold; 4. clamp to joint position limits; 5. limit the change per
step to ``min(max_delta, max_velocity / rate)`` per joint, from the last sent command or, on the first
command after a hold or an e-stop release, from the measured position (position limits still win when
the robot is measured outside them); 6. if a forward-kinematics function is given (the robot config's
``urdf`` + ``ee_link``), a target whose end effector leaves the workspace box -> hold.
"Hold" sends the last safe command moved to within one step limit of the measured position (the
measured position before any command was sent), so a hold never pulls an arm that was pushed away
back in one jump; for velocity commands (``hold_zero``) a hold is the zero command, i.e. stop.
The e-stop latches: ``estop(True)`` engages, ``estop(False)`` does not release it; only
``reset_estop`` does, and only while the inputs are fresh. Every intervention is counted by kind;
log lines are throttled per kind.
"""

from __future__ import annotations

import logging
import math
import time
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
            raise ValueError("safety limits need position_lower, position_upper and max_velocity of the same length "
                             "(one per joint)")
        for key in ("position_lower", "position_upper", "max_velocity"):
            for i, v in enumerate(getattr(self, key)):
                if not math.isfinite(v) or (key == "max_velocity" and v <= 0):
                    need = "a finite number > 0" if key == "max_velocity" else "a finite number"
                    raise ValueError(f"safety.{key}[{i}] = {v!r}; it must be {need}")
        if any(lo >= hi for lo, hi in zip(self.position_lower, self.position_upper)):
            raise ValueError("each safety position_lower must be < position_upper")
        for key in ("max_delta", "control_rate_hz", "stale_ms"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"safety.{key} = {v!r}; it must be a finite number > 0")
        box = [b for b in (self.workspace_low, self.workspace_high) if b is not None]
        for key, b in zip(("workspace_low", "workspace_high"), box):
            if len(b) != 3 or not all(math.isfinite(v) for v in b):
                raise ValueError(f"safety.{key} = {list(b)}; it must be 3 finite numbers (x, y, z in metres)")
        if len(box) == 2 and any(lo >= hi for lo, hi in zip(*box)):
            raise ValueError("each safety.workspace_low must be < workspace_high")


@dataclass
class Decision:
    """What to send this step. ``command`` (J,) is always safe to send; ``held`` says it is a hold."""

    command: np.ndarray
    held: bool
    interventions: tuple[str, ...]


class ThrottledLog:
    """Log a message per reason at most once every ``period_s`` seconds, with the count since the last line."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0) -> None:
        self.logger, self.period_s = logger, period_s
        self._last: dict[str, float] = {}
        self._since: Counter[str] = Counter()

    def __call__(self, level: int, reason: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        self._since[reason] += 1
        last = self._last.get(reason)
        if last is not None and now - last < self.period_s:
            return
        n = self._since.pop(reason)
        self._last[reason] = now
        suffix = f" ({n} times in the last {self.period_s:g} s)" if last is not None and n > 1 else ""
        self.logger.log(level, msg + suffix, *args)


class SafetyFilter:
    """Stateful filter: remembers the last command sent, whether the next command must start from the
    measured position, and the e-stop latch."""

    def __init__(self, cfg: SafetyConfig, fk: Callable[[np.ndarray], np.ndarray] | None = None,
                 hold_zero: bool = False) -> None:
        self.cfg = cfg
        self.fk = fk
        self.hold_zero = hold_zero
        self.lo = np.asarray(cfg.position_lower, np.float64)
        self.hi = np.asarray(cfg.position_upper, np.float64)
        self.step_limit = np.minimum(cfg.max_delta, np.asarray(cfg.max_velocity, np.float64) / cfg.control_rate_hz)
        self.last: np.ndarray | None = None
        self.resync = True  # the next command's rate limit starts from the measured position
        self.estopped = False
        self.counts: Counter[str] = Counter()
        self._log = ThrottledLog(log)

    def estop(self, engaged: bool) -> None:
        """``True`` latches the emergency stop; ``False`` is counted and ignored (release: ``reset_estop``)."""
        if engaged:
            if not self.estopped:
                log.warning("e-stop engaged: holding position until the reset service is called")
            self.estopped = True
        elif self.estopped:
            self.counts["estop_release_ignored"] += 1
            self._log(logging.WARNING, "estop_release", "e-stop release message ignored: call the reset service")

    def reset_estop(self, inputs_fresh: bool) -> tuple[bool, str]:
        """Release the latched e-stop if ``inputs_fresh``; (released, reason). The next command starts
        from the measured position."""
        if not self.estopped:
            return True, "e-stop was not engaged"
        if not inputs_fresh:
            self.counts["estop_reset_refused"] += 1
            return False, (f"e-stop stays engaged: the inputs are older than stale_ms={self.cfg.stale_ms:g} "
                           "(or missing); reset again once the robot's data flows")
        self.estopped = False
        self.resync = True
        self.counts["estop_reset"] += 1
        log.warning("e-stop released by the reset service")
        return True, "e-stop released"

    def hold(self, measured: np.ndarray, kinds: list[str]) -> Decision:
        """A hold decision (counted under ``kinds``): the last safe command moved to within one step
        limit of ``measured`` (J,), the clamped measured position before any command, or the zero
        command with ``hold_zero``. The next command then starts from the measured position."""
        for k in kinds:
            self.counts[k] += 1
        self._log(logging.WARNING, ",".join(kinds), "safety hold (%s)", ", ".join(kinds))
        measured = np.asarray(measured, np.float64)
        if self.hold_zero:
            cmd = np.clip(np.zeros_like(self.lo), self.lo, self.hi)
        elif self.last is None or measured.shape != self.lo.shape or not np.all(np.isfinite(measured)):
            cmd = self.last if self.last is not None else np.clip(np.nan_to_num(measured), self.lo, self.hi)
        else:
            cmd = np.clip(np.clip(self.last, measured - self.step_limit, measured + self.step_limit), self.lo, self.hi)
        self.last = cmd
        self.resync = True
        return Decision(cmd.copy(), True, tuple(kinds))

    def __call__(self, target: np.ndarray | None, measured: np.ndarray, obs_age_s: float) -> Decision:
        """``target`` (J,) joint command from the policy (None = the policy failed), ``measured`` (J,)
        current joint positions, ``obs_age_s`` age of the newest observation (s)."""
        measured = np.asarray(measured, np.float64)
        if self.estopped:
            return self.hold(measured, ["estop"])
        if not (obs_age_s * 1000.0 <= self.cfg.stale_ms):  # NaN age counts as stale
            return self.hold(measured, ["stale_observation"])
        if target is None:
            return self.hold(measured, ["policy_error"])
        t = np.asarray(target, np.float64)
        if t.shape != self.lo.shape or not np.all(np.isfinite(t)):
            return self.hold(measured, ["non_finite_or_bad_shape"])
        return self._limit(t, measured)

    def _limit(self, t: np.ndarray, measured: np.ndarray) -> Decision:
        kinds: list[str] = []
        clamped = np.clip(t, self.lo, self.hi)
        if not np.array_equal(clamped, t):
            kinds.append("position_limit")
        ref = measured if (self.resync or self.last is None) and not self.hold_zero else self.last
        if ref is None:
            ref = np.zeros_like(self.lo)
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
        self.resync = False
        return Decision(limited.copy(), False, tuple(kinds))

    def sequence(self, targets: np.ndarray, measured: np.ndarray, obs_age_s: float) -> list[Decision]:
        """Filter a chunk (T, J) of targets as consecutive steps (each point's rate limit starts from the
        previous filtered point). Stops at the first hold, which is then the last decision."""
        out: list[Decision] = []
        for t in np.atleast_2d(targets):
            d = self(t, measured, obs_age_s)
            out.append(d)
            if d.held:
                break
        return out
