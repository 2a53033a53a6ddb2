"""Where the learner's policy runs (``run.device``): rollouts and their buffers stay on the CPU, next to
the env workers and numpy, while the policy's forward passes and the updates run on the device.

``OnDevice`` is the policy the rollout loops and evaluations see: it moves each observation's tensors to
the device before ``act``/``value`` and brings the outputs back to the CPU, so collectors, buffers and the
env boundary are unchanged (the same split as RLinf's and rsl_rl's runners: actors on the GPU, storage
filled with CPU tensors). Learning batches go to the device with :func:`to_device`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from robo_rl.contracts import PolicyOutput
from robo_rl.errors import ConfigError
from robo_rl.run_config import DEVICE_PATTERN


def resolve_device(name: str, key: str = "run.device") -> torch.device:
    """The torch device for ``name`` (``cpu``, ``cuda``, ``cuda:N``: checked when the config was parsed);
    one-line error where this machine has no such device, or for another name."""
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise ConfigError(f"{key} {name!r} is not a device; use cpu, cuda or cuda:N (e.g. cuda:0)")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} {name!r} but this machine has no CUDA device "
                              f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}); "
                              f"use {key} cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{key} {name!r} but this machine has {count} CUDA device(s); "
                              f"use cuda:0 .. cuda:{count - 1}")
    return device


def to_device(x: Any, device: torch.device) -> Any:
    """Tensors in ``x`` (a tensor, or dicts/lists/tuples of them) moved to ``device``; other values as
    they are (instruction strings)."""
    if isinstance(x, torch.Tensor):  # async only host -> GPU; a GPU -> host copy must be complete when read
        return x.to(device, non_blocking=device.type == "cuda")
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(to_device(v, device) for v in x)
    if isinstance(x, list) and x and isinstance(x[0], torch.Tensor):
        return [to_device(v, device) for v in x]
    return x


def _cpu(x: Any) -> Any:
    return None if x is None else to_device(x, torch.device("cpu"))


class OnDevice:
    """A policy on ``device`` seen from CPU rollout code: obs (B, ...) in, ``PolicyOutput`` on the CPU out.
    Everything else (reset, eval, train, attributes such as ``action_horizon``) is the wrapped policy's."""

    def __init__(self, policy: Any, device: torch.device) -> None:
        self.policy, self.device = policy, device

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        out = self.policy.act(to_device(obs, self.device), deterministic=deterministic)
        return PolicyOutput(_cpu(out.actions), _cpu(out.log_prob), _cpu(out.value), _cpu(out.extras))

    def value(self, obs: dict[str, Any]) -> Any:
        return _cpu(self.policy.value(to_device(obs, self.device)))

    def evaluate(self, obs: dict[str, Any], extras: dict[str, Any]) -> tuple[Any, Any, Any]:
        out = self.policy.evaluate(to_device(obs, self.device), to_device(extras, self.device))
        return tuple(_cpu(x) for x in out)  # type: ignore[return-value]

    def reset(self, env_ids: Any = None) -> None:
        self.policy.reset(env_ids)

    def __getattr__(self, name: str) -> Any:  # eval(), train(), action_horizon, ...
        return getattr(self.policy, name)


def place(module: Any, device: torch.device) -> Any:
    """``module`` moved to ``device``; on the CPU the module itself, untouched (a CPU run is exactly what it
    was before devices existed)."""
    return module if device.type == "cpu" else module.to(device)


def on_device(policy: Any, device: torch.device) -> Any:
    """``policy`` itself on the CPU (no copies, no wrapper), else its ``OnDevice`` view."""
    return policy if device.type == "cpu" else OnDevice(policy, device)


class Greedy:
    """A policy whose ``act`` is always its deterministic one (rollouts along the path greedy evaluation
    takes); a policy that gives no log-prob for it records zeros (B,). Everything else is the wrapped policy's."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def act(self, obs: dict[str, Any], deterministic: bool = True) -> PolicyOutput:
        out = self.policy.act(obs, deterministic=True)
        if out.log_prob is None:
            out = PolicyOutput(out.actions, torch.zeros(out.actions.shape[0]), out.value, out.extras)
        return out

    def __getattr__(self, name: str) -> Any:  # value(), reset(), eval(), action_horizon, ...
        return getattr(self.policy, name)
