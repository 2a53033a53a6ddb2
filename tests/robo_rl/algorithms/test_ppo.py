import math

import pytest
import torch

from robo_rl.algorithms.ppo import PPO, PPOConfig, ppo_losses
from robo_rl.errors import ConfigError


def test_ppo_losses_match_hand_computation():
    old = torch.tensor([0.0, 0.0, 0.0])
    new = torch.tensor([math.log(1.5), math.log(0.5), math.log(1.1)])  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, -2.0, 3.0])
    terms = ppo_losses(new, old, adv, new_value=torch.tensor([1.0, 0.0, 2.0]), old_value=torch.tensor([0.0, 0.0, 0.0]),
                       returns=torch.tensor([2.0, 1.0, 0.0]), clip_coef=0.2, clip_value=0.5)
    # per-sample max(-A r, -A clip(r)): [-1.2, max(1.0, 1.6)=1.6, -3.3]
    assert terms["policy_loss"].item() == pytest.approx((-1.2 + 1.6 - 3.3) / 3, abs=1e-6)
    # values: unclipped (v-R)^2 = [1, 1, 4]; clipped v = [0.5, 0, 0.5] -> [2.25, 1, 0.25]; max = [2.25, 1, 4]
    assert terms["value_loss"].item() == pytest.approx(0.5 * (2.25 + 1 + 4) / 3, abs=1e-6)
    r = torch.tensor([1.5, 0.5, 1.1])
    assert terms["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item(), abs=1e-6)
    assert terms["clip_frac"].item() == pytest.approx(2 / 3)


def test_value_loss_unclipped_when_disabled():
    z = torch.zeros(2)
    terms = ppo_losses(z, z, z, torch.tensor([1.0, 3.0]), z, torch.tensor([0.0, 0.0]), 0.2, None)
    assert terms["value_loss"].item() == pytest.approx(0.5 * (1 + 9) / 2)


def _toy_batch(n=64):
    from robo_rl.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.randn(n, 4, generator=g)}
    action = torch.randn(n, 2, generator=g)
    return RolloutBatch(obs, {"action": action}, log_prob=torch.full((n,), -2.0), values=torch.zeros(n),
                        advantages=obs["state"][:, 0].clone(), returns=obs["state"][:, 0].clone())


def test_ppo_update_moves_policy_toward_positive_advantages():
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.contracts import ArraySpec

    torch.manual_seed(0)
    pol = MLPActorCritic(MLPConfig(hidden=(32,), normalize_obs=False), {"state": ArraySpec((4,), "float32")},
                         ArraySpec((2,), "float32", -1, 1))
    batch = _toy_batch()
    with torch.no_grad():
        lp, _, _ = pol.evaluate(batch.obs, batch.extras)
    batch.log_prob = lp.clone()
    algo = PPO(PPOConfig(epochs=4, minibatches=2, target_kl=None, lr=1e-3), pol, generator=torch.Generator().manual_seed(0))
    out = algo.update(batch)
    with torch.no_grad():
        lp2, _, v2 = pol.evaluate(batch.obs, batch.extras)
    adv = batch.advantages
    # log-prob of positive-advantage samples rises relative to negative ones; value fits the returns better
    assert ((lp2 - lp) * adv).sum() > 0
    assert ((v2 - batch.returns) ** 2).mean() < (batch.returns ** 2).mean()
    assert {"policy_loss", "value_loss", "approx_kl", "entropy", "grad_norm"} <= set(out)


def test_target_kl_stops_early():
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.contracts import ArraySpec

    pol = MLPActorCritic(MLPConfig(hidden=(16,), normalize_obs=False), {"state": ArraySpec((4,), "float32")},
                         ArraySpec((2,), "float32", -1, 1))
    batch = _toy_batch()
    with torch.no_grad():
        batch.log_prob = pol.evaluate(batch.obs, batch.extras)[0] - 1.0  # large KL from the start
    out = PPO(PPOConfig(epochs=10, minibatches=4, target_kl=0.01), pol).update(batch)
    assert out["epochs"] == 1.0


@pytest.mark.parametrize("kw", [{"gamma": 1.5}, {"lr": -1.0}, {"epochs": 0}, {"clip_coef": 0.0}])
def test_bad_ppo_config_values(kw):
    with pytest.raises(ConfigError):
        PPOConfig(**kw)


def test_whole_batch_advantage_normalization_equals_minibatch_with_one_minibatch():
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.algorithms.ppo import PPO, PPOConfig
    from robo_rl.contracts import ArraySpec

    def run(scope: str, minibatches: int) -> dict:
        torch.manual_seed(0)
        policy = MLPActorCritic(MLPConfig(hidden=(16,)), {"state": ArraySpec((4,), "float32")},
                                ArraySpec((2,), "float32", -1.0, 1.0))
        algo = PPO(PPOConfig(epochs=1, minibatches=minibatches, target_kl=None, norm_adv_scope=scope), policy,
                   generator=torch.Generator().manual_seed(1))
        algo.update(_toy_batch())
        return {k: v.clone() for k, v in policy.state_dict().items()}

    a, b = run("batch", 1), run("minibatch", 1)
    assert all(torch.equal(a[k], b[k]) for k in a)  # one minibatch: the same normalization
    c, d = run("batch", 4), run("minibatch", 4)
    assert not all(torch.equal(c[k], d[k]) for k in c)  # per-minibatch statistics differ from the batch's
