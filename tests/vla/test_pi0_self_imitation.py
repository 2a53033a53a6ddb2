"""GRPO's self-imitation term on the tiny pi0-style policy: the flow-matching loss on the policy's own
sampled chunks counts only the rows it is weighted on, it pulls the greedy (ODE) chunk towards the
weighted row's chunk, and GRPO adds it to its loss with its coefficient, from the same prefix pass as the
log-probs (the same update as two passes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robo_rl.algorithms.grpo import GRPO, GRPOConfig
from robo_rl.batch import RolloutBatch
from robo_rl.contracts import ArraySpec
from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig

OBS_SPEC = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
ACT = ArraySpec((7,), "float32", -1.0, 1.0)


def _policy() -> Pi0Policy:
    torch.manual_seed(0)
    return Pi0Policy(Pi0PolicyConfig(exec_steps=3, sampler="sde", noise_level=0.5), OBS_SPEC, ACT).eval()


def _group(b: int) -> dict:
    """One observation repeated b times: a group of episodes from one initial state."""
    rng = np.random.default_rng(0)
    rgb = torch.from_numpy(rng.integers(0, 255, (1, 1, 32, 32, 3), dtype=np.uint8)).repeat(b, 1, 1, 1, 1)
    state = torch.from_numpy(rng.normal(size=(1, 5)).astype(np.float32)).repeat(b, 1)
    return {"rgb": rgb, "state": state, "instruction": ["put the bowl on the plate"] * b}


def _sampled(b: int) -> tuple[Pi0Policy, dict, object, dict]:
    """(policy, the group's observations, its sampled chunks (PolicyOutput), the tensors a rollout buffer keeps)."""
    p = _policy()
    obs = _group(b)
    torch.manual_seed(1)
    with torch.no_grad():
        out = p.act(obs)
    return p, obs, out, {k: v for k, v in obs.items() if k != "instruction"}


def test_rows_with_zero_weight_do_not_count():
    p, _, out, stored = _sampled(4)
    other = dict(out.extras, path=out.extras["path"].clone())
    other["path"][[1, 3]] = torch.randn_like(other["path"][[1, 3]]) * 3  # what rows 1 and 3 sampled: ignored
    w = torch.tensor([1.0, 0.0, 2.0, 0.0])
    losses = []
    for extras in (out.extras, other):
        torch.manual_seed(7)  # the same t and noise for both
        losses.append(p.self_imitation_loss(stored, extras, w))
    torch.testing.assert_close(losses[0], losses[1])
    torch.manual_seed(7)
    changed = dict(out.extras, path=other["path"].clone())
    changed["path"][0] += 1.0  # a weighted row's chunk does count
    assert not torch.isclose(p.self_imitation_loss(stored, changed, w), losses[0])
    assert float(p.self_imitation_loss(stored, out.extras, torch.zeros(4)).detach()) == 0.0


def test_self_imitation_pulls_the_greedy_chunk_towards_the_weighted_chunk():
    p, obs, out, stored = _sampled(2)
    chunks = p._unnormalize(out.extras["path"][:, -1, : p.exec_steps])

    def distances() -> list[float]:
        p.eval()
        with torch.no_grad():
            greedy = p.act(obs, deterministic=True).actions[0]
        p.train()
        return [float((greedy - c).norm()) for c in chunks]

    before = distances()
    opt = torch.optim.Adam(p.parameters(), lr=2e-3)
    torch.manual_seed(2)
    for _ in range(30):
        loss = p.self_imitation_loss(stored, out.extras, torch.tensor([1.0, 0.0]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = distances()
    # a tiny random model fits its field slowly: a clear move towards row 0's chunk and away from row 1's
    assert after[0] < 0.9 * before[0] and after[0] < after[1] - 0.5, (before, after)


def test_grpo_adds_the_weighted_term_to_its_loss():
    p, _, out, stored = _sampled(4)
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5])
    batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, adv)
    p.train()
    terms = GRPO(GRPOConfig(lr=1e-4, epochs=1, minibatches=1, sil_coef=0.25), p).update(batch)
    assert terms["self_imitation"] > 0
    assert np.isclose(terms["loss"], terms["policy_loss"] + 0.25 * terms["self_imitation"], rtol=1e-5)
    terms = GRPO(GRPOConfig(lr=1e-4, epochs=1, minibatches=1), p).update(batch)
    assert "self_imitation" not in terms and np.isclose(terms["loss"], terms["policy_loss"])


def test_the_logged_term_averages_the_minibatches_it_was_applied_to():
    """Two one-row minibatches, one above its group's mean: the term runs once and is logged as its value,
    not halved by the minibatch without a positive row."""
    p, _, out, stored = _sampled(2)
    adv = torch.tensor([1.0, -1.0])
    batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, adv)
    weights_seen = []

    def term(obs, extras, weights):  # a deterministic stand-in for the flow-matching loss (it samples noise)
        weights_seen.append(weights.clone())
        return 2.0 * weights.sum() + 0.0 * next(p.parameters()).sum()

    p.self_imitation_loss = term
    p.score_and_imitate = lambda obs, extras, weights, per_token: (
        p.token_log_probs(obs, extras) if per_token else p.evaluate(obs, extras)[0], None, term(obs, extras, weights))
    p.train()
    terms = GRPO(GRPOConfig(lr=1e-6, epochs=1, minibatches=2, sil_coef=1.0), p).update(batch)
    assert len(weights_seen) == 1 and weights_seen[0].tolist() == [1.0]
    assert np.isclose(terms["self_imitation"], 2.0), terms


def test_one_prefix_pass_gives_what_the_separate_calls_give():
    p, _, out, stored = _sampled(4)
    w = torch.tensor([1.0, 0.0, 2.0, 0.5])
    for per_token in (True, False):
        torch.manual_seed(3)
        fused = p.score_and_imitate(stored, out.extras, w, per_token)
        torch.manual_seed(3)
        lp, ent, _ = p.evaluate(stored, out.extras)
        apart = (p.token_log_probs(stored, out.extras) if per_token else lp, None if per_token else ent,
                 p.self_imitation_loss(stored, out.extras, w))
        assert fused[0].shape == apart[0].shape == ((4, 1) if per_token else (4,))
        for a, b in zip(fused, apart):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@pytest.mark.parametrize("token_level", [True, False])
def test_grpo_takes_the_same_step_with_one_prefix_pass_as_with_two(token_level, monkeypatch):
    import robo_rl.algorithms.grpo as grpo_module

    p, _, out, stored = _sampled(4)
    q = Pi0Policy(p.cfg, OBS_SPEC, ACT)
    q.load_state_dict(p.state_dict())
    adv = torch.tensor([1.5, -0.5, 0.5, -1.5])
    batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, adv)
    cfg = GRPOConfig(lr=1e-3, epochs=2, minibatches=2, sil_coef=0.5, ent_coef=0.01, token_level=token_level)
    calls: list[list[str]] = [[], []]
    terms = []
    for i, policy in enumerate((p, q)):
        if i == 1:  # GRPO as if the policy had no fused call: the log-probs, then self_imitation_loss
            monkeypatch.setattr(grpo_module, "ScoreAndImitate", type("NoPolicyHasThis", (), {}))
        for name in ("evaluate", "token_log_probs", "score_and_imitate", "self_imitation_loss"):
            method = getattr(policy, name)
            monkeypatch.setattr(policy, name, lambda *a, _m=method, _n=name, _i=i: calls[_i].append(_n) or _m(*a))
        policy.train()
        torch.manual_seed(5)
        terms.append(GRPO(cfg, policy, torch.Generator().manual_seed(0)).update(batch))
    score = "token_log_probs" if token_level else "evaluate"
    assert "score_and_imitate" in calls[0] and "self_imitation_loss" not in calls[0], calls[0]
    assert "score_and_imitate" not in calls[1] and {score, "self_imitation_loss"} <= set(calls[1]), calls[1]
    assert terms[0]["self_imitation"] > 0 and terms[0].keys() == terms[1].keys()
    for k in terms[0]:
        assert np.isclose(terms[0][k], terms[1][k], rtol=1e-4, atol=1e-6), (k, terms[0][k], terms[1][k])
    for (name, a), b in zip(p.state_dict().items(), q.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_bench_sil_times_the_three_updates_side_by_side(tmp_path, capsys):
    from benchmarks import run_bench

    out = tmp_path / "sil.json"
    assert run_bench("sil", ["--arch", "tiny", "--transitions", "4", "--rounds", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["transitions"] == 4 and min(row["one_pass_s"], row["two_passes_s"], row["no_sil_s"]) > 0
    assert row["two_over_one"] == pytest.approx(row["two_passes_s"] / row["one_pass_s"])
    assert "two/one" in capsys.readouterr().out
