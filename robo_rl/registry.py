"""Lazy name -> "module:Attr" registries.

Entries are import strings, so listing or validating names imports nothing heavy; the target is
imported on ``get``. Third-party packages add entries through the entry-point group
``robo_rl.<kind>`` (e.g. ``robo_rl.envs``) or by calling ``register`` at run time.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from robo_rl.errors import RegistryError


class Registry:
    """Maps names to lazily imported objects of one kind (``envs``, ``policies``, ``algorithms``)."""

    def __init__(self, kind: str, entries: dict[str, str] | None = None, singular: str | None = None) -> None:
        self.kind = kind
        self.singular = singular or kind.rstrip("s")
        self._entries: dict[str, str] = dict(entries or {})
        self._loaded: dict[str, Any] = {}
        self._plugins_read = False

    def register(self, name: str, target: str | Any) -> None:
        """Add ``name``; ``target`` is ``"module:Attr"`` or the object itself."""
        if isinstance(target, str):
            if ":" not in target:
                raise RegistryError(f"{self.kind} target {target!r} must look like 'package.module:Attr'")
            self._entries[name] = target
            self._loaded.pop(name, None)
        else:
            self._entries[name] = f"<object {target!r}>"
            self._loaded[name] = target

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a no-op if it is not registered)."""
        self._entries.pop(name, None)
        self._loaded.pop(name, None)

    def _read_plugins(self) -> None:
        if self._plugins_read:
            return
        self._plugins_read = True
        for ep in metadata.entry_points(group=f"robo_rl.{self.kind}"):
            self._entries.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._read_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._read_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def target(self, name: str) -> str:
        self.check(name)
        return self._entries[name]

    def check(self, name: str) -> None:
        """Raise a one-line error listing close matches if ``name`` is unknown."""
        if name in self:
            return
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise RegistryError(f"unknown {self.singular} {name!r}: "
                            f"{hint}known: {', '.join(self.names())}")

    def get(self, name: str) -> Any:
        """Import and return the object registered as ``name``."""
        self.check(name)
        if name not in self._loaded:
            module_name, _, attr = self._entries[name].partition(":")
            module = importlib.import_module(module_name)
            obj = module
            for part in attr.split("."):
                obj = getattr(obj, part)
            self._loaded[name] = obj
        return self._loaded[name]


# Built-in entries. Each target is a class with a nested frozen-dataclass ``Config``.
ENVS = Registry("envs", singular="env", entries={
    "maniskill": "sims.maniskill.env:ManiSkillVecEnv",
    "libero": "sims.libero.env:LiberoVecEnv",
    "isaacgym": "sims.isaacgym.env:IsaacGymVecEnv",
})
POLICIES = Registry("policies", singular="policy", entries={
    "mlp": "policies.mlp:MLPActorCritic",
    "cnn": "policies.cnn:CNNActorCritic",
    "openvla": "vla.openvla.policy:OpenVLAPolicy",
    "pi0": "vla.pi0.policy:Pi0Policy",
})
ALGORITHMS = Registry("algorithms", singular="algorithm", entries={
    "ppo": "robo_rl.algorithms.ppo:PPO",
    "rpd": "robo_rl.algorithms.rpd:RPD",
    "opd": "robo_rl.algorithms.opd:OPD",
    "bc": "robo_rl.algorithms.bc:BC",
    "grpo": "robo_rl.algorithms.grpo:GRPO",
})
# estimators that turn collected trajectories into advantages/returns (robo_rl.algorithms.advantages)
ADVANTAGES = Registry("advantages", singular="advantage estimator", entries={
    "gae": "robo_rl.algorithms.advantages:GAE",
    "group": "robo_rl.algorithms.advantages:GroupRelative",
})
# what evaluation and benchmarks need from a simulator beyond its VecEnv (robo_rl.contracts.SimulatorSupport)
SIMULATORS = Registry("simulators", singular="simulator", entries={
    "maniskill": "sims.maniskill.support:SUPPORT",
    "libero": "sims.libero.support:SUPPORT",
})
