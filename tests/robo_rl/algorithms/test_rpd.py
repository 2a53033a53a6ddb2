"""RPD: PPO plus a pull towards a teacher's actions. lambda = 0 is PPO exactly; the term moves the
student towards the teacher (mse and nll); a teacher with another action space is a clear error;
the trainer loads the teacher from a run directory (real ManiSkill run)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from policies.mlp import MLPActorCritic, MLPConfig
from robo_rl.algorithms.ppo import PPO, PPOConfig
from robo_rl.algorithms.rpd import RPD, RPDConfig
from robo_rl.batch import RolloutBatch
from robo_rl.config import from_dict
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError
from tests.conftest import cli_in_process, run_cli

OBS = {"state": ArraySpec((4,), "float32")}
ACT = ArraySpec((2,), "float32", -1.0, 1.0)


def _mlp(seed: int) -> MLPActorCritic:
    torch.manual_seed(seed)
    return MLPActorCritic(MLPConfig(hidden=(32, 32), normalize_obs=False), OBS, ACT)


def _batch(n: int = 64, advantages: bool = True) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    obs = {"state": torch.randn(n, 4, generator=g)}
    adv = obs["state"][:, 0].clone() if advantages else torch.zeros(n)
    return RolloutBatch(obs, {"action": torch.randn(n, 2, generator=g)}, torch.full((n,), -2.0), torch.zeros(n),
                        adv, obs["state"][:, 0].clone())


class ConstantTeacher:
    def __init__(self, action):
        self.action = torch.tensor(action)

    def act(self, obs, deterministic=False):
        from robo_rl.contracts import PolicyOutput

        return PolicyOutput(actions=self.action.expand(obs["state"].shape[0], -1).clone())


def test_lambda_zero_is_ppo_exactly():
    common = {"epochs": 2, "minibatches": 2, "target_kl": None}
    a, b = _mlp(0), _mlp(0)
    ppo = PPO(PPOConfig(**common), a, generator=torch.Generator().manual_seed(1))
    rpd = RPD(RPDConfig(teacher="unused", lambda_=0.0, **common), b, generator=torch.Generator().manual_seed(1))
    rpd.set_teacher(ConstantTeacher([0.5, -0.5]), (2,), (2,))
    ppo.update(_batch())
    rpd.update(_batch())
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("distance", ["mse", "nll"])
def test_the_teacher_term_pulls_the_student_towards_the_teacher(distance):
    student = _mlp(0)
    teacher = ConstantTeacher([0.5, -0.5])
    algo = RPD(RPDConfig(teacher="unused", lambda_=1.0, distance=distance, lr=1e-2, epochs=4, minibatches=2,
                         target_kl=None), student, generator=torch.Generator().manual_seed(1))
    algo.set_teacher(teacher, (2,), (2,))
    batch = _batch(advantages=False)  # no reward signal: only the teacher term moves the actor
    before = algo.distance(batch.obs, teacher.act(batch.obs).actions).item()
    for _ in range(5):
        stats = algo.update(batch)
    after = algo.distance(batch.obs, teacher.act(batch.obs).actions).item()
    assert after < 0.5 * before and "teacher_distance" in stats


def test_a_distance_on_discrete_token_actions_is_refused():
    """mse/l1 on a policy whose deterministic actions are decoded tokens (no gradient) would silently
    do nothing: a one-line error pointing at distance nll."""

    class TokenStudent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def act(self, obs, deterministic=False):
            from robo_rl.contracts import PolicyOutput

            return PolicyOutput(actions=torch.zeros(obs["state"].shape[0], 2))  # argmax of logits: no grad

    algo = RPD(RPDConfig(teacher="unused", distance="mse"), _mlp(0))
    algo.policy = TokenStudent()
    obs = _batch().obs
    with pytest.raises(ConfigError, match="decodes discrete action tokens .*use algo.distance: nll"):
        algo.distance(obs, torch.zeros(64, 2))
    with torch.no_grad():  # evaluation-time use (no gradient wanted) stays allowed
        assert float(algo.distance(obs, torch.zeros(64, 2))) == 0.0


def test_lambda_anneals_and_mismatched_teachers_are_refused():
    algo = RPD(RPDConfig(teacher="unused", lambda_=2.0, anneal="linear"), _mlp(0))
    algo.set_progress(0.75)
    assert algo.lam == pytest.approx(0.5)
    with pytest.raises(ConfigError, match=r"teacher outputs actions of shape \(7,\) but the student \(2,\)"):
        algo.set_teacher(ConstantTeacher([0.0] * 7), (2,), (7,))
    with pytest.raises(ConfigError, match="'algo.teacher' is required for rpd"):
        RPDConfig()


@pytest.mark.maniskill
def test_rpd_and_opd_runs_load_their_teacher_from_a_run_directory(tmp_path, need_maniskill):
    base = ["configs/quickstart.yaml", "env.num_envs=2", "env.max_episode_steps=20", "policy.hidden=[32,32]",
            "run.total_env_steps=64", "run.rollout_steps=16", "run.eval_every_steps=0", "run.final_eval_episodes=0",
            "run.progress=false", "run.video=false", f"run.out_dir={tmp_path}"]
    proc = run_cli("train", "--json", *base, "run.name=teacher")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("train", "--json", *base, "algo.name=rpd", f"algo.teacher={tmp_path / 'teacher'}", "algo.lambda_=0.5",
                   "run.name=student")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "teacher policy from" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["env_steps"] >= 64
    proc = cli_in_process("train", "--json", *base, "algo.name=rpd", f"algo.teacher={tmp_path / 'teacher'}",
                   "env.control_mode=pd_ee_delta_pos", "run.name=bad")
    assert proc.returncode != 0
    assert "teacher outputs actions of shape (8,) but the student (4,)" in proc.stderr.strip().splitlines()[-1]
    opd = [a for a in base if not a.startswith("configs/")]
    proc = run_cli("train", "--json", "configs/quickstart.yaml", *opd, "algo={name: opd, teacher: " + str(tmp_path / "teacher") + "}",
                   "run.name=opd")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "teacher policy from" in proc.stderr


def test_lambda_anneals_linearly_or_with_a_cosine():
    import math

    policy = MLPActorCritic(MLPConfig(hidden=(8,)), {"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    for anneal, half, end in (("constant", 2.0, 2.0), ("linear", 1.0, 0.0), ("cosine", 1.0, 0.0)):
        algo = RPD(RPDConfig(teacher="t", lambda_=2.0, anneal=anneal), policy)
        algo.set_progress(0.5)
        assert algo.lam == pytest.approx(half)
        algo.set_progress(0.25)
        if anneal == "cosine":
            assert algo.lam == pytest.approx(1.0 + math.cos(math.pi / 4))  # 2 * (1 + cos(pi/4)) / 2
        algo.set_progress(1.0)
        assert algo.lam == pytest.approx(end)



@pytest.mark.parametrize("anneal", ["linear", "cosine"])
def test_lambda_anneals_to_its_floor_and_stays_there(anneal):
    """lambda_final: the anneal runs from lambda_ down to the floor (half-way at the middle for both shapes)
    and holds it after the horizon; a floor above lambda_, or with a constant lambda, is a one-line error."""
    policy = MLPActorCritic(MLPConfig(hidden=(8,)), {"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    algo = RPD(RPDConfig(teacher="t", lambda_=1.0, lambda_final=0.25, anneal=anneal, anneal_env_steps=100), policy)
    for steps, lam in ((0, 1.0), (50, 0.625), (100, 0.25), (400, 0.25)):
        algo.set_progress(steps / 400, steps)
        assert algo.lam == pytest.approx(lam), steps
    assert algo.needs_teacher()
    with pytest.raises(ConfigError, match=r"'algo.lambda_final' = 2.0 is above 'algo.lambda_' = 1.0"):
        from_dict(RPDConfig, {"teacher": "t", "lambda_final": 2.0, "anneal": "cosine"}, "algo")
    with pytest.raises(ConfigError, match=r"'algo.lambda_final' = 0.5 needs 'algo.anneal' linear or cosine"):
        from_dict(RPDConfig, {"teacher": "t", "lambda_final": 0.5}, "algo")
    with pytest.raises(ConfigError, match=r"'algo.lambda_final' = -0.1"):
        from_dict(RPDConfig, {"teacher": "t", "lambda_final": -0.1, "anneal": "cosine"}, "algo")


class ChunkTeacher:
    """A teacher that plans chunks (B, H, A): step k of every chunk is ``k * step``."""

    def __init__(self, horizon, step):
        self.horizon, self.step = horizon, torch.tensor(step)

    def act(self, obs, deterministic=False):
        from robo_rl.contracts import PolicyOutput

        k = torch.arange(self.horizon, dtype=torch.float32)[None, :, None]
        return PolicyOutput(actions=(k * self.step).expand(obs["state"].shape[0], -1, -1).clone() + 0.25)


@pytest.mark.parametrize("distance", ["mse", "nll"])
def test_a_chunking_teacher_guides_a_one_step_student_with_its_first_action(distance):
    algo = RPD(RPDConfig(teacher="unused", lambda_=1.0, distance=distance), _mlp(0))
    teacher = ChunkTeacher(4, [0.5, -0.5])
    algo.set_teacher(teacher, (2,), (2,))
    obs = _batch().obs
    want = algo.distance(obs, torch.full((64, 2), 0.25))  # the chunk's first action: k = 0
    got = algo.distance(obs, teacher.act(obs).actions)
    assert float(got) == pytest.approx(float(want))
    loss, stats = algo.extra_loss(_batch())
    assert float(stats["teacher_distance"]) == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ConfigError, match=r"teacher acts in shape \(4, 3\) per state but the student in \(2,\)"):
        algo.distance(obs, torch.zeros(64, 4, 3))


class StateTeacher:
    """A deterministic teacher whose action depends on the state, counting its calls and states seen."""

    def __init__(self):
        self.calls, self.states = 0, 0

    def act(self, obs, deterministic=False):
        from robo_rl.contracts import PolicyOutput

        self.calls += 1
        self.states += obs["state"].shape[0]
        return PolicyOutput(actions=torch.tanh(obs["state"][:, :2] - obs["state"][:, 2:]))


def test_the_teacher_acts_once_per_state_per_update_with_the_same_result():
    """The teacher's actions are computed once per batch (not per epoch x minibatch); the update equals
    the one that asks the teacher on every minibatch."""
    common = {"epochs": 3, "minibatches": 4, "target_kl": None, "lambda_": 0.7}
    a, b = _mlp(0), _mlp(0)
    cached = RPD(RPDConfig(teacher="unused", **common), a, generator=torch.Generator().manual_seed(1))
    teacher = StateTeacher()
    cached.set_teacher(teacher, (2,), (2,))
    cached.update(_batch())
    assert teacher.states == 64 and teacher.calls == 4  # in minibatch-sized pieces
    per_mb = RPD(RPDConfig(teacher="unused", **common), b, generator=torch.Generator().manual_seed(1))
    slow = StateTeacher()
    per_mb.set_teacher(slow, (2,), (2,))
    per_mb.extra_loss(_batch().index(torch.arange(4)))  # the uncached path still works for a bare minibatch
    assert slow.calls == 1
    torch.manual_seed(0)
    original = RPD.update
    try:  # the per-minibatch reference: skip the batch-level cache
        RPD.update = lambda self, batch: super(RPD, self).update(batch)
        per_mb.update(_batch())
    finally:
        RPD.update = original
    assert slow.calls == 1 + 3 * 4
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name


@pytest.mark.parametrize("algo", ["opd", "rpd"])
def test_the_teacher_meets_the_student_with_its_init_from_weights(tmp_path, monkeypatch, algo, fake_env):
    """The runner hands the teacher over after ``run.init_from`` loaded the student: OPD compares the two
    token spaces (a pi0's includes its action normalization, a buffer of the checkpoint), so the student
    must not be the freshly built policy then."""
    from robo_rl.algorithms.opd import OPD
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    def cfg(name, algo_cfg, init_from=None):
        return from_dict(TrainConfig, {
            "env": {"name": fake_env, "num_envs": 2, "max_episode_steps": 5},
            "policy": {"name": "mlp", "hidden": [16]}, "algo": algo_cfg,
            "run": {"total_env_steps": 40, "rollout_steps": 10, "eval_every_steps": 0, "final_eval_episodes": 0,
                    "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name,
                    "init_from": init_from}})

    train(cfg("teacher", {"name": "ppo", "minibatches": 2}))
    seen = {}
    cls = OPD if algo == "opd" else RPD
    original = cls.set_teacher

    def spy(self, teacher, *shapes):
        seen["student"] = {k: v.clone() for k, v in self.policy.state_dict().items()}
        seen["teacher"] = {k: v.clone() for k, v in teacher.state_dict().items()}
        return original(self, teacher, *shapes)

    monkeypatch.setattr(cls, "set_teacher", spy)
    teacher_dir = str(tmp_path / "teacher")
    train(cfg("student", {"name": algo, "teacher": teacher_dir, "minibatches": 2}, init_from=teacher_dir))
    assert seen["student"].keys() == seen["teacher"].keys()
    for k, v in seen["teacher"].items():
        assert torch.equal(seen["student"][k], v), k


class GaussianTeacher:
    """A stochastic teacher: N(mean, std) per action dimension, whatever the state."""

    def __init__(self, mean, std, seed=0):
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)
        self.g = torch.Generator().manual_seed(seed)

    def act(self, obs, deterministic=False):
        from robo_rl.contracts import PolicyOutput

        n = obs["state"].shape[0]
        noise = torch.zeros(n, 2) if deterministic else torch.randn(n, 2, generator=self.g)
        return PolicyOutput(actions=self.mean + self.std * noise)


def test_kl_variant_fits_the_teacher_gaussian_and_weights_the_kl_by_the_clamped_ratio():
    """distance kl: the teacher's Gaussian from its samples, KL(student || teacher) in closed form, times
    max(ratio, 1 - clip) per state (hand-computed), and a deterministic teacher's std is the floor."""
    algo = RPD(RPDConfig(teacher="unused", lambda_=0.5, distance="kl", teacher_samples=4000, clip_coef=0.2), _mlp(0))
    algo.set_teacher(GaussianTeacher([0.5, -0.5], [0.2, 0.4]), (2,), (2,))
    batch = _batch(8)
    fitted = algo._teacher_targets(batch.obs)
    assert torch.allclose(fitted["teacher_mean"], torch.tensor([0.5, -0.5]).expand(8, 2), atol=0.03)
    assert torch.allclose(fitted["teacher_std"], torch.tensor([0.2, 0.4]).expand(8, 2), atol=0.03)

    mean_t, std_t = torch.tensor([[0.5, -0.5]]).expand(8, 2), torch.tensor([[0.2, 0.4]]).expand(8, 2)
    mb = dataclasses.replace(batch, aux={"teacher_mean": mean_t, "teacher_std": std_t})
    with torch.no_grad():
        student = algo.policy.action_distribution(batch.obs)
        mu_s, sd_s = student.mean, student.stddev
        kl = (torch.log(std_t / sd_s) + (sd_s**2 + (mu_s - mean_t) ** 2) / (2 * std_t**2) - 0.5).sum(-1)
        new_log_prob = batch.log_prob + torch.tensor([-1.0, -0.5, -0.1, 0.0, 0.1, 0.3, -2.0, 0.05])
        ratio = (new_log_prob - batch.log_prob).exp()
        want = 0.5 * (kl * torch.maximum(ratio, torch.tensor(0.8))).mean()
        loss, stats = algo.extra_loss(dataclasses.replace(mb, aux=mb.aux | {"new_log_prob": new_log_prob}))
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert float(stats["teacher_distance"]) == pytest.approx(float(kl.mean()), rel=1e-5)
    live = new_log_prob.clone().requires_grad_()  # the gradient goes through the ratio where it is not clamped
    algo.extra_loss(dataclasses.replace(mb, aux=mb.aux | {"new_log_prob": live}))[0].backward()
    assert torch.equal(live.grad == 0, ratio < 0.8) and bool((live.grad[ratio >= 0.8] > 0).all())

    det = RPD(RPDConfig(teacher="unused", distance="kl", teacher_samples=3, teacher_std_floor=0.05), _mlp(0))
    det.set_teacher(ConstantTeacher([0.5, -0.5]), (2,), (2,))
    assert torch.equal(det._teacher_targets(batch.obs)["teacher_std"], torch.full((8, 2), 0.05))


def test_kl_variant_pulls_the_student_gaussian_towards_the_teacher_and_refuses_a_student_without_one():
    algo = RPD(RPDConfig(teacher="unused", lambda_=1.0, distance="kl", teacher_samples=32, lr=1e-2, epochs=4,
                         minibatches=2, target_kl=None), _mlp(0), generator=torch.Generator().manual_seed(1))
    algo.set_teacher(GaussianTeacher([0.5, -0.5], [0.2, 0.2]), (2,), (2,))
    batch = _batch(advantages=False)
    fit = algo._teacher_targets(batch.obs)
    with torch.no_grad():
        before = algo.kl_to_teacher(batch.obs, fit["teacher_mean"], fit["teacher_std"]).mean().item()
    for _ in range(5):
        stats = algo.update(batch)
    with torch.no_grad():
        after = algo.kl_to_teacher(batch.obs, fit["teacher_mean"], fit["teacher_std"]).mean().item()
    assert after < 0.5 * before and stats["teacher_distance"] > 0

    class TokenStudent(torch.nn.Module):  # a policy without a Gaussian over actions (e.g. a token VLA)
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    with pytest.raises(ConfigError, match="'algo.distance' = 'kl' needs a student with a Gaussian.*TokenStudent"):
        RPD(RPDConfig(teacher="unused", distance="kl"), TokenStudent())
    with pytest.raises(ConfigError, match="teacher_samples"):
        RPDConfig(teacher="unused", distance="kl", teacher_samples=1)


def test_lambda_anneals_over_its_own_horizon_of_env_steps():
    policy = MLPActorCritic(MLPConfig(hidden=(8,)), {"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    cosine = RPD(RPDConfig(teacher="t", lambda_=2.0, anneal="cosine", anneal_env_steps=1000), policy)
    cosine.set_progress(0.05, 500)  # half of the horizon, a twentieth of the run
    assert cosine.lam == pytest.approx(1.0)
    cosine.set_progress(0.15, 1500)  # past the horizon: 0, and it stays there
    assert cosine.lam == 0.0
    cosine.set_progress(0.5)  # no env-step count given: the run's fraction
    assert cosine.lam == pytest.approx(1.0)
    linear = RPD(RPDConfig(teacher="t", lambda_=2.0, anneal="linear", anneal_env_steps=1000), policy)
    linear.set_progress(0.9, 250)
    assert linear.lam == pytest.approx(1.5)
    with pytest.raises(ConfigError, match=r"'algo.anneal_env_steps' = -1"):
        from_dict(RPDConfig, {"teacher": "t", "anneal_env_steps": -1}, "algo")


def test_the_trainer_anneals_lambda_to_zero_within_anneal_env_steps(tmp_path, fake_env):
    """A run gives the algorithm its env-step count: lambda is 0 from ``anneal_env_steps`` on, although the
    run is four times longer."""
    import csv

    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    def cfg(name, algo, steps):
        return from_dict(TrainConfig, {
            "env": {"name": fake_env, "num_envs": 2, "max_episode_steps": 4},
            "policy": {"name": "mlp", "hidden": [8]}, "algo": {"minibatches": 1, "epochs": 1, **algo},
            "run": {"total_env_steps": steps, "rollout_steps": 4, "eval_every_steps": 0, "final_eval_episodes": 0,
                    "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name}})

    train(cfg("teacher", {"name": "ppo"}, 8))
    train(cfg("student", {"name": "rpd", "teacher": str(tmp_path / "teacher"), "anneal": "linear",
                          "anneal_env_steps": 16}, 64))
    with open(tmp_path / "student" / "metrics.csv") as f:
        rows = [(int(r["env_steps"]), float(r["loss/teacher_lambda"])) for r in csv.DictReader(f)]
    assert [s for s, _ in rows] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert rows[0][1] == pytest.approx(0.5)
    assert all(lam == 0.0 for s, lam in rows if s >= 16)


def test_a_run_with_lambda_zero_does_not_load_its_teacher(tmp_path, monkeypatch, fake_env):
    """lambda_ 0 (PPO alone, the baseline arm of a comparison) never asks the teacher: the runner does not
    load it (a VLA teacher costs seconds and memory), while lambda_ > 0 does; both runs train."""
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    def cfg(name, algo):
        return from_dict(TrainConfig, {
            "env": {"name": fake_env, "num_envs": 2, "max_episode_steps": 4},
            "policy": {"name": "mlp", "hidden": [8]}, "algo": {"minibatches": 1, "epochs": 1, **algo},
            "run": {"total_env_steps": 16, "rollout_steps": 4, "eval_every_steps": 0, "final_eval_episodes": 0,
                    "video": False, "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name}})

    train(cfg("teacher", {"name": "ppo"}))
    handed = []
    original = RPD.set_teacher
    monkeypatch.setattr(RPD, "set_teacher", lambda self, *a: (handed.append(a[0]), original(self, *a)))
    assert not RPD(RPDConfig(teacher="t", lambda_=0.0), _mlp(0)).needs_teacher()
    assert RPD(RPDConfig(teacher="t", lambda_=0.5), _mlp(0)).needs_teacher()
    train(cfg("ppo-arm", {"name": "rpd", "teacher": str(tmp_path / "teacher"), "lambda_": 0.0}))
    assert handed == []
    assert (tmp_path / "ppo-arm" / "metrics.csv").exists()
    train(cfg("rpd-arm", {"name": "rpd", "teacher": str(tmp_path / "teacher"), "lambda_": 0.5}))
    assert len(handed) == 1


def test_copy_r2_against_hand_computed_values():
    """Per dimension 1 - MSE / var(teacher), averaged over the dimensions the teacher varies in: a
    constant gripper dimension is left out, a perfect copy is 1, the teacher's batch mean 0."""
    from robo_rl.algorithms.rpd import copy_r2

    teacher = torch.tensor([[0.0, 0.0, 1.0], [0.2, 1.0, 1.0], [0.4, 2.0, 1.0], [0.6, 3.0, 1.0]])
    student = teacher.clone()
    student[:, 0] = 0.3  # the teacher's mean in dim 0: R^2 0 there
    student[:, 2] = -1.0  # far off in the constant dimension: ignored
    # dim 1: errors (1, -1, 1, -1) -> MSE 1; var of (0, 1, 2, 3) = 1.25 -> 1 - 1 / 1.25 = 0.2
    student[:, 1] = teacher[:, 1] + torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert float(copy_r2(student, teacher)) == pytest.approx((0.0 + 0.2) / 2, abs=1e-6)
    assert float(copy_r2(teacher, teacher)) == pytest.approx(1.0)
    # small actions, small MSE, and still worse than the mean: the raw distance hides what R^2 shows
    small = 0.03 * teacher[:, :2]
    wrong = small + 0.05 * torch.tensor([[1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]])
    assert float(((wrong - small) ** 2).mean()) < 0.003 and float(copy_r2(wrong, small)) < -1.0
    assert copy_r2(student[:, 2:], teacher[:, 2:]) is None  # nothing varies: nothing to explain
    assert copy_r2(student[:1], teacher[:1]) is None


@pytest.mark.parametrize("distance", ["mse", "nll", "kl"])
def test_the_update_logs_how_well_the_student_copies(distance):
    """``teacher_r2`` is logged next to the distance, and rises as the pull brings the student to a teacher
    whose actions vary with the state."""

    class LinearTeacher:
        def act(self, obs, deterministic=False):
            from robo_rl.contracts import PolicyOutput

            return PolicyOutput(actions=0.5 * obs["state"][:, :2])

    student = _mlp(0)
    algo = RPD(RPDConfig(teacher="unused", lambda_=1.0, distance=distance, lr=1e-2, epochs=4, minibatches=2,
                         target_kl=None, teacher_std_floor=0.05), student, generator=torch.Generator().manual_seed(1))
    algo.set_teacher(LinearTeacher(), (2,), (2,))
    from robo_rl.algorithms.rpd import copy_r2

    batch = _batch(advantages=False)
    with torch.no_grad():
        untrained = copy_r2(student.act(batch.obs, deterministic=True).actions, 0.5 * batch.obs["state"][:, :2])
    for _ in range(10):
        last = algo.update(batch)["teacher_r2"]
    assert float(untrained) < 0.1 and 0.9 < last <= 1.0
