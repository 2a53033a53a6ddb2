"""pi0-style flow VLA (tiny, random init, on transformers' PI0 modules): the ODE sampler equals
transformers' own ``sample_actions``; stochastic samplers with zero noise reproduce it; stored
samples re-score to the same log-probs; PPO moves log-probs the right way; flow matching learns;
bad input is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.algorithms.ppo import PPO, PPOConfig
from robo_rl.batch import RolloutBatch
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError
from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig
from vla.pi0.sampling import SamplerConfig, sample

OBS_SPEC = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
ACT = ArraySpec((7,), "float32", -1.0, 1.0)
INSTR = ["pick up the cube", "push the cube", "a", "stack the red cube on the green cube"]


def _policy(**kw) -> Pi0Policy:
    torch.manual_seed(0)
    kw.setdefault("exec_steps", 3)
    return Pi0Policy(Pi0PolicyConfig(**kw), OBS_SPEC, ACT).eval()


def _obs(b: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"rgb": torch.from_numpy(rng.integers(0, 255, (b, 1, 32, 32, 3), dtype=np.uint8)),
            "state": torch.from_numpy(rng.normal(size=(b, 5)).astype(np.float32)),
            "instruction": [INSTR[i % 4] for i in range(b)]}


def test_ode_sampler_is_transformers_pi0_sample_actions():
    p = _policy()
    obs = _obs()
    arch = p.model.arch
    x0 = torch.randn(4, arch.chunk_size, arch.max_action_dim)
    with torch.no_grad():
        pre, state = p.prefix(obs)
        ours = sample(p.model, pre, state, x0, SamplerConfig("ode"), p.log_prob_mask()).actions
        ids, mask = p.prompts(obs, 4)
        img = torch.full((4, arch.tokens_per_image), arch.image_token_id)
        ref = p.model.hf.sample_actions(state, torch.cat([img, ids], 1), p.pixels(obs["rgb"]), noise=x0.clone(),
                                        attention_mask=torch.cat([torch.ones_like(img), mask], 1),
                                        pixel_attention_mask=torch.ones(4, 1, dtype=torch.bool))
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


def test_stochastic_samplers_with_zero_noise_are_the_euler_ode():
    p = _policy()
    obs = _obs()
    arch = p.model.arch
    x0 = torch.randn(4, arch.chunk_size, arch.max_action_dim)
    with torch.no_grad():
        pre, state = p.prefix(obs)
        ode = sample(p.model, pre, state, x0, SamplerConfig("ode"), p.log_prob_mask()).path
        sde = sample(p.model, pre, state, x0, SamplerConfig("sde", noise_level=0.0), p.log_prob_mask()).path
        fn = sample(p.model, pre, state, x0, SamplerConfig("noise"), p.log_prob_mask(), p.noise_head, noise_scale=0.0).path
        noisy = sample(p.model, pre, state, x0, SamplerConfig("noise"), p.log_prob_mask(), p.noise_head).path
    torch.testing.assert_close(sde, ode, atol=0, rtol=0)
    torch.testing.assert_close(fn, ode, atol=0, rtol=0)
    assert (noisy - ode).abs().max() > 1e-3  # and with noise they differ


@pytest.mark.parametrize("sampler", ["sde", "noise"])
def test_act_log_probs_equal_evaluate_and_exclude_padding(sampler):
    p = _policy(sampler=sampler)
    obs = _obs(6)
    with torch.no_grad():
        out = p.act(obs, return_latents=True)
        lp, ent, value = p.evaluate(obs, out.extras)
    arch = p.model.arch
    assert out.actions.shape == (6, 3, 7)  # exec_steps x the env's action dim
    assert out.extras["path"].shape == (6, arch.num_steps + 1, arch.chunk_size, arch.max_action_dim)
    assert out.extras["latents"].shape == (6, arch.num_steps, arch.chunk_size, arch.expert_hidden)
    torch.testing.assert_close(lp, out.log_prob, atol=1e-5, rtol=0)
    assert torch.isfinite(ent).all() and value.shape == (6,)
    if sampler == "sde":
        assert set(out.extras["step"].tolist()) <= set(range(arch.num_steps))
    # the final sample's padding (the 8th action dim, the unexecuted 4th step) carries no log-prob
    path = out.extras["path"].clone()
    path[:, -1, :, 7] += 5.0
    path[:, -1, 3, :] += 5.0
    with torch.no_grad():
        lp2, _, _ = p.evaluate(obs, {**out.extras, "path": path})
    torch.testing.assert_close(lp2, lp, atol=1e-5, rtol=0)


def test_deterministic_act_is_reproducible_and_unnormalized():
    p = _policy()
    p.set_norm_stats(action_mean=[0.5] * 7, action_std=[2.0] * 7)
    obs = _obs(2)
    with torch.no_grad():
        a, b = p.act(obs, deterministic=True).actions, p.act(obs, deterministic=True).actions
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    with torch.no_grad():
        pre, state = p.prefix(obs)
        x = sample(p.model, pre, state, torch.zeros(2, 4, 8), SamplerConfig("ode"), p.log_prob_mask()).actions
    torch.testing.assert_close(a, x[:, :3, :7] * 2.0 + 0.5)


@pytest.mark.parametrize("sampler", ["sde", "noise"])
def test_ppo_update_raises_log_prob_of_advantaged_chunks(sampler):
    p = _policy(sampler=sampler)
    obs = _obs(8)
    with torch.no_grad():
        out = p.act(obs)
    adv = torch.tensor([1.0, -1.0] * 4)
    stored = {k: v for k, v in obs.items() if k != "instruction"}  # rollout buffers keep tensors only
    batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, out.value + adv)
    algo = PPO(PPOConfig(lr=1e-3, epochs=4, minibatches=1, target_kl=None, norm_adv=False, value_lr=1e-3), p)
    p.train()
    algo.update(batch)
    with torch.no_grad():
        new_lp, _, _ = p.evaluate(stored, out.extras)
    delta = new_lp - out.log_prob
    # the chunks share one network, so single rows may trade off; each group moves the right way
    assert delta[adv > 0].mean() > 0 and delta[adv < 0].mean() < 0, delta
    assert (delta[adv > 0] > 0).sum() >= 3 and (delta[adv < 0] < 0).sum() >= 3, delta


def test_flow_matching_loss_falls_on_a_fixed_batch():
    p = _policy()
    obs = _obs(8)
    target = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (8, 4, 7)).astype(np.float32))
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    p.train()
    losses = []
    for _ in range(40):
        torch.manual_seed(123)  # the same t and noise every step: the loss on a fixed batch
        loss = p.imitation_loss(obs, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0], losses[::8]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ConfigError, match="renders 64x64 images but the pi0 model takes 32x32"):
        Pi0Policy(Pi0PolicyConfig(), {"rgb": ArraySpec((1, 64, 64, 3), "uint8")}, ACT)
    with pytest.raises(ConfigError, match="env takes 9-D actions but the pi0 model has max_action_dim 8"):
        Pi0Policy(Pi0PolicyConfig(), OBS_SPEC, ArraySpec((9,), "float32"))
    with pytest.raises(ConfigError, match="exec_steps = 5 exceeds the model's chunk of 4"):
        Pi0Policy(Pi0PolicyConfig(exec_steps=5), OBS_SPEC, ACT)
    with pytest.raises(ConfigError, match="sampler kind 'flow' is unknown"):
        Pi0PolicyConfig(sampler="flow")
    p = _policy()
    obs = _obs(2)
    with pytest.raises(ValueError, match="must be uint8"):
        p.act({**obs, "rgb": obs["rgb"].float()})
    with pytest.raises(ValueError, match=r"must have shape \(B, V, 32, 32, 3\)"):
        p.act({**obs, "rgb": torch.zeros(2, 1, 16, 16, 3, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="max_prompt_tokens = 48"):
        p.act({**obs, "instruction": ["x" * 60] * 2})
    with pytest.raises(ConfigError, match="the ode sampler has no log-probs"):
        _policy(sampler="ode").evaluate(obs, p.act(obs).extras)


def test_a_checkpoint_without_norm_stats_is_refused_unless_asked(tmp_path):
    p = _policy()
    p.model.hf.save_pretrained(tmp_path / "bare")  # transformers PI0 weights, no processor statistics
    with pytest.raises(ConfigError, match="carries no normalization statistics"):
        Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "bare")), OBS_SPEC, ACT)
    q = Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "bare"), require_norm_stats=False, exec_steps=3), OBS_SPEC, ACT)
    with torch.no_grad():
        torch.testing.assert_close(q.eval().act(_obs(2), deterministic=True).actions, p.act(_obs(2), deterministic=True).actions)


@pytest.mark.parametrize("sampler", ["sde", "noise"])
def test_ratio_units_divide_the_chunk_log_prob(sampler):
    """chunk = one log-prob per chunk (as act's); action / element = one per executed step / element, each
    the mean over the stochastic transitions, so K x the units' sum is the chunk's log-prob."""
    obs = _obs(3)
    chunk = _policy(sampler=sampler)
    with torch.no_grad():
        out = chunk.act(obs)
    n = chunk.model.arch.num_steps if sampler == "noise" else 1
    by_unit = {}
    for unit in ("action", "element"):
        p = _policy(sampler=sampler, ratio_unit=unit)
        p.load_state_dict(chunk.state_dict())
        with torch.no_grad():
            by_unit[unit] = p.evaluate(obs, out.extras)[0]
    assert by_unit["action"].shape == (3, 3) and by_unit["element"].shape == (3, 3 * 7)
    torch.testing.assert_close(by_unit["action"].sum(-1) * n, out.log_prob, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(by_unit["element"].view(3, 3, 7).sum(-1), by_unit["action"], atol=1e-4, rtol=1e-5)


def test_ppo_with_element_ratios_moves_the_advantaged_chunks_and_clips_per_element():
    from robo_rl.algorithms.ppo import ppo_losses

    p = _policy(sampler="noise", ratio_unit="element")
    obs = _obs(8)
    with torch.no_grad():
        out = p.act(obs)
    adv = torch.tensor([1.0, -1.0] * 4)
    stored = {k: v for k, v in obs.items() if k != "instruction"}
    batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, out.value + adv)
    with torch.no_grad():
        before = p.evaluate(stored, out.extras)[0]
    algo = PPO(PPOConfig(lr=1e-3, epochs=4, minibatches=2, target_kl=None, norm_adv=False, value_lr=1e-3), p)
    p.train()
    algo.update(batch)  # the stored (N,) log-probs are re-scored per element before the first step
    with torch.no_grad():
        delta = (p.evaluate(stored, out.extras)[0] - before).sum(-1)
    assert delta[adv > 0].mean() > 0 and delta[adv < 0].mean() < 0, delta
    # one element far outside the clip range is clipped alone: the loss is the mean of per-element terms
    old = torch.zeros(1, 4)
    new = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    terms = ppo_losses(new, old, torch.ones(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), 0.2, None)
    assert terms["policy_loss"].item() == pytest.approx(-(3 * 1.0 + 1.2) / 4)
    assert terms["clip_frac"].item() == pytest.approx(0.25)


def test_log_variance_noise_head_spans_its_bounds_geometrically():
    from vla.pi0.sampling import NoiseHead

    head = NoiseHead(4, 2, 0.08, 0.16, space="logvar")
    h, t = torch.zeros(1, 1, 4), torch.zeros(1)
    assert head(h, t).flatten()[0].item() == pytest.approx((0.08 * 0.16) ** 0.5, rel=1e-6)  # the geometric mean
    with torch.no_grad():
        head.proj.bias.fill_(50.0)
    assert head(h, t).flatten()[0].item() == pytest.approx(0.16, rel=1e-5)
    linear = NoiseHead(4, 2, 0.08, 0.16)
    assert linear(h, t).flatten()[0].item() == pytest.approx(0.12)
    with pytest.raises(ConfigError, match="policy.noise_space"):
        NoiseHead(4, 2, 0.08, 0.16, space="log")
    with pytest.raises(ConfigError, match="policy.ratio_unit"):
        _policy(ratio_unit="token")


def test_state_clip_bounds_the_normalized_state_and_leaves_in_range_states_alone():
    """policy.state_clip=c: a state 40 std out enters the model at c std; states within c are untouched."""
    from robo_rl.errors import ConfigError

    plain, clipped = _policy(), _policy(state_clip=3.0)
    for p in (plain, clipped):
        p.set_norm_stats(state_mean=torch.zeros(5), state_std=torch.full((5,), 0.5))
    inside = torch.tensor([[0.5, -1.0, 0.0, 1.4, -1.4]])  # within 3 std (1.5)
    far = torch.tensor([[20.0, -20.0, 0.0, 0.0, 0.0]])  # 40 std out
    assert torch.equal(clipped.state({"state": inside}, 1), plain.state({"state": inside}, 1))
    assert plain.state({"state": far}, 1)[0, :2].tolist() == [40.0, -40.0]
    assert clipped.state({"state": far}, 1)[0, :2].tolist() == [3.0, -3.0]
    with pytest.raises(ConfigError, match="state_clip"):
        Pi0PolicyConfig(state_clip=0.0)


def test_use_state_false_ignores_the_state_and_checkpoints_refuse_the_other_setting(tmp_path):
    """policy.use_state=false: actions do not depend on obs['state'] (they do with it on); the setting
    travels in state dicts and robo-rl directories, and loading weights trained the other way is refused."""
    blind, seeing = _policy(use_state=False), _policy()
    a, b = _obs(), _obs()
    b["state"] = b["state"] + 3.0
    with torch.no_grad():
        assert torch.equal(blind.act(a, deterministic=True).actions, blind.act(b, deterministic=True).actions)
        assert not torch.equal(seeing.act(a, deterministic=True).actions, seeing.act(b, deterministic=True).actions)
    assert float(blind.state_dict()["uses_state"]) == 0.0
    with pytest.raises(ConfigError, match="trained without the state.*set policy.use_state: false"):
        _policy().load_state_dict(blind.state_dict())
    with pytest.raises(ConfigError, match="trained with the state.*set policy.use_state: true"):
        _policy(use_state=False).load_state_dict(seeing.state_dict())
    old = {k: v for k, v in seeing.state_dict().items() if k != "uses_state"}  # saved before the setting existed
    _policy().load_state_dict(old)
    blind.save_pretrained(tmp_path / "blind")
    with pytest.raises(ConfigError, match="trained without the state"):
        Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "blind"), exec_steps=3), OBS_SPEC, ACT)
    again = Pi0Policy(Pi0PolicyConfig(checkpoint=str(tmp_path / "blind"), exec_steps=3, use_state=False), OBS_SPEC, ACT)
    assert float(again.uses_state) == 0.0


def test_a_run_checkpoint_from_before_use_state_loads_as_trained_with_the_state(tmp_path):
    """``robo_rl.checkpoint.load_into`` (run checkpoints, run.init_from): a state dict without ``uses_state``
    loads into a policy that uses the state, and is refused by one that does not."""
    from robo_rl.checkpoint import load_into
    from robo_rl.errors import CheckpointError

    src = _policy()
    old = {k: v for k, v in src.state_dict().items() if k != "uses_state"}
    dst = _policy()
    torch.nn.init.zeros_(dst.value_head[0].weight)
    load_into(dst, old, tmp_path)
    assert torch.equal(dst.value_head[0].weight, src.value_head[0].weight)
    with pytest.raises(ConfigError, match="set policy.use_state: true"):
        load_into(_policy(use_state=False), old, tmp_path)
    with pytest.raises(CheckpointError, match="missing"):
        load_into(_policy(), {k: v for k, v in old.items() if k != "state_mean"}, tmp_path)
