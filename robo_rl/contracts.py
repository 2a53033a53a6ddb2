"""The contracts every simulator, policy, algorithm and robot bridge implements.

Shapes (B = batch of envs, V = cameras, D = state dim, A = action dim, H = action-chunk horizon,
T = time steps of a rollout or an episode; images are (..., height, width, 3)):

* ``Observation``: ``dict[str, Any]`` with a leading batch dimension on every array:
  ``state`` (B, D) float32, ``rgb`` (B, V, height, width, 3) uint8, ``instruction`` list[str] of length B.
  A simulator may add keys, never rename these.
* Actions: (B, A) float32, or chunks (B, H, A).

Arrays crossing the env boundary are numpy; policies convert to torch internally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

Observation = dict[str, Any]


@dataclass(frozen=True)
class ArraySpec:
    """Shape (without the batch dim), dtype and optional bounds of one observation/action entry.

    ``low``/``high``: one bound for every element, or one per element of the last axis (A,) (e.g. the
    joint limits of an absolute joint-position controller); a sequence is stored as a tuple of floats.
    """

    shape: tuple[int, ...]
    dtype: str
    low: float | tuple[float, ...] | None = None
    high: float | tuple[float, ...] | None = None
    meaning: str = ""

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            value = getattr(self, name)
            if value is None or isinstance(value, (int, float)):
                continue
            per_dim = tuple(float(x) for x in np.asarray(value, dtype=np.float64).reshape(-1))
            if not self.shape or len(per_dim) != self.shape[-1]:
                raise ValueError(f"ArraySpec.{name} has {len(per_dim)} bounds for shape {self.shape}; give one "
                                 f"bound or one per element of the last axis ({self.shape[-1] if self.shape else 0})")
            object.__setattr__(self, name, per_dim)

    def bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(low, high), each (A,) float32 over the last axis (a single bound repeated), or None where
        either side is unbounded. Broadcasts against (B, A) actions and (B, H, A) chunks."""
        if self.low is None or self.high is None:
            return None
        a = self.shape[-1] if self.shape else 1
        return (np.broadcast_to(np.asarray(self.low, np.float32), (a,)).copy(),
                np.broadcast_to(np.asarray(self.high, np.float32), (a,)).copy())


@dataclass(frozen=True)
class StepResult:
    """One vectorized step.

    obs: Observation of the *next* step (for finished envs: the first obs of the new episode).
    reward: (B,) float32. terminated: (B,) bool (task ended: success/failure).
    truncated: (B,) bool (time limit or worker restart; bootstrap from ``info["final_obs"]``).
    info: ``success`` (B,) bool always; ``final_obs`` Observation of batch B (rows valid where
    terminated|truncated) when any env finished; simulator-specific extras.
    """

    obs: Observation
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]


@runtime_checkable
class VecEnv(Protocol):
    """A batch of B environments with auto-reset."""

    num_envs: int
    obs_spec: dict[str, ArraySpec]
    action_spec: ArraySpec

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Reset all envs; env i is seeded ``seed + i`` (deterministic per env)."""
        ...

    def step(self, actions: np.ndarray) -> StepResult:
        """actions: (B, A) or (B, H, A) float32 within ``action_spec`` bounds."""
        ...

    def render(self) -> np.ndarray | None:
        """(B, H, W, 3) uint8 frames for videos, or None if rendering is off."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class PerEnvReset(Protocol):
    """A VecEnv that can seed each env on its own (group rollouts: n envs from one initial state)."""

    def reset_each(self, seeds: list[int | None]) -> tuple[Observation, dict[str, Any]]:
        """Reset every env, env i seeded ``seeds[i]`` (equal seeds give equal initial states)."""
        ...


@runtime_checkable
class Steerable(Protocol):
    """A flow policy RL^2 latent steering can wrap (``robo-rl steer``)."""

    def steered(self, cfg: Any) -> Any:
        """This policy, frozen, plus a latent velocity head and a failure gate built from ``cfg``
        (a ``robo_rl.algorithms.rl2.SteeringConfig``): a ``Policy`` with ``steering_loss``."""
        ...


@runtime_checkable
class SimulatorSupport(Protocol):
    """What evaluation and benchmarks need from a simulator beyond its VecEnv; one per simulator in
    ``robo_rl.registry.SIMULATORS``. ``env_cfg`` is that simulator's env config dataclass."""

    name: str
    packages: tuple[str, ...]  # distribution names whose versions a benchmark result records

    def expert_block(self, env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
        """(episodes, successes, return sum) of the privileged scripted expert; episode j seeded ``seed + j``."""
        ...

    def reference_env(self, task: str | None) -> Any:
        """The env config a benchmark evaluates in when no trained run supplies one."""
        ...

    def backend(self, env_cfg: Any) -> dict[str, str]:
        """``physics`` and ``render`` backends ``env_cfg`` runs on here."""
        ...

    def suite_size(self, suite: str) -> int:
        """Number of tasks in a task suite (ConfigError where the simulator has no suites)."""
        ...


@dataclass
class PolicyOutput:
    """What ``Policy.act`` returns.

    actions: (B, A) or (B, H, A) float32 tensor in env units.
    log_prob: (B,) log-probability of ``extras`` under the policy (None for deterministic policies).
    value: (B,) critic estimate, or None for policies without a critic.
    extras: tensors ``evaluate`` needs to recompute log_prob (e.g. pre-squash samples, action
    tokens, flow noise path), each with leading dim B.
    """

    actions: Any
    log_prob: Any = None
    value: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """One contract for MLPs, token VLAs, flow VLAs and steered policies, in sim and on robots."""

    def act(self, obs: Observation, deterministic: bool = False) -> PolicyOutput: ...

    def evaluate(self, obs: Observation, extras: dict[str, Any]) -> tuple[Any, Any, Any]:
        """Return (log_prob (B,), entropy (B,), value (B,)) for what ``act`` produced."""
        ...

    def value(self, obs: Observation) -> Any:
        """(B,) critic estimate."""
        ...

    def reset(self, env_ids: Any = None) -> None:
        """Clear per-env state (action-chunk queues, recurrent state) for ``env_ids`` (None = all)."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    """Pure learning math over a batch; no I/O."""

    def update(self, batch: Any) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class OnPolicyAlgorithm(Algorithm, Protocol):
    """An algorithm that learns from its policy's own rollouts: it owns how collected
    ``robo_rl.batch.Trajectories`` (T, B) become the flat ``RolloutBatch`` its ``update`` consumes
    (advantages and returns from its estimator, e.g. GAE)."""

    def prepare(self, traj: Any) -> Any:
        """(T, B) trajectories -> RolloutBatch of N = T*B transitions."""
        ...


@runtime_checkable
class RobotBridge(Protocol):
    """A real (or simulated) robot behind ROS 2 or a vendor SDK."""

    def connect(self) -> None: ...

    def get_observation(self) -> Observation: ...

    def send_action(self, action: np.ndarray) -> None: ...

    def stop(self) -> None:
        """Bring the robot to a safe stop (hold position, zero velocity)."""
        ...

    def disconnect(self) -> None: ...
