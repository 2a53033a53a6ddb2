"""Capabilities are named Protocols: the real policies have the ones their algorithms need, and a policy
without one is refused when the algorithm is built, with the capability and its missing methods named."""

from __future__ import annotations

import pytest
import torch

from policies.mlp import MLPActorCritic, MLPConfig
from robo_rl.algorithms.opd import OPD, OPDConfig
from robo_rl.capabilities import Imitator, RunningNormalizer, SeparateCritic, TokenScorer
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError


def _mlp() -> MLPActorCritic:
    return MLPActorCritic(MLPConfig(hidden=(8,)), {"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1, 1))


def test_the_mlp_policy_declares_what_ppo_and_opd_use():
    p = _mlp()
    assert isinstance(p, SeparateCritic) and isinstance(p, RunningNormalizer) and isinstance(p, TokenScorer)
    assert not isinstance(p, Imitator)  # BC uses its log-likelihood instead


def test_opd_refuses_a_policy_that_cannot_score_tokens():
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    with pytest.raises(ConfigError, match=r"policy Plain is not TokenScorer \(no token_log_probs, token_space\); OPD"):
        OPD(OPDConfig(teacher="runs/teacher"), Plain())
