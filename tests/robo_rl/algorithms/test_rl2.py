"""RL^2 latent steering: with the gate closed the steered policy is the frozen VLA bit for bit (even
with a trained head); with it open the actions move, per env; advantage-weighted flow matching fits
the head; AUROC is right on known cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.algorithms.rl2 import (
    MeanShiftHead,
    ShiftHead,
    SteeringConfig,
    VelocityHead,
    advantage_weights,
    auroc,
    compose,
    episode_gae,
    task_returns,
    youden_threshold,
)
from robo_rl.contracts import ArraySpec
from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig
from vla.pi0.steer import SteeredPi0Policy

OBS_SPEC = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
ACT = ArraySpec((7,), "float32", -1.0, 1.0)


def _steered(tau: float, seed: int = 0, baseline: bool = False, sampler: str = "sde") -> SteeredPi0Policy:
    torch.manual_seed(seed)
    base = Pi0Policy(Pi0PolicyConfig(exec_steps=3, sampler=sampler), OBS_SPEC, ACT)
    s = SteeredPi0Policy(base, SteeringConfig(beta=1.0, tau=tau, baseline=baseline))
    for p in s.head.parameters():  # a "trained" head: non-zero output
        torch.nn.init.normal_(p, std=0.5)
    return s


def _obs(b: int = 4) -> dict:
    rng = np.random.default_rng(0)
    return {"rgb": torch.from_numpy(rng.integers(0, 255, (b, 1, 32, 32, 3), dtype=np.uint8)),
            "state": torch.from_numpy(rng.normal(size=(b, 5)).astype(np.float32)), "instruction": ["pick"] * b}


@pytest.mark.parametrize("deterministic", [True, False])
def test_closed_gate_is_the_frozen_vla_bit_for_bit(deterministic):
    s = _steered(tau=1.1, sampler="ode")  # p_fail <= 1 < tau: never steer; ode = the base's deployed sampler
    obs = _obs()
    with torch.no_grad():  # sampled: the same seed draws the same x_0, so "off" is the deployed base exactly
        torch.manual_seed(7)
        base = s.base.act(obs, deterministic=deterministic).actions
        torch.manual_seed(7)
        out = s.act(obs, deterministic=deterministic)
        torch.manual_seed(8)
        other = s.act(obs, deterministic=deterministic).actions
    assert torch.equal(out.actions, base) and not out.extras["steered"].any()
    assert torch.equal(other, base) == deterministic  # x_0 = 0 ignores the seed; sampling does not


def test_open_gate_steers_only_the_gated_envs():
    s = _steered(tau=-0.1)  # always steer
    obs = _obs()
    with torch.no_grad():
        base = s.base.act(obs, deterministic=True).actions
        steered = s.act(obs, deterministic=True).actions
    assert (steered - base).abs().amax(dim=(1, 2)).min() > 1e-4
    v, phi = torch.ones(3, 2, 2), torch.full((3, 2, 2), 5.0)
    out = compose(v, phi, torch.tensor([True, False, True]), beta=0.5)
    assert torch.equal(out[1], v[1]) and torch.equal(out[0], v[0] + 2.5)


def test_advantage_weighted_flow_matching_fits_the_head():
    s = _steered(tau=1.1)
    assert isinstance(s.head, VelocityHead)
    torch.nn.init.zeros_(s.head.net[-1].weight)
    torch.nn.init.zeros_(s.head.net[-1].bias)
    obs = _obs(8)
    actions = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (8, 4, 7)).astype(np.float32))
    adv = torch.linspace(-1, 1, 8)
    opt = torch.optim.Adam(s.head.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        torch.manual_seed(7)  # the same t and noise: a fixed batch
        loss = s.steering_loss(obs, actions, adv)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert all(p.grad is None for p in s.base.parameters())  # the VLA stays frozen
    w = advantage_weights(torch.tensor([0.0, 10.0]), 1.0, 20.0)
    assert w.tolist() == [1.0, 20.0]


def test_auroc_on_known_cases():
    y = torch.tensor([0, 0, 1, 1])
    assert auroc(torch.tensor([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert auroc(torch.tensor([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert auroc(torch.tensor([0.5, 0.5, 0.5, 0.5]), y) == 0.5
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), y) == 0.75


def _fit_shift(s: SteeredPi0Policy, obs: dict, actions: torch.Tensor, adv: torch.Tensor, steps: int) -> None:
    opt = torch.optim.Adam(s.head.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = s.steering_loss(obs, actions, adv)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("shared", [True, False])
def test_shift_head_without_advantage_signal_leaves_the_vla_unchanged(shared):
    """Equal advantages: h_w and h_1 see the same weights and samples, so v_phi = h_w - h_1 stays 0 and
    always-on steering is the base VLA bit for bit, though each part alone has learned a non-zero field.
    The shared head needs no help for this (its flag's weights get zero gradient); two heads must start
    equal."""
    torch.manual_seed(0)
    s = SteeredPi0Policy(Pi0Policy(Pi0PolicyConfig(exec_steps=3), OBS_SPEC, ACT),
                         SteeringConfig(tau=-0.1, shared_head=shared))
    assert isinstance(s.head, ShiftHead) and s.head.shared == shared
    if not shared:
        s.head.h_reference.load_state_dict(s.head.h_weighted.state_dict())
    obs = _obs(8)
    actions = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (8, 4, 7)).astype(np.float32))
    _fit_shift(s, obs, actions, torch.full((8,), 0.7), steps=5)
    with torch.no_grad():
        base = s.base.act(obs, deterministic=True).actions
        out = s.act(obs, deterministic=True)
        x, t = torch.randn(2, 4, 32), torch.rand(2)
        first = (s.head.cond if shared else s.head.h_weighted).net[0]
        z = torch.randn(2, 4, first.in_features - 32 - 1 - int(shared))  # x (32), z, [flag], t
        assert s.head.weighted(x, t, z).abs().max() > 1e-3
        assert torch.equal(s.head.weighted(x, t, z), s.head.reference(x, t, z))
    assert out.extras["steered"].all() and torch.equal(out.actions, base)


@pytest.mark.parametrize("shared", [True, False])
def test_shift_head_moves_actions_towards_the_advantaged_chunk(shared):
    """The same observation logged with a +0.6 chunk (advantage +1) and a -0.6 chunk (advantage -1): the
    steered policy's action moves up from the base's, by the advantage weighting alone."""
    torch.manual_seed(0)
    s = SteeredPi0Policy(Pi0Policy(Pi0PolicyConfig(exec_steps=3), OBS_SPEC, ACT),
                         SteeringConfig(beta=1.0, tau=-0.1, shared_head=shared))
    obs = {k: (v[:1].repeat(16, *[1] * (v.dim() - 1)) if torch.is_tensor(v) else v[:1] * 16) for k, v in _obs(1).items()}
    actions = torch.cat([torch.full((8, 4, 7), 0.6), torch.full((8, 4, 7), -0.6)])
    adv = torch.cat([torch.ones(8), -torch.ones(8)])
    torch.manual_seed(3)
    _fit_shift(s, obs, actions, adv, steps=60)
    with torch.no_grad():
        base = s.base.act(_obs(1) | {"rgb": obs["rgb"][:1], "state": obs["state"][:1]}, deterministic=True).actions
        steered = s.act({k: v[:1] for k, v in obs.items()}, deterministic=True).actions
    shift = (steered - base).mean()
    assert shift > 0.05, float(shift)


def test_youden_threshold_and_config_checks():
    p, y = torch.tensor([0.1, 0.3, 0.6, 0.9]), torch.tensor([0, 0, 1, 1])
    cut = youden_threshold(p, y)
    assert cut == pytest.approx(0.3) and ((p > cut) == y.bool()).all()
    assert youden_threshold(torch.tensor([0.2, 0.8, 0.4]), torch.tensor([0, 1, 1])) == pytest.approx(0.2)
    assert youden_threshold(p, torch.ones(4)) != youden_threshold(p, torch.ones(4))  # nan: one class
    with pytest.raises(ValueError, match="advantage"):
        SteeringConfig(advantage="reward")
    with pytest.raises(ValueError, match="head"):
        SteeringConfig(head="critic")
    with pytest.raises(ValueError, match="gae_lambda"):
        SteeringConfig(advantage="gae", gae_lambda=1.5)
    with pytest.raises(ValueError, match="returns"):
        SteeringConfig(returns="shaped")
    for beta in (-1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="steering scale must be a finite number > 0"):
            SteeringConfig(beta=beta)


def test_success_returns_rank_an_early_success_above_a_long_failure():
    """Terminate-on-success: the successful episode (2 calls, shaped rewards 1, 1) has a smaller dense
    return-to-go than the failure that runs to the time limit (4 calls of 0.8), so dense advantages against a
    shared value point away from success; the success return ranks them the right way round."""
    rtg = torch.tensor([2.0, 1.0, 3.2, 2.4, 1.6, 0.8])
    failed = torch.tensor([False, False, True, True, True, True])
    episode = torch.tensor([0, 0, 1, 1, 1, 1])
    dense, success = task_returns(rtg, failed, "dense"), task_returns(rtg, failed, "success")
    assert torch.equal(dense, rtg) and dense[0] < dense[2]
    assert torch.equal(success, torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    v = torch.full((6,), 0.5)  # a value that cannot tell the two apart
    for lam in (0.5, 0.9, 1.0):  # (lam = 0 with a constant V credits only each episode's last call)
        adv = episode_gae(success, v, episode, lam)
        assert (adv[:2] > 0).all() and (adv[2:] < 0).all()
    with pytest.raises(ValueError, match="returns"):
        task_returns(rtg, failed, "shaped")


def test_episode_gae_from_logged_returns_to_go():
    # two interleaved-id episodes: rewards (1, 0, 2) and (0, 5); rtg is their reverse cumulative sum
    rtg = torch.tensor([3.0, 2.0, 2.0, 5.0, 5.0])
    episode = torch.tensor([0, 0, 0, 1, 1])
    v = torch.tensor([2.5, 1.0, 1.5, 4.0, 3.0])
    # lam = 1: the Monte-Carlo advantage rtg - V, exactly
    assert torch.allclose(episode_gae(rtg, v, episode, 1.0), rtg - v)
    # lam = 0: one-step TD, r_t + V(o_t+1) - V(o_t), V = 0 after an episode's last call
    td = torch.tensor([1 + 1.0 - 2.5, 0 + 1.5 - 1.0, 2 - 1.5, 0 + 3.0 - 4.0, 5 - 3.0])
    assert torch.allclose(episode_gae(rtg, v, episode, 0.0), td)
    # lam = 0.5 mixes them, and an episode's advantages never see the next episode
    mid = episode_gae(rtg, v, episode, 0.5)
    assert torch.allclose(mid[2], td[2]) and torch.allclose(mid[1], td[1] + 0.5 * td[2])
    assert torch.allclose(mid[3:], episode_gae(rtg[3:], v[3:], episode[3:], 0.5))


def test_logs_pool_with_distinct_episodes_and_mismatched_logs_are_refused(tmp_path):
    from robo_rl.errors import ConfigError
    from robo_rl.runners.steer import load_logs

    def write(name: str, n_eps: int, size: int = 8) -> str:
        n = 3 * n_eps
        np.savez(tmp_path / name, rgb=np.zeros((n, 1, size, size, 3), np.uint8), actions=np.zeros((n, 2, 7), np.float32),
                 rtg=np.arange(n, dtype=np.float32), failed=np.arange(n) % 2 == 0, episode=np.repeat(np.arange(n_eps), 3),
                 instruction=np.array(["push"] * n))
        return str(tmp_path / name)

    data = load_logs([write("a.npz", 2), write("b.npz", 3)])
    assert data["rgb"].shape[0] == 15 and np.array_equal(np.unique(data["episode"]), np.arange(5))
    assert np.array_equal(data["rtg"][6:], np.arange(9, dtype=np.float32))
    with pytest.raises(ConfigError, match="does not match"):
        load_logs([write("a.npz", 2), write("c.npz", 1, size=16)])
    with pytest.raises(ConfigError, match="does not exist"):
        load_logs([str(tmp_path / "nope.npz")])
    (tmp_path / "cut.npz").write_bytes(b"PK\x03\x04 truncated")
    np.save(tmp_path / "arr.npy", np.zeros(3))
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    np.savez(tmp_path / "ragged.npz", rgb=np.zeros((4, 1, 8, 8, 3), np.uint8), actions=np.zeros((4, 2, 7), np.float32),
             rtg=np.zeros(3, np.float32), failed=np.zeros(4, bool), episode=np.zeros(4, int), instruction=np.array(["p"] * 4))
    for name, fragment in (("cut.npz", "is not a readable .npz"), ("arr.npy", "is not a readable .npz"),
                           ("other.npz", "lacks actions, episode, failed, instruction, rgb, rtg"),
                           ("ragged.npz", "has inconsistent arrays")):
        with pytest.raises(ConfigError, match=fragment):
            load_logs([str(tmp_path / name)])


def _fit_mean(s: SteeredPi0Policy, obs: dict, actions: torch.Tensor, adv: torch.Tensor, steps: int) -> None:
    with torch.no_grad():
        pooled = s.base.prefix(obs)[0].pooled
    target, valid = s.normalized_chunks(actions)
    w = advantage_weights(adv, 1.0, 20.0)
    opt = torch.optim.Adam(s.head.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = s.head.loss(pooled, target, w, valid)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("signal", [False, True])
def test_mean_shift_head_moves_actions_only_by_the_advantage(signal):
    """The same observation logged with a +0.6 chunk and a -0.6 chunk. Equal advantages: m_w = m_1 exactly
    (each has learned a non-zero mean), so always-on steering is the base bit for bit. Advantage +1 / -1:
    the steered executed actions move up from the base's, and the unexecuted part of the chunk is untouched."""
    torch.manual_seed(0)
    s = SteeredPi0Policy(Pi0Policy(Pi0PolicyConfig(exec_steps=3), OBS_SPEC, ACT),
                         SteeringConfig(beta=1.0, tau=-0.1, head="mean"))
    assert isinstance(s.head, MeanShiftHead)
    obs = {k: (v[:1].repeat(16, *[1] * (v.dim() - 1)) if torch.is_tensor(v) else v[:1] * 16) for k, v in _obs(1).items()}
    actions = torch.cat([torch.full((8, 3, 7), 0.6), torch.full((8, 3, 7), -0.6)])
    adv = torch.cat([torch.ones(8), -torch.ones(8)]) if signal else torch.zeros(16)
    _fit_mean(s, obs, actions, adv, steps=100)
    one = {k: v[:1] for k, v in obs.items()}
    with torch.no_grad():
        pooled = s.base.prefix(one)[0].pooled
        assert s.head.mean(pooled, -1.0).abs().max() > 1e-3
        shift = s.head.shift(pooled)
        assert torch.equal(shift[:, 3:], torch.zeros_like(shift[:, 3:])) and torch.equal(shift[..., 7:], shift[..., 7:] * 0)
        base = s.base.act(one, deterministic=True).actions
        steered = s.act(one, deterministic=True).actions
    if signal:
        assert (steered - base).mean() > 0.05, float((steered - base).mean())
    else:
        assert torch.equal(shift, torch.zeros_like(shift)) and torch.equal(steered, base)


def test_action_exploration_holds_an_offset_per_episode_or_redraws_it_per_call():
    from robo_rl.runners.steer import ActionExploration

    chunk = torch.zeros(2, 3, 4)  # (B, T, A): the offset is the same at every executed step of a chunk
    held = ActionExploration(np.array([1.0, 1.0, 0.0, 2.0]), num_envs=2, per="episode", seed=0)
    a1, a2 = held.perturb(chunk), held.perturb(chunk)
    assert torch.equal(a1, a2) and torch.equal(a1[:, 0], a1[:, 2]) and (a1[..., 2] == 0).all()
    assert not torch.equal(a1[0], a1[1])  # each env its own offset
    held.episode_done(1)  # env 1's episode ended: only its offset is redrawn
    a3 = held.perturb(chunk)
    assert torch.equal(a3[0], a1[0]) and not torch.equal(a3[1], a1[1])
    per_call = ActionExploration(np.ones(4), num_envs=2, per="call", seed=0)
    assert not torch.equal(per_call.perturb(chunk), per_call.perturb(chunk))
    big = ActionExploration(np.array([0.5, 2.0]), num_envs=4000, per="episode", seed=1).perturb(torch.zeros(4000, 2))
    assert big.std(0).numpy() == pytest.approx([0.5, 2.0], rel=0.05)
    assert torch.equal(ActionExploration(np.zeros(2), 3, "call", 0).perturb(torch.ones(3, 2)), torch.ones(3, 2))


def _conformal_steered() -> tuple:
    """A conformal-gated steered policy with a non-zero head, a batch of observations, the failure logits
    on it and the frozen base's deterministic actions."""
    torch.manual_seed(0)
    base = Pi0Policy(Pi0PolicyConfig(exec_steps=3, sampler="ode"), OBS_SPEC, ACT)
    s = SteeredPi0Policy(base, SteeringConfig(beta=1.0, gate="conformal"))
    for p in s.head.parameters():
        torch.nn.init.normal_(p, std=0.5)
    obs = _obs()
    with torch.no_grad():
        return s, obs, s.fail(s.base.prefix(obs)[0].pooled), base.act(obs, deterministic=True).actions


def test_conformal_gate_latches_per_env_until_its_episode_resets_and_closed_is_the_base():
    from robo_rl.algorithms.conformal import ConformalBands

    s, obs, logits, want = _conformal_steered()
    # a band that env 0's score crosses at its first call only (t = 0 bin), the others never
    thr0 = float(logits[0]) - 1e-4
    s.bands = ConformalBands(0.1, 1, (thr0, 1e9), (1.0, 1.0), 0.0, 9)
    with torch.no_grad():
        first = s.act(obs, deterministic=True)
        second = s.act(obs, deterministic=True)  # t = 1: the band is out of reach, env 0 stays latched
    steered = [bool(x) for x in first.extras["steered"]]
    assert steered[0] and steered == [float(v) > thr0 for v in logits]
    assert torch.equal(second.extras["steered"], first.extras["steered"])
    closed = ~first.extras["steered"]
    assert torch.equal(first.actions[closed], want[closed]) and not torch.equal(first.actions[0], want[0])
    s.reset(np.array([0]))  # env 0's episode ended: its gate closes, its next call is t = 0 again
    s.bands = ConformalBands(0.1, 1, (1e9,), (1.0,), 0.0, 9)
    with torch.no_grad():
        third = s.act(obs, deterministic=True)
    assert not bool(third.extras["steered"][0]) and torch.equal(third.actions[0], want[0])
    with pytest.raises(ValueError, match="gate='bogus'"):
        SteeringConfig(gate="bogus")


def test_monitored_gate_records_where_it_would_open_and_leaves_the_base_alone():
    from robo_rl.algorithms.conformal import ConformalBands
    from robo_rl.runners.steer_gate import gate_monitor

    s, obs, logits, want = _conformal_steered()
    thr0 = float(logits.median())
    s.bands = ConformalBands(0.1, 1, (thr0,), (2.0,), 0.0, 9)
    s.monitor = True
    with torch.no_grad():
        out = s.act(obs, deterministic=True)
    assert torch.equal(out.actions, want) and not out.extras["steered"].any() and s.rows_steered == 0
    s.reset(np.arange(len(logits)))
    opened = [e[0] for e in s.episode_steered]
    assert opened == [float(v) > thr0 for v in logits] and any(opened) and not all(opened)
    exc = [e[0] for e in s.episode_excursion]
    assert exc == pytest.approx([(float(v) - thr0) / 2.0 for v in logits])  # opened <=> excursion > lam (0)
    success = [[not o] for o in opened[:-1]] + [[opened[-1]]]  # one false alarm at most (the last env)
    mon = gate_monitor(success, s.episode_steered, s.episode_excursion)
    n_succ = sum(ok for (ok,) in success)
    alarms = sum(1 for (ok,), o in zip(success, opened) if ok and o)
    assert mon["successful_episodes"] == n_succ and mon["false_alarm_rate"] == pytest.approx(alarms / n_succ)
    assert mon["episode_excursion"] == [[x] for x in exc]


def test_best_of_n_picks_the_scorers_favourite_only_where_the_gate_is_open():
    s = _steered(tau=0.5)
    obs = _obs()
    with torch.no_grad():
        p = torch.sigmoid(s.fail(s.base.prefix(obs)[0].pooled))
    s.cfg = SteeringConfig(beta=1.0, tau=float(p.median()))  # some envs steered, some not
    with torch.no_grad():
        torch.manual_seed(3)
        one = s.act(obs, deterministic=False)
        s.samples = 1
        torch.manual_seed(3)
        again = s.act(obs, deterministic=False)
    assert torch.equal(one.actions, again.actions)  # N = 1: today's behaviour, draw for draw

    class FirstDim(torch.nn.Module):  # a verifier that prefers a large first action dim of the first step
        def forward(self, f, c):
            return c[:, 0, 0]

    s.scorer, s.samples = FirstDim(), 6
    with torch.no_grad():
        torch.manual_seed(3)
        best = s.act(obs, deterministic=False)
    g = best.extras["steered"]
    assert g.any() and not g.all()
    assert torch.equal(best.actions[~g], one.actions[~g])  # closed rows: untouched, bit for bit
    assert bool((best.actions[g, 0, 0] >= one.actions[g, 0, 0]).all())  # x itself is one of the candidates
    assert bool((best.actions[g, 0, 0] > one.actions[g, 0, 0]).any())


def test_online_log_probs_reach_only_the_head_and_only_through_gated_rows():
    s = _steered(tau=0.5)
    obs = _obs()
    with torch.no_grad():
        p = torch.sigmoid(s.fail(s.base.prefix(obs)[0].pooled))
    s.cfg = SteeringConfig(beta=1.0, tau=float(p.median()))
    torch.manual_seed(0)
    out = s.online_act(obs)
    g = out.extras["gate"]
    assert g.any() and not g.all()
    lp = s.online_log_prob(obs, out.extras)
    torch.testing.assert_close(lp, out.log_prob, atol=1e-4, rtol=0)  # the stored sample re-scores exactly
    lp[~g].sum().backward(retain_graph=True)  # closed rows: no gradient anywhere
    assert all(q.grad is None or float(q.grad.abs().sum()) == 0.0 for q in s.parameters())
    lp[g].sum().backward()
    assert any(q.grad is not None and float(q.grad.abs().sum()) > 0 for q in s.head.parameters())
    others = [q for m in (s.base, s.fail, s.scorer) for q in m.parameters()]
    assert all(q.grad is None for q in others)
    # steer online re-scores its stored calls in batches: the same log-probs as one call at a time
    from robo_rl.runners.steer_online import _batches

    calls = [{"obs": {"rgb": obs["rgb"][i:i + 1], "state": obs["state"][i:i + 1], "instruction": [obs["instruction"][i]]},
              "extras": {k: v[i:i + 1] for k, v in out.extras.items()}, "log_prob": out.log_prob[i:i + 1], "episode": i}
             for i in range(len(g))]
    batches = _batches(calls, size=3)
    assert [len(b[3]) for b in batches] == [3, 1] and [e for b in batches for e in b[3]] == list(range(len(g)))
    with torch.no_grad():
        batched = torch.cat([s.online_log_prob(o, x) for o, x, _, _ in batches])
        single = torch.cat([s.online_log_prob(c["obs"], c["extras"]) for c in calls])
    # float32 kernels differ with the batch size (1.8e-3 on a log-prob of ~6.4 seen on an AMD EPYC); a
    # grouping error would mix rows and differ by whole nats
    torch.testing.assert_close(batched, single, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(torch.cat([b[2] for b in batches]), out.log_prob)


@pytest.mark.parametrize("kwargs,match", [({"beta": 0.0}, "--beta 0.0"), ({"beta": float("inf")}, "--beta inf"),
                                          ({"tau": 1.5}, "--tau 1.5"), ({"lr": -1.0}, "--lr -1.0")])
def test_steer_online_bad_arguments_are_one_line_before_loading(tmp_path, kwargs, match):
    from robo_rl.errors import ConfigError
    from robo_rl.runners.steer_online import train_online

    with pytest.raises(ConfigError, match=match):  # the checkpoint does not exist: nothing was loaded
        train_online(str(tmp_path / "none"), str(tmp_path / "none"), str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()
