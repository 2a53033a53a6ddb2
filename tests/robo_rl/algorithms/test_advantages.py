import pytest
import torch

from robo_rl.algorithms.advantages import GAE, gae
from robo_rl.batch import Trajectories


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_matches_hand_computation_without_episode_end():
    # one env, 3 steps, gamma .9, lambda .5
    r, v = _t([[1.0], [2.0], [3.0]]), _t([[0.5], [1.0], [1.5]])
    nv = _t([[1.0], [1.5], [2.0]])  # V(s_{t+1}); last = bootstrap value
    f = torch.zeros(3, 1, dtype=torch.bool)
    adv, ret = gae(r, v, nv, f, f, gamma=0.9, lam=0.5)
    d2 = 3 + 0.9 * 2.0 - 1.5  # 3.3
    d1 = 2 + 0.9 * 1.5 - 1.0  # 2.35
    d0 = 1 + 0.9 * 1.0 - 0.5  # 1.4
    a2 = d2
    a1 = d1 + 0.45 * a2
    a0 = d0 + 0.45 * a1
    assert torch.allclose(adv[:, 0], torch.tensor([a0, a1, a2]), atol=1e-6)
    assert torch.allclose(ret, adv + v)


def test_terminated_does_not_bootstrap_and_cuts_recursion():
    r, v = _t([[1.0], [1.0]]), _t([[0.0], [0.0]])
    nv = _t([[5.0], [7.0]])  # nv[0] is the value of the terminal state: must be ignored
    term = torch.tensor([[True], [False]])
    trunc = torch.zeros(2, 1, dtype=torch.bool)
    adv, _ = gae(r, v, nv, term, trunc, gamma=0.5, lam=1.0)
    assert adv[0, 0].item() == 1.0  # no bootstrap, no carry from step 1
    assert adv[1, 0].item() == 1.0 + 0.5 * 7.0


def test_truncated_bootstraps_from_final_obs_value_but_cuts_recursion():
    r, v = _t([[1.0], [1.0]]), _t([[0.0], [0.0]])
    nv = _t([[4.0], [2.0]])  # nv[0] = V(final_obs) of the truncated episode
    term = torch.zeros(2, 1, dtype=torch.bool)
    trunc = torch.tensor([[True], [False]])
    adv, _ = gae(r, v, nv, term, trunc, gamma=0.5, lam=1.0)
    assert adv[0, 0].item() == 1.0 + 0.5 * 4.0  # bootstrapped, not carried from step 1
    assert adv[1, 0].item() == 1.0 + 0.5 * 2.0


def test_rollout_buffer_uses_final_obs_values_for_finished_envs():
    import numpy as np

    from robo_rl.rollout.buffer import RolloutBuffer

    buf = RolloutBuffer(2, 2)
    obs = {"state": torch.zeros(2, 3)}
    # step 0: env 1 truncated, V(final_obs)=10; step 1: nothing ends
    buf.add(obs, {}, torch.zeros(2), torch.tensor([1.0, 1.0]), np.array([0.0, 0.0]), np.array([False, False]),
            np.array([False, True]), torch.tensor([0.0, 10.0]), np.array([False, True]))
    buf.add(obs, {}, torch.zeros(2), torch.tensor([3.0, 3.0]), np.array([0.0, 0.0]), np.array([False, False]),
            np.array([False, False]))
    traj = buf.finish(torch.tensor([6.0, 6.0]))
    assert torch.equal(traj.next_values, torch.tensor([[3.0, 10.0], [6.0, 6.0]]))
    batch = GAE(gamma=1.0, lam=1.0)(traj)
    # env 0 advantage at t=0 carries through t=1; env 1 does not
    adv = batch.advantages.reshape(2, 2)
    assert adv[0, 0].item() == (0 + 3 - 1) + (0 + 6 - 3)
    assert adv[0, 1].item() == 0 + 10 - 1


def test_bootstrap_on_terminated_treats_success_like_truncation():
    import numpy as np

    from robo_rl.rollout.buffer import RolloutBuffer

    def run(flag):
        buf = RolloutBuffer(1, 1)
        buf.add({"state": torch.zeros(1, 2)}, {}, torch.zeros(1), torch.tensor([0.0]), np.array([1.0]),
                np.array([True]), np.array([False]), torch.tensor([4.0]), np.array([True]))
        return GAE(0.5, 1.0, bootstrap_on_terminated=flag)(buf.finish(torch.tensor([9.0]))).advantages.item()

    assert run(False) == 1.0  # terminal: no bootstrap
    assert run(True) == 1.0 + 0.5 * 4.0  # bootstrapped from V(final_obs), not from the next episode's 9.0


def test_episode_stats_count_env_steps_of_action_chunks():
    """With chunks the episode length is in env steps (what env_steps counts), not policy decisions."""
    import numpy as np

    from robo_rl.rollout.stats import EpisodeStats

    s = EpisodeStats(2)
    for k in range(4):
        done = np.array([k == 3, k == 1])
        s.update(np.ones(2), done, done, steps=np.array([5, 3 if k < 1 else 2]))
    assert list(s.lengths) == [5, 20] and list(s.returns) == [2.0, 4.0]
    s.update(np.ones(2), np.array([True, False]), np.zeros(2, bool))  # no chunks: one env step a row
    assert list(s.lengths)[-1] == 1


def test_cnn_refuses_images_too_small_for_its_convolutions():
    import pytest

    from policies.cnn import CNNActorCritic, CNNConfig
    from robo_rl.contracts import ArraySpec
    from robo_rl.errors import ConfigError

    act = ArraySpec((4,), "float32", -1.0, 1.0)
    with pytest.raises(ConfigError, match="at least 36x36 px; the env gives 32x32: set env.image_size >= 36"):
        CNNActorCritic(CNNConfig(), {"rgb": ArraySpec((1, 32, 32, 3), "uint8")}, act)
    CNNActorCritic(CNNConfig(), {"rgb": ArraySpec((1, 36, 36, 3), "uint8")}, act)


def _random_traj(steps: int, envs: int, seed: int) -> Trajectories:
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(steps, envs, generator=g)  # noqa: E731
    done = torch.rand(steps, envs, generator=g) < 0.2
    return Trajectories({"state": torch.randn(steps, envs, 3, generator=g)}, {"action": torch.randn(steps, envs, 2, generator=g)},
                        r(), r(), r(), r(), done & (torch.rand(steps, envs, generator=g) < 0.5), done, done)


def test_env_wise_joined_trajectories_give_each_part_its_own_advantages():
    """Rollout workers' (T, B_k) trajectories joined along B (the Ray path) are estimated column by column:
    every env's advantages equal those of its own worker's trajectories."""
    parts = [_random_traj(5, 2, 0), _random_traj(5, 3, 1)]
    est = GAE(0.9, 0.8)
    joined = est(Trajectories.cat(parts))
    adv = joined.advantages.reshape(5, 5)
    assert torch.equal(adv[:, :2], est(parts[0]).advantages.reshape(5, 2))
    assert torch.equal(adv[:, 2:], est(parts[1]).advantages.reshape(5, 3))
    assert torch.equal(joined.obs["state"].reshape(5, 5, 3)[:, 2:], parts[1].obs["state"])
    with pytest.raises(ValueError, match="different lengths"):
        Trajectories.cat([_random_traj(5, 2, 0), _random_traj(4, 2, 0)])


def test_unknown_advantage_estimator_is_a_config_error():
    from robo_rl.algorithms.ppo import PPOConfig
    from robo_rl.errors import RegistryError

    with pytest.raises(RegistryError, match="unknown advantage estimator 'gea'.*did you mean 'gae'"):
        PPOConfig(advantage="gea")
