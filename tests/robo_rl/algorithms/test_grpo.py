"""GRPO: group-relative advantages, the asymmetric clipped objective, group rollouts with dynamic
sampling on a registered simulator-free env, and a short training run through the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from robo_rl.algorithms.advantages import GroupRelative
from robo_rl.algorithms.grpo import GRPOConfig, grpo_loss
from robo_rl.batch import Trajectories
from robo_rl.errors import ConfigError
from robo_rl.registry import ENVS
from tests.conftest import FAKE_ENV

FAKE = FAKE_ENV


@pytest.fixture(autouse=True)
def _registered(fake_env):
    """The simulator-free env, registered for this module's tests."""


def _traj(success_at: list[int | None], length: int = 4) -> Trajectories:
    """B envs in groups of 4; env b succeeds at step success_at[b] (None: truncated at the end)."""
    b = len(success_at)
    success = torch.zeros(length, b, dtype=torch.bool)
    valid = torch.zeros(length, b, dtype=torch.bool)
    for i, t in enumerate(success_at):
        end = length - 1 if t is None else t
        valid[: end + 1, i] = True
        if t is not None:
            success[t, i] = True
    z = torch.zeros(length, b)
    return Trajectories({"state": torch.arange(length * b, dtype=torch.float32).reshape(length, b, 1)}, {},
                        z, z, z, z.clone(), success.clone(), torch.zeros_like(success), success, valid,
                        torch.arange(b) // 4)


def test_group_relative_advantages_and_their_broadcast():
    traj = _traj([1, None, None, None, 0, 2, 1, 3])  # group 0: 1 of 4 succeeds; group 1: all succeed
    adv = GroupRelative().episode_advantages(traj)
    sd = math.sqrt(0.25 * 0.75)
    torch.testing.assert_close(adv[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (sd + 1e-6))
    assert torch.equal(adv[4:], torch.zeros(4))  # no signal in a group of equal outcomes
    torch.testing.assert_close(GroupRelative(scale_std=False).episode_advantages(traj)[:4],
                               torch.tensor([0.75, -0.25, -0.25, -0.25]))  # Dr. GRPO: centred only
    batch = GroupRelative()(traj)
    assert batch.size == int(traj.valid.sum())  # the steps after an episode ended are not trained on
    # every valid step of env 0 (steps 0 and 1) carries env 0's advantage
    rows = (batch.obs["state"][:, 0] % 8 == 0).nonzero().squeeze(1)
    assert len(rows) == 2 and torch.allclose(batch.advantages[rows], adv[0].expand(2))
    with pytest.raises(ValueError, match="need group rollouts"):
        GroupRelative()(Trajectories({}, {}, *([torch.zeros(2, 2)] * 4), *([torch.zeros(2, 2, dtype=torch.bool)] * 3)))


def test_clip_higher_bounds_each_side_and_averages_every_token():
    old = torch.zeros(4, 3)
    new = torch.log(torch.tensor([[1.5] * 3, [1.5] * 3, [0.5] * 3, [0.5] * 3])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, terms = grpo_loss(new, old, adv, clip_low=0.2, clip_high=0.28)
    # per token: min(r A, clip(r) A): A>0,r=1.5 -> 1.28; A<0,r=1.5 -> -1.5; A>0,r=0.5 -> 0.5; A<0,r=0.5 -> -0.8
    assert loss.item() == pytest.approx(-(1.28 - 1.5 + 0.5 - 0.8) / 4)
    loss.backward()
    g = new.grad
    assert torch.all(g[0] == 0) and torch.all(g[3] == 0)  # clipped: no gradient
    assert torch.all(g[1] != 0) and torch.all(g[2] != 0)
    assert terms["clip_frac_high"].item() == pytest.approx(0.25) and terms["clip_frac_low"].item() == pytest.approx(0.25)


def test_group_rollouts_share_initial_states_and_drop_uninformative_groups():
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.rollout.groups import GroupCollector

    env = ENVS.get(FAKE)(ENVS.get(FAKE).Config(num_envs=8, max_episode_steps=5))
    torch.manual_seed(0)
    policy = MLPActorCritic(MLPConfig(hidden=(16,), init_log_std=0.5), env.obs_spec, env.action_spec)
    col = GroupCollector(env, policy, group_size=4, min_groups=1, max_rounds=3, max_steps=50)
    obs = col.reset(seed=7)
    s = obs["state"]  # 8 envs in 2 groups: env i in group i % 2
    assert torch.equal(s[0], s[2]) and torch.equal(s[0], s[6]) and torch.equal(s[1], s[7])
    assert not torch.equal(s[0], s[1])
    traj, steps = col.collect()
    r = col.report
    assert 1 <= r["rounds"] <= 3 and r["groups"] == 2 * r["rounds"] and steps >= 8
    if r["informative_groups"]:  # only groups with differing outcomes are kept
        _, success = traj.episode_outcomes()
        for g in traj.group.unique():
            assert success[traj.group == g].unique().numel() == 2
    v = traj.valid
    # each env's valid steps are a prefix that ends where its episode ended
    for b in range(v.shape[1]):
        n = int(v[:, b].sum())
        assert v[:n, b].all() and not v[n:, b].any()
        assert bool(traj.terminated[n - 1, b] or traj.truncated[n - 1, b])
    with pytest.raises(ConfigError, match="not a multiple of algo.group_size=3"):
        GroupCollector(env, policy, group_size=3, min_groups=1, max_rounds=1)


@pytest.mark.parametrize("order", ["per_task", "per_group"])
def test_group_seeds_walk_each_tasks_states_or_keep_the_parity_split(order):
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.rollout.groups import GroupCollector
    from tests.fakes.vec import PointReachConfig, PointReachVecEnv

    class TwoTasks(PointReachVecEnv):
        """Env i runs task i % 2 (as a LIBERO VecEnv cycles its tasks); records each reset's seeds."""

        def __init__(self, cfg: PointReachConfig) -> None:
            super().__init__(cfg)
            self.resets: list[list[int | None]] = []

        def _obs(self) -> dict:
            return {**super()._obs(), "instruction": [f"task {i % 2}" for i in range(self.num_envs)]}

        def reset_each(self, seeds):
            self.resets.append(list(seeds))
            return super().reset_each(seeds)

    env = TwoTasks(PointReachConfig(num_envs=8, max_episode_steps=3))
    policy = MLPActorCritic(MLPConfig(hidden=(8,)), env.obs_spec, env.action_spec)
    col = GroupCollector(env, policy, group_size=2, min_groups=100, max_rounds=3, group_seeds=order)
    col.reset(seed=7)
    col.collect()  # never enough informative groups: exactly 3 rounds
    rounds = env.resets[1:]
    assert len(rounds) == 3
    for seeds in rounds:  # envs of one group (i % 4) share a seed
        assert all(seeds[i] == seeds[i % 4] for i in range(8))
    per_task = {t: sorted(s[g] for s in rounds for g in range(4) if g % 2 == t) for t in (0, 1)}
    if order == "per_task":  # each task takes the next states in turn: 6 groups, 6 consecutive seeds
        assert per_task == {0: list(range(7, 13)), 1: list(range(7, 13))}
    else:  # group g of round k: 7 + 4k + g, so task 0 only ever sees odd seeds and task 1 even ones
        assert per_task == {0: [7, 9, 11, 13, 15, 17], 1: [8, 10, 12, 14, 16, 18]}
    with pytest.raises(ConfigError, match="group_seeds='each'"):
        GroupCollector(env, policy, group_size=2, min_groups=1, max_rounds=1, group_seeds="each")


def test_grpo_trains_through_the_trainer(tmp_path):
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import train

    cfg = from_dict(TrainConfig, {
        "env": {"name": FAKE, "num_envs": 8, "max_episode_steps": 6},
        "policy": {"name": "mlp", "hidden": [32], "init_log_std": 0.0},
        "algo": {"name": "grpo", "group_size": 4, "min_groups": 1, "max_rounds": 2, "minibatches": 2, "lr": 1e-3},
        "run": {"total_env_steps": 600, "eval_every_steps": 0, "final_eval_episodes": 4, "video": False,
                "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": "g"}})
    summary = train(cfg)
    import csv

    rows = list(csv.DictReader(open(tmp_path / "g" / "metrics.csv")))
    assert summary["env_steps"] >= 600 and rows and all(r["rollout/groups"] for r in rows)
    assert all(math.isfinite(float(r["loss/grad_norm"])) for r in rows if r["loss/grad_norm"])
    assert "final_eval" in summary


def test_grpo_config_ranges():
    with pytest.raises(ConfigError, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="clip_low"):
        GRPOConfig(clip_low=1.0)
    assert np.isclose(GRPOConfig().clip_high, 0.28)


def test_kl_reference_is_the_policy_the_run_starts_from_and_survives_a_resume(tmp_path):
    """With kl_coef > 0 the frozen reference is the run.init_from policy (not the random init the algorithm
    was built with), and a resumed run regularises towards that same reference."""
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.config import from_dict
    from robo_rl.run_config import TrainConfig
    from robo_rl.runners.train import Trainer, load_run_config, train

    def cfg(name, **algo):
        return from_dict(TrainConfig, {
            "env": {"name": FAKE, "num_envs": 4, "max_episode_steps": 4},
            "policy": {"name": "mlp", "hidden": [16], "init_log_std": 0.0},
            "algo": {"name": "grpo", "group_size": 2, "min_groups": 1, "max_rounds": 1, "minibatches": 1, **algo},
            "run": {"total_env_steps": 32, "eval_every_steps": 0, "final_eval_episodes": 0, "video": False,
                    "progress": False, "tensorboard": False, "out_dir": str(tmp_path), "name": name,
                    **({"init_from": str(tmp_path / "base")} if name != "base" else {})}})

    train(cfg("base", lr=1e-2))
    base = ckpt_io.load_model_state(ckpt_io.resolve(str(tmp_path / "base")))
    (tmp_path / "kl").mkdir()
    first = Trainer(cfg("kl", kl_coef=0.1, lr=1e-2), tmp_path / "kl")
    first.run()
    ref = first.algo.reference.state_dict()
    assert all(torch.equal(ref[k], base[k]) for k in base)  # the init_from weights, not the random init
    assert not all(torch.equal(first.policy.state_dict()[k], base[k]) for k in base)  # the policy moved on
    again = Trainer(load_run_config(tmp_path / "kl", ["run.total_env_steps=64"]), tmp_path / "kl", resume=True,
                    write_config=True)
    again.run()
    assert all(torch.equal(again.algo.reference.state_dict()[k], base[k]) for k in base)


def test_a_kl_run_without_a_saved_reference_is_refused_not_regularised_towards_another_policy():
    """A GRPO state written before the KL reference was saved cannot silently take the freshly built policy as
    its reference: loading it with kl_coef > 0 names the way out; with kl_coef 0 it loads."""
    from robo_rl.algorithms.grpo import GRPO

    state = GRPO(GRPOConfig(kl_coef=0.1), torch.nn.Linear(3, 2)).state_dict()
    assert "reference" in state
    del state["reference"]
    with pytest.raises(ValueError, match="no KL reference.*algo.kl_coef=0"):
        GRPO(GRPOConfig(kl_coef=0.1), torch.nn.Linear(3, 2)).load_state_dict(state)
    GRPO(GRPOConfig(), torch.nn.Linear(3, 2)).load_state_dict(state)


def test_self_imitation_needs_a_policy_that_can_imitate_its_own_actions():
    from policies.mlp import MLPActorCritic, MLPConfig
    from robo_rl.algorithms.grpo import GRPO
    from robo_rl.contracts import ArraySpec

    policy = MLPActorCritic(MLPConfig(hidden=(8,)), {"state": ArraySpec((3,), "float32")}, ArraySpec((2,), "float32", -1.0, 1.0))
    GRPO(GRPOConfig(sil_coef=0.0), policy)  # off: any policy
    with pytest.raises(ConfigError, match=r"not SelfImitator \(no self_imitation_loss\).*algo.sil_coef=0"):
        GRPO(GRPOConfig(sil_coef=0.5), policy)
    with pytest.raises(ConfigError, match="sil_coef"):
        GRPOConfig(sil_coef=-1.0)
