"""Capabilities beyond ``act``/``evaluate``/``value`` (policies) and ``update`` (algorithms), as small
named Protocols. An algorithm that needs one checks it once, when it is built, with ``require`` (a
one-line error naming what is missing); loops test ``isinstance`` once, never ``hasattr`` per step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from robo_rl.contracts import Observation
from robo_rl.errors import ConfigError


@runtime_checkable
class SeparateCritic(Protocol):
    """A policy whose critic parameters can be told apart (own learning rate, actor-only clipping)."""

    def value_parameters(self) -> Iterable[Any]:
        """The critic's parameters (a subset of ``parameters()``)."""
        ...


@runtime_checkable
class FineRatios(Protocol):
    """A policy whose ``evaluate`` scores finer units than one log-prob per transition: (N, U) log-probs
    (e.g. each executed action, or each action element). PPO then takes one ratio per unit, recomputing
    the old log-probs per unit before the update (``act`` still returns one per transition)."""

    ratio_unit: str
    """"chunk" (one log-prob per transition, as ``act``'s) or the finer unit's name."""


@runtime_checkable
class RunningNormalizer(Protocol):
    """A policy normalizing its inputs with running statistics the trainer feeds."""

    def update_normalizer(self, obs: Observation) -> None:
        """Fold a batch of (torch) observations into the running input statistics."""
        ...


@runtime_checkable
class StateStats(Protocol):
    """A policy with fixed input statistics fitted to demonstrations (pi0: state mean/std)."""

    def fit_state_stats(self, states: Any) -> None:
        """``states`` (N, D): set the state normalization from them."""
        ...


@runtime_checkable
class ActionStats(Protocol):
    """A policy with fixed output statistics fitted to demonstrations (token bins, flow normalization)."""

    def fit_action_stats(self, actions: Any, keep_last: bool = False) -> None:
        """``actions`` (N, A); ``keep_last``: leave the last dimension (a gripper) unnormalized."""
        ...


@runtime_checkable
class TokenScorer(Protocol):
    """A policy that scores its own action tokens (or denoising transitions): on-policy distillation."""

    def token_log_probs(self, obs: Observation, extras: dict[str, Any]) -> Any:
        """(B, K) log-probabilities of the K tokens/transitions recorded in ``extras``."""
        ...

    def token_space(self) -> dict[str, Any]:
        """What a token means (vocabulary, bins, chunk layout): teacher and student must agree."""
        ...


@runtime_checkable
class TokenDistributions(Protocol):
    """A token scorer that also hands out the whole distribution of each token or transition (exact-KL
    on-policy distillation)."""

    def token_distributions(self, obs: Observation, extras: dict[str, Any]) -> Any:
        """``torch.distributions.Distribution`` of batch shape (B, K), the K tokens/transitions of
        ``token_log_probs``, each conditioned on what ``extras`` recorded before it; differentiable."""
        ...


@runtime_checkable
class GaussianActions(Protocol):
    """A policy whose action distribution per state is a diagonal Gaussian it can hand out (MLP, CNN):
    distillation towards a teacher's fitted Gaussian (RPD's KL variant)."""

    def action_distribution(self, obs: Observation) -> Any:
        """``torch.distributions.Normal`` with mean and std (B, A) on ``obs``, differentiable in the weights."""
        ...


@runtime_checkable
class Imitator(Protocol):
    """A policy with its own imitation objective (flow matching, token cross-entropy)."""

    def imitation_loss(self, obs: Observation, actions: Any, valid: Any = None) -> Any:
        """Loss of expert actions (B, A) or chunks (B, H, A) with ``valid`` (B, H); or (loss, entropy)."""
        ...


@runtime_checkable
class SelfImitator(Protocol):
    """A policy that can imitate its own sampled actions from what ``act`` recorded (a flow policy: the
    flow-matching loss on its own chunks trains the velocity field its deterministic ODE follows)."""

    def self_imitation_loss(self, obs: Observation, extras: dict[str, Any], weights: Any) -> Any:
        """Imitation loss of the actions recorded in ``extras`` (N rows), row i weighted by ``weights[i]`` >= 0."""
        ...


@runtime_checkable
class ScoreAndImitate(Protocol):
    """A ``SelfImitator`` that scores its recorded actions and imitates them from one pass over the
    observations (a VLA's prefix embedded once, not once per term)."""

    def score_and_imitate(self, obs: Observation, extras: dict[str, Any], weights: Any,
                          per_token: bool) -> tuple[Any, Any, Any]:
        """(log-probs, entropy, self-imitation loss): ``token_log_probs(obs, extras)`` and no entropy
        (None) if ``per_token``, else ``evaluate(obs, extras)``'s log-prob and entropy; the last term is
        ``self_imitation_loss(obs, extras, weights)``."""
        ...


@runtime_checkable
class TeacherGuided(Protocol):
    """An algorithm that learns from a teacher policy (RPD, OPD); the trainer loads the teacher and hands
    it over when ``needs_teacher()`` says the configured run will ask it anything."""

    def needs_teacher(self) -> bool: ...

    def set_teacher(self, teacher: Any, student_action_shape: tuple[int, ...],
                    teacher_action_shape: tuple[int, ...]) -> None: ...


@runtime_checkable
class RolloutMode(Protocol):
    """An algorithm that may collect with the policy's deterministic action (the path greedy evaluation
    takes) instead of a sampled one; the trainer then wraps the rollout policy in ``Greedy``."""

    def greedy_rollouts(self) -> bool: ...


@runtime_checkable
class ReferencePolicy(Protocol):
    """An algorithm that regularises towards a frozen copy of the policy it started from (KL to the
    initial policy); the runner calls ``snapshot_reference`` once the starting weights are in (after
    ``run.init_from``), and a resume restores the copy from the algorithm's state."""

    def snapshot_reference(self) -> None: ...


@runtime_checkable
class ProgressAware(Protocol):
    """An algorithm with schedules over the run (learning-rate decay, teacher weight annealing)."""

    def set_progress(self, fraction_done: float, env_steps: int | None = None) -> None:
        """``fraction_done`` in [0, 1]: env steps so far / total; ``env_steps``: so far (schedules with a
        horizon of their own, e.g. RPD's ``anneal_env_steps``)."""
        ...


@runtime_checkable
class GroupRollouts(Protocol):
    """An algorithm that trains on group rollouts (n episodes per initial state) instead of a fixed-length
    rollout: the trainer collects with ``robo_rl.rollout.groups.GroupCollector``."""

    def rollout_groups(self) -> dict[str, Any]:
        """``GroupCollector`` keyword arguments (group_size, min_groups, max_rounds, max_steps, group_return,
        group_seeds)."""
        ...


def require(obj: Any, capability: type, role: str, needed_by: str) -> None:
    """One-line ConfigError unless ``obj`` has ``capability`` (e.g. role "policy", needed_by "OPD")."""
    if not isinstance(obj, capability):
        methods = [m for m, v in vars(capability).items()
                   if callable(v) and not m.startswith("_") and not hasattr(obj, m)]
        raise ConfigError(f"{role} {type(obj).__name__} is not {capability.__name__} (no {', '.join(methods)}); "
                          f"{needed_by} needs it")
