"""VLA-OPD: per-token advantage log pi_T - log pi_S (sign, and zero when student = teacher), the
update lowers the reverse KL on the student's own samples, token log-probs sum to evaluate()'s, and a
teacher with other tokens is refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from policies.mlp import MLPActorCritic, MLPConfig
from robo_rl.algorithms.opd import OPD, OPDConfig, opd_advantages
from robo_rl.batch import RolloutBatch
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError

OBS = {"state": ArraySpec((4,), "float32")}
ACT = ArraySpec((2,), "float32", -1.0, 1.0)


def _mlp(seed: int, log_std: float = -0.5) -> MLPActorCritic:
    torch.manual_seed(seed)
    return MLPActorCritic(MLPConfig(hidden=(32, 32), normalize_obs=False, init_log_std=log_std), OBS, ACT)


def _rollout(policy, n: int = 128, seed: int = 0) -> RolloutBatch:
    obs = {"state": torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))}
    with torch.no_grad():
        out = policy.act(obs)
    z = torch.zeros(n)
    return RolloutBatch(obs, out.extras, out.log_prob, z, z, z)


def _kl(student, teacher, obs) -> float:
    with torch.no_grad():
        s = student._dist(student.actor(student._features(obs)))
        t = teacher._dist(teacher.actor(teacher._features(obs)))
        return float(torch.distributions.kl_divergence(s, t).sum(-1).mean())


def _pi0_pair(sampler: str):
    """(student, teacher): two tiny pi0 policies with 3 executed steps of 7-D actions, other seeds."""
    from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig

    obs_spec = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
    spec = ArraySpec((7,), "float32", -1.0, 1.0)
    pair = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        pair.append(Pi0Policy(Pi0PolicyConfig(sampler=sampler, exec_steps=3), obs_spec, spec).eval())
    return tuple(pair)


def _pi0_obs() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    return {"rgb": torch.from_numpy(rng.integers(0, 255, (4, 1, 32, 32, 3), dtype=np.uint8)),
            "state": torch.from_numpy(rng.normal(size=(4, 5)).astype(np.float32))}


def test_advantage_is_the_teacher_student_log_ratio():
    t = torch.tensor([[-1.0, -3.0]])
    s = torch.tensor([[-2.0, -2.0]])
    assert opd_advantages(t, s).tolist() == [[1.0, -1.0]]  # teacher prefers token 0, not token 1


def test_a_student_identical_to_its_teacher_is_left_unchanged():
    student = _mlp(0)
    algo = OPD(OPDConfig(teacher="unused", lr=1e-2), student)
    algo.set_teacher(copy.deepcopy(student), (2,), (2,))
    before = copy.deepcopy(student.state_dict())
    stats = algo.update(_rollout(student))
    assert stats["advantage_mean"] == 0.0 and stats["reverse_kl"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in student.state_dict().items())


def test_updates_on_own_samples_lower_the_reverse_kl():
    student, teacher = _mlp(0), _mlp(1, log_std=-1.0)
    algo = OPD(OPDConfig(teacher="unused", lr=3e-3, epochs=4, minibatches=2), student,
               generator=torch.Generator().manual_seed(0))
    algo.set_teacher(teacher, (2,), (2,))
    probe = {"state": torch.randn(256, 4, generator=torch.Generator().manual_seed(9))}
    before = _kl(student, teacher, probe)
    for it in range(30):
        torch.manual_seed(it)
        algo.update(_rollout(student, seed=it))  # on-policy: fresh samples of the current student
    after = _kl(student, teacher, probe)
    assert after < 0.5 * before, (before, after)


def test_openvla_token_log_probs_sum_to_evaluate_and_other_tokenizers_are_refused():
    from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy
    from vla.openvla.tokenizer import NormStats

    spec = ArraySpec((7,), "float32", -1.0, 1.0)
    obs_spec = {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}
    torch.manual_seed(0)
    student = OpenVLAPolicy(OpenVLAConfig(), obs_spec, spec).eval()
    obs = {"rgb": torch.from_numpy(np.random.default_rng(0).integers(0, 255, (3, 1, 40, 40, 3), dtype=np.uint8))}
    with torch.no_grad():
        out = student.act(obs)
        tok = student.token_log_probs(obs, out.extras)
    assert tok.shape == (3, 7)
    torch.testing.assert_close(tok.sum(-1), out.log_prob, atol=1e-5, rtol=0)
    algo = OPD(OPDConfig(teacher="unused"), student)
    teacher = copy.deepcopy(student)
    algo.set_teacher(teacher, (7,), (7,))  # same tokens: accepted
    teacher.set_norm_stats(NormStats((-2.0,) * 7, (2.0,) * 7, (True,) * 7))
    with pytest.raises(ConfigError, match=r"teacher's tokens differ from the student's in q01 \(teacher \[-2.0"):
        algo.set_teacher(teacher, (7,), (7,))
    with pytest.raises(ConfigError, match=r"teacher outputs actions of shape \(2,\) but the student \(7,\)"):
        algo.set_teacher(_mlp(0), (7,), (2,))
    with pytest.raises(ConfigError, match="'algo.teacher' is required for opd"):
        OPDConfig()


@pytest.mark.parametrize("sampler", ["noise", "sde"])
def test_opd_for_a_flow_vla_scores_denoising_transitions(sampler):
    from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig

    (student, teacher), obs = _pi0_pair(sampler), _pi0_obs()
    obs_spec = {"rgb": ArraySpec((1, 32, 32, 3), "uint8"), "state": ArraySpec((5,), "float32")}
    spec = ArraySpec((7,), "float32", -1.0, 1.0)
    with torch.no_grad():
        out = student.act(obs)
        tok = student.token_log_probs(obs, out.extras)
    assert tok.shape == (4, student.model.arch.num_steps if sampler == "noise" else 1)
    torch.testing.assert_close(tok.sum(-1), out.log_prob, atol=1e-5, rtol=0)
    algo = OPD(OPDConfig(teacher="unused", lr=1e-3), student)
    algo.set_teacher(teacher, (7,), (7,))
    z = torch.zeros(4)
    stats = algo.update(RolloutBatch(obs, out.extras, out.log_prob, z, z, z))
    assert np.isfinite(stats["policy_loss"]) and stats["reverse_kl"] != 0.0
    other = Pi0Policy(Pi0PolicyConfig(sampler="sde" if sampler == "noise" else "noise", exec_steps=3), obs_spec, spec)
    with pytest.raises(ConfigError, match="sampler"):
        algo.set_teacher(other, (7,), (7,))


def test_reinforce_and_clipped_losses_agree_on_policy_and_differ_after_an_update():
    from robo_rl.algorithms.opd import opd_loss

    g = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=g)
    adv = torch.randn(6, 5, generator=g)
    grads = {}
    for kind in ("clipped", "reinforce"):
        for shift in (0.0, 0.5):
            new = (old + shift).clone().requires_grad_(True)
            loss, _ = opd_loss(new, old, adv, 0.2, kind)
            loss.backward()
            grads[kind, shift] = new.grad
    torch.testing.assert_close(grads["clipped", 0.0], grads["reinforce", 0.0])  # the same gradient on-policy
    assert not torch.allclose(grads["clipped", 0.5], grads["reinforce", 0.5])


def test_a_teacher_trained_with_flow_sde_scores_flow_noise_through_teacher_policy(tmp_path, fake_env):
    """A pi0 teacher recorded with sampler=sde is refused by a Flow-Noise student (their transitions differ);
    ``algo.teacher_policy: {sampler: noise}`` rebuilds it with the student's sampler and the run trains. Keys
    the teacher's policy section does not have, or another policy name, are one-line errors."""
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    def cfg(name, policy, algo):
        return from_dict(TrainConfig, {
            "env": {"name": fake_env, "num_envs": 2, "max_episode_steps": 4, "image_size": 32},
            "policy": {"name": "pi0", "arch": "tiny", "exec_steps": 2, **policy}, "algo": algo,
            "run": {"total_env_steps": 8, "rollout_steps": 2, "eval_every_steps": 0, "final_eval_episodes": 0,
                    "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name}})

    train(cfg("teacher", {"sampler": "sde"}, {"name": "ppo", "minibatches": 1, "epochs": 1}))
    teacher = str(tmp_path / "teacher")
    opd = {"name": "opd", "teacher": teacher, "minibatches": 1, "epochs": 1}
    with pytest.raises(ConfigError, match="sampler"):
        train(cfg("plain", {"sampler": "noise"}, opd))
    seen = {}
    original = OPD.set_teacher

    def spy(self, t, *shapes):
        seen["sampler"] = t.cfg.sampler
        return original(self, t, *shapes)

    import unittest.mock

    with unittest.mock.patch.object(OPD, "set_teacher", spy):
        summary = train(cfg("matched", {"sampler": "noise"}, {**opd, "teacher_policy": {"sampler": "noise"}}))
    assert seen["sampler"] == "noise" and summary is not None
    assert (tmp_path / "matched" / "metrics.csv").is_file() or (tmp_path / "matched" / "metrics.jsonl").is_file()
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.teacher_policy.samplr': did you mean 'sampler'"):
        train(cfg("typo", {"sampler": "noise"}, {**opd, "teacher_policy": {"samplr": "noise"}}))
    with pytest.raises(ConfigError, match=r"'algo.teacher_policy.name' = 'mlp'.*drop 'name'"):
        train(cfg("renamed", {"sampler": "noise"}, {**opd, "teacher_policy": {"name": "mlp"}}))
    with pytest.raises(ConfigError, match="expected a mapping"):
        from_dict(OPDConfig, {"teacher": teacher, "teacher_policy": ["sampler=noise"]}, "algo")


def test_exact_kl_loss_lowers_the_reverse_kl_faster_than_sampled_tokens():
    """``loss: kl`` minimizes the closed-form per-dimension KL on the student's own states; on the same
    rollouts and steps it ends closer to the teacher than the sampled-token estimate."""
    probe = {"state": torch.randn(256, 4, generator=torch.Generator().manual_seed(9))}
    ends = {}
    for loss in ("clipped", "kl"):
        student, teacher = _mlp(0), _mlp(1, log_std=-1.0)
        algo = OPD(OPDConfig(teacher="unused", lr=3e-3, epochs=4, minibatches=2, loss=loss), student,
                   generator=torch.Generator().manual_seed(0))
        algo.set_teacher(teacher, (2,), (2,))
        before = _kl(student, teacher, probe)
        for it in range(10):
            torch.manual_seed(it)
            stats = algo.update(_rollout(student, seed=it))
        ends[loss] = _kl(student, teacher, probe)
        assert ends[loss] < before, (loss, before, ends[loss])
    assert stats["policy_loss"] > 0  # the exact KL per dimension is what "kl" reports as its loss
    assert ends["kl"] < ends["clipped"], ends


def test_exact_kl_needs_whole_distributions_on_both_sides():
    class ScoresOnly:
        def __init__(self, inner):
            self.inner = inner

        def token_log_probs(self, obs, extras):
            return self.inner.token_log_probs(obs, extras)

        def token_space(self):
            return self.inner.token_space()

        def parameters(self):
            return self.inner.parameters()

    student = _mlp(0)
    with pytest.raises(ConfigError, match=r"OPD with algo.loss=kl"):
        OPD(OPDConfig(teacher="unused", loss="kl"), ScoresOnly(student))
    algo = OPD(OPDConfig(teacher="unused", loss="kl"), student)
    with pytest.raises(ConfigError, match=r"teacher.*token_distributions"):
        algo.set_teacher(ScoresOnly(_mlp(1)), (2,), (2,))
    algo_sampled = OPD(OPDConfig(teacher="unused"), student)
    algo_sampled.set_teacher(ScoresOnly(_mlp(1)), (2,), (2,))  # the sampled-token losses need log-probs only


def test_openvla_token_distributions_hold_the_scored_tokens():
    from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy

    spec = ArraySpec((7,), "float32", -1.0, 1.0)
    torch.manual_seed(0)
    student = OpenVLAPolicy(OpenVLAConfig(temperature=0.7), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}, spec).eval()
    obs = {"rgb": torch.from_numpy(np.random.default_rng(0).integers(0, 255, (3, 1, 40, 40, 3), dtype=np.uint8))}
    with torch.no_grad():
        out = student.act(obs)
        dist = student.token_distributions(obs, out.extras)
        tok = student.token_log_probs(obs, out.extras)
    assert dist.batch_shape == (3, 7) and dist.probs.shape[-1] == student.model.action_tokenizer.n_bins
    torch.testing.assert_close(dist.log_prob(out.extras["action_index"]), tok, atol=1e-5, rtol=0)
    torch.manual_seed(1)
    teacher = OpenVLAPolicy(OpenVLAConfig(temperature=0.7), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}, spec).eval()
    algo = OPD(OPDConfig(teacher="unused", loss="kl", lr=1e-3, minibatches=1, epochs=1), student.train())
    algo.set_teacher(teacher, (7,), (7,))
    _exact_kl_falls(algo, RolloutBatch(obs, out.extras, out.log_prob, *[torch.zeros(3)] * 3))


@pytest.mark.parametrize("sampler", ["noise", "sde"])
def test_pi0_transition_distributions_hold_the_scored_transitions(sampler):
    (student, teacher), obs = _pi0_pair(sampler), _pi0_obs()
    with torch.no_grad():
        out = student.act(obs)
        dist = student.token_distributions(obs, out.extras)
        tok = student.token_log_probs(obs, out.extras)
    path, keep = out.extras["path"], student.log_prob_mask()
    nxt = path[:, 1:] if sampler == "noise" else path[torch.arange(4), out.extras["step"] + 1][:, None]
    assert dist.batch_shape == tok.shape and dist.event_shape == (3 * 7,)  # executed steps x real dims
    torch.testing.assert_close(dist.log_prob(nxt[:, :, keep]), tok, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(torch.distributions.kl_divergence(dist, dist), torch.zeros_like(tok))
    algo = OPD(OPDConfig(teacher="unused", loss="kl", lr=1e-3, minibatches=1, epochs=1), student)
    algo.set_teacher(teacher, (7,), (7,))
    _exact_kl_falls(algo, RolloutBatch(obs, out.extras, out.log_prob, *[torch.zeros(4)] * 3))


def _exact_kl_falls(algo: OPD, batch: RolloutBatch) -> None:
    """Five exact-KL updates on one batch: the KL (the reported loss) stays positive and falls."""
    first = algo.update(batch)["policy_loss"]
    for _ in range(4):
        last = algo.update(batch)["policy_loss"]
    assert 0 < last < first, (first, last)


@pytest.mark.parametrize("kind", ["mlp", "pi0", "openvla"])
def test_teacher_distributions_computed_once_equal_those_asked_per_minibatch(kind, monkeypatch):
    """``loss: kl`` asks the teacher once per update (in pieces, then sliced per minibatch); the update
    is the one that asks it again on every minibatch of every epoch."""
    if kind == "mlp":
        pair = lambda: (_mlp(0), _mlp(1, log_std=-1.0))  # noqa: E731
        obs, act_dim = {"state": torch.randn(10, 4, generator=torch.Generator().manual_seed(3))}, 2
    elif kind == "pi0":
        pair, obs, act_dim = (lambda: _pi0_pair("noise")), _pi0_obs(), 7
    else:
        from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy

        def pair():
            out = []
            for seed in (0, 1):
                torch.manual_seed(seed)
                out.append(OpenVLAPolicy(OpenVLAConfig(temperature=0.7), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")},
                                         ArraySpec((7,), "float32", -1.0, 1.0)).eval())
            return tuple(out)
        obs = {"rgb": torch.from_numpy(np.random.default_rng(0).integers(0, 255, (5, 1, 40, 40, 3), dtype=np.uint8))}
        act_dim = 7
    weights, calls = {}, {}
    for mode in ("once", "per-minibatch"):
        student, teacher = pair()
        with torch.no_grad():
            out = student.act(obs)
        n = out.log_prob.shape[0]
        batch = RolloutBatch(obs, out.extras, out.log_prob, *[torch.zeros(n)] * 3)
        algo = OPD(OPDConfig(teacher="unused", loss="kl", lr=1e-3, minibatches=2, epochs=3), student,
                   generator=torch.Generator().manual_seed(0))
        algo.set_teacher(teacher, (act_dim,), (act_dim,))
        if mode == "per-minibatch":
            monkeypatch.setattr(algo, "_teacher_distributions", lambda b: None)
        asked = _count_calls(monkeypatch, teacher, "token_distributions")
        algo.update(batch)
        weights[mode] = [p.detach().clone() for p in student.parameters()]
        calls[mode] = len(asked)
    for a, b in zip(weights["once"], weights["per-minibatch"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert calls["once"] <= 3 < calls["per-minibatch"] == 3 * 2, calls  # pieces of a minibatch's size, vs 3 epochs x 2


def _count_calls(monkeypatch, obj, name: str) -> list[int]:
    """A list that grows by one on each call of ``obj.name`` (which still runs)."""
    calls, inner = [], getattr(obj, name)
    monkeypatch.setattr(obj, name, lambda *a: calls.append(1) or inner(*a))
    return calls


def test_rows_of_distributions_are_taken_and_stacked_in_order():
    from torch.distributions import Categorical, Independent, Laplace, Normal

    from robo_rl.algorithms.opd import cat_rows, take_rows

    g = torch.Generator().manual_seed(0)
    for dist in (Independent(Normal(torch.randn(6, 3, 2, generator=g), torch.rand(6, 3, 2, generator=g) + 0.1), 1),
                 Categorical(logits=torch.randn(6, 4, 5, generator=g))):
        parts = [take_rows(dist, torch.arange(0, 4)), take_rows(dist, torch.arange(4, 6))]
        whole = cat_rows(parts)
        x = dist.sample()
        torch.testing.assert_close(whole.log_prob(x), dist.log_prob(x))
        torch.testing.assert_close(take_rows(dist, torch.tensor([5, 1])).log_prob(x[[5, 1]]), dist.log_prob(x)[[5, 1]])
    with pytest.raises(TypeError, match="Laplace"):
        take_rows(Laplace(torch.zeros(2), torch.ones(2)), torch.tensor([0]))


def test_greedy_rollouts_need_the_exact_kl_and_the_local_trainer():
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig

    assert OPD(OPDConfig(teacher="t", loss="kl", rollout="greedy"), _mlp(0)).greedy_rollouts()
    assert not OPD(OPDConfig(teacher="t", loss="kl"), _mlp(0)).greedy_rollouts()
    with pytest.raises(ConfigError, match=r"'algo.rollout' = 'greedy' with algo.loss = 'clipped'.*use algo.loss=kl"):
        OPDConfig(teacher="t", rollout="greedy")
    with pytest.raises(ConfigError, match=r"'algo.rollout' = 'argmax' is not allowed"):
        from_dict(OPDConfig, {"teacher": "t", "loss": "kl", "rollout": "argmax"}, "algo")
    with pytest.raises(ConfigError, match=r"Ray rollout workers sample: unset cluster.address"):
        from_dict(TrainConfig, {"env": {"name": "maniskill"}, "policy": {"name": "mlp"},
                                "algo": {"name": "opd", "teacher": "t", "loss": "kl", "rollout": "greedy"},
                                "cluster": {"address": "local"}})


def test_greedy_wrapper_acts_deterministically_and_records_a_log_prob():
    from robo_rl.contracts import PolicyOutput
    from robo_rl.rollout.device import Greedy

    policy, obs = _mlp(0), {"state": torch.randn(5, 4)}
    with torch.no_grad():
        out = Greedy(policy).act(obs)
        torch.testing.assert_close(out.actions, policy.act(obs, deterministic=True).actions)

    class NoLogProb:
        def act(self, obs, deterministic=False):
            return PolicyOutput(torch.full((3, 2), float(deterministic)), None, torch.zeros(3), {})

        def value(self, obs):
            return torch.ones(3)

    out = Greedy(NoLogProb()).act(obs)
    assert bool((out.actions == 1).all()) and out.log_prob.shape == (3,) and not out.log_prob.any()
    assert Greedy(NoLogProb()).value(obs).sum() == 3  # everything else is the wrapped policy's


@pytest.mark.parametrize("rollout", ["greedy", "sampled"])
def test_opd_rollouts_of_a_flow_vla_start_where_greedy_evaluation_does(tmp_path, fake_env, rollout):
    """``algo.rollout: greedy``: the trainer collects with the student's deterministic action, so every
    stored denoising path starts at x_0 = 0 and follows the ODE; the exact KL is scored on those x_k.
    ``sampled`` paths start from Gaussian noise."""
    import unittest.mock

    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    def cfg(name, algo):
        return from_dict(TrainConfig, {
            "env": {"name": fake_env, "num_envs": 2, "max_episode_steps": 4, "image_size": 32},
            "policy": {"name": "pi0", "arch": "tiny", "exec_steps": 2, "sampler": "noise"}, "algo": algo,
            "run": {"total_env_steps": 8, "rollout_steps": 2, "eval_every_steps": 0, "final_eval_episodes": 0,
                    "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name}})

    train(cfg("teacher", {"name": "ppo", "minibatches": 1, "epochs": 1}))
    seen, original = [], OPD.update

    def spy(self, batch):
        seen.append((batch.extras["path"].clone(), batch.log_prob.clone()))
        out = original(self, batch)
        seen.append(out)
        return out

    with unittest.mock.patch.object(OPD, "update", spy):
        train(cfg("student", {"name": "opd", "teacher": str(tmp_path / "teacher"), "loss": "kl", "rollout": rollout,
                              "minibatches": 1, "epochs": 1}))
    (path, log_prob), stats = seen[0], seen[1]
    assert path.ndim == 4 and path.shape[1] > 2  # (N, K + 1, H, A)
    starts_at_zero = bool((path[:, 0] == 0).all())
    assert starts_at_zero == (rollout == "greedy")
    assert bool((log_prob == 0).all()) == (rollout == "greedy")  # the ODE path has no sampled transition
    assert stats["policy_loss"] > 0 and np.isfinite(stats["policy_loss"])
