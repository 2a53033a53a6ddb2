"""Reference policies for benchmarks: ``random`` (a floor) and ``expert`` (a ceiling).

``random`` is a ``Policy``: uniform actions in the env's action box from a seeded generator; it
runs through the vector envs like any trained policy. ``expert`` is the simulator's privileged
scripted expert, from its ``SimulatorSupport`` (ManiSkill: its own motion-planning solutions in
``pd_joint_pos``; LIBERO: the pick-and-place expert for In/On goals). Experts read simulator state and drive the env themselves,
so they run in-process, one episode after another, on the same seeds and init states the vector
envs give a policy (episode j of a block with seed S uses seed / init state S + j) and with the
same variations. A privileged expert does not look at images: a vision split cannot hurt it.
"""

from __future__ import annotations

from typing import Any

import torch

from robo_rl.contracts import ArraySpec, PolicyOutput, SimulatorSupport
from robo_rl.errors import ConfigError
from robo_rl.registry import SIMULATORS

REFERENCE_POLICIES = ("random", "expert")


class UniformRandomPolicy:
    """Uniform actions in [low, high]^A (B, A); seeded by ``seed``, stateless across episodes."""

    def __init__(self, action_spec: ArraySpec, seed: int = 0) -> None:
        bounds = action_spec.bounds()
        if bounds is None:
            raise ConfigError("the random policy needs an action space with bounds")
        self.spec = action_spec
        self.low, self.high = (torch.from_numpy(b) for b in bounds)
        self.gen = torch.Generator().manual_seed(seed)

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        b = len(next(v for v in obs.values() if hasattr(v, "shape")))
        u = torch.rand((b, *self.spec.shape), generator=self.gen)
        return PolicyOutput(self.low + u * (self.high - self.low))

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Any]) -> tuple[Any, Any, Any]:
        raise NotImplementedError("the random reference policy is not trainable")

    def value(self, obs: dict[str, Any]) -> Any:
        raise NotImplementedError("the random reference policy has no critic")

    def reset(self, env_ids: Any = None) -> None:
        return None

    def eval(self) -> UniformRandomPolicy:
        return self


def expert_block(env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
    """(episodes, successes, return sum) of the simulator's scripted expert on ``episodes`` episodes from
    ``seed`` (the simulator's ``SimulatorSupport`` in ``robo_rl.registry.SIMULATORS``)."""
    return simulator_support(env_cfg.name, "a scripted expert").expert_block(env_cfg, episodes, seed)


def reference_env(sim: str, task: str | None) -> Any:
    """The env a reference policy is evaluated in (the simulator's default benchmark env; ``task`` picks
    the task: a ManiSkill task id, or ``SUITE/INDEX`` of a LIBERO suite)."""
    return simulator_support(sim, "reference envs").reference_env(task)


def simulator_support(sim: str, what: str) -> SimulatorSupport:
    """The registered ``SimulatorSupport`` of ``sim``; a one-line error naming those that have one."""
    if sim not in SIMULATORS:
        raise ConfigError(f"no {what} for simulator {sim!r}; simulators with one: {', '.join(SIMULATORS.names())}")
    return SIMULATORS.get(sim)
