"""Data-parallel learners (DDP and FSDP over torch.distributed gloo, as Ray actors on a private local
Ray): an update on two learners, each with half of a batch, equals the one-process update on the
whole batch (full-batch steps, so the averaged gradient is the same); the optimizer state gathers and
restores; bad requests fail in one line."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import REPO

ray = pytest.importorskip("ray")

N, OBS, ACT = 64, 10, 4


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _cfg(*overrides):
    from robo_rl.config import load
    from robo_rl.run_config import TrainConfig

    return load(TrainConfig, REPO / "configs" / "quickstart.yaml",
                ["policy.hidden=[32,32]", "algo.epochs=3", "algo.minibatches=1", "algo.norm_adv=false",
                 "algo.target_kl=null", "cluster.address=local", "cluster.num_learners=2",
                 "cluster.cpus_per_learner=0", *overrides])


def _setup(cfg):
    """(policy, obs spec, action spec, a batch of N transitions the policy could have collected)."""
    from robo_rl.batch import RolloutBatch
    from robo_rl.build import build_policy
    from robo_rl.contracts import ArraySpec

    torch.manual_seed(0)
    obs_spec = {"state": ArraySpec((OBS,), "float32")}
    action_spec = ArraySpec((ACT,), "float32", -1.0, 1.0)
    policy = build_policy(cfg.policy, obs_spec, action_spec)
    obs = {"state": torch.randn(N, OBS)}
    policy.update_normalizer(obs)  # a non-trivial buffer the learners must get
    with torch.no_grad():
        out = policy.act(obs)
        log_prob, _, value = policy.evaluate(obs, out.extras)
    batch = RolloutBatch(obs, dict(out.extras), log_prob, value, torch.randn(N), value + torch.randn(N))
    return policy, obs_spec, action_spec, batch


def _save_teacher(base, run_dir):
    """A teacher checkpoint under ``run_dir``: the test policy with its weights moved."""
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.config import to_dict

    teacher_policy = _setup(base)[0]
    with torch.no_grad():
        for p in teacher_policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    meta = {"policy": "mlp", "obs_spec": {"state": [OBS]}, "action_spec": {"shape": [ACT], "low": -1.0, "high": 1.0},
            "config": to_dict(base)}
    ckpt_io.save(run_dir / "checkpoints", 1, teacher_policy.state_dict(), {}, meta)


def _teacher_guided(cfg, teacher_dir):
    """(policy the learners update, its one-process copy, the one-process algorithm with its teacher set,
    the learners, a batch)."""
    from robo_rl.build import build_algorithm, policy_from_checkpoint
    from robo_rl.distributed.learner import RayLearners

    policy, obs_spec, action_spec, batch = _setup(cfg)
    single = copy.deepcopy(policy)
    algo = build_algorithm(cfg.algo, single, generator=torch.Generator().manual_seed(0))
    teacher, _, teacher_actions = policy_from_checkpoint(str(teacher_dir))
    algo.set_teacher(teacher, action_spec.shape, teacher_actions.shape)
    return policy, single, algo, RayLearners(cfg, ray, policy, obs_spec, action_spec), batch


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_learners_equal_one_process(local_ray, strategy):
    from robo_rl.build import build_algorithm
    from robo_rl.distributed.learner import RayLearners

    cfg = _cfg(f"cluster.learner_strategy={strategy}")
    policy, obs_spec, action_spec, batch = _setup(cfg)
    single = copy.deepcopy(policy)
    algo = build_algorithm(cfg.algo, single, generator=torch.Generator().manual_seed(0))
    learners = RayLearners(cfg, ray, policy, obs_spec, action_spec)
    try:
        for _ in range(2):  # two updates: the second starts from the learners' own optimizer state
            want = algo.update(batch)
            got = learners.update(batch)
            for k, v in single.state_dict().items():
                assert torch.allclose(policy.state_dict()[k], v, atol=1e-5, rtol=1e-4), k
            assert got["policy_loss"] == pytest.approx(want["policy_loss"], abs=1e-5)
        moved = any(not torch.equal(policy.state_dict()[k], v) for k, v in _setup(cfg)[0].state_dict().items())
        assert moved  # the updates did change the weights
        state = learners.state_dict()
        assert state["updates"] == 2 and state.get("learner_strategy", "ddp") == strategy
        # a fresh group restored from that state continues exactly like the one-process learner
        learners.close()
        learners.load_state_dict(state)
        algo.update(batch)
        learners.update(batch)
        for k, v in single.state_dict().items():
            assert torch.allclose(policy.state_dict()[k], v, atol=1e-5, rtol=1e-4), k
    finally:
        learners.close()


def test_rpd_on_ddp_learners_equals_one_process(local_ray, tmp_path):
    """RPD's teacher term calls the student outside the DDP wrapper; the averaged gradient must still
    be the one-process gradient (a teacher checkpoint written by the test; lambda well above zero)."""
    base = _cfg()
    _save_teacher(base, tmp_path / "teacher")
    cfg = _cfg("algo.name=rpd", f"algo.teacher={tmp_path / 'teacher'}", "algo.lambda_=2.0", "algo.minibatches=1",
               "algo.epochs=3", "algo.norm_adv=false", "algo.target_kl=null", "algo.anneal=linear",
               "algo.anneal_env_steps=100")
    policy, single, algo, learners, batch = _teacher_guided(cfg, tmp_path / "teacher")
    try:
        algo.set_progress(0.01, 50)  # the learners anneal over the same horizon of env steps: lambda 2 -> 1
        learners.set_progress(0.01, 50)
        want = algo.update(batch)
        got = learners.update(batch)
        assert want["teacher_lambda"] == pytest.approx(1.0) and got["teacher_lambda"] == pytest.approx(1.0)
        assert want["teacher_distance"] > 0.01 and got["teacher_distance"] == pytest.approx(want["teacher_distance"], rel=1e-4)
        for k, v in single.state_dict().items():
            assert torch.allclose(policy.state_dict()[k], v, atol=1e-5, rtol=1e-4), k
    finally:
        learners.close()


def test_learner_requests_fail_in_one_line(local_ray):
    from robo_rl.distributed.learner import check_algorithm
    from robo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a Ray cluster"):
        _cfg("cluster.address=null")
    with pytest.raises(ConfigError, match="use ddp or fsdp|learner_strategy"):
        _cfg("cluster.learner_strategy=zero3")
    cfg = _cfg("algo.name=rpd", "algo.teacher=runs/x", "cluster.learner_strategy=fsdp")
    with pytest.raises(ConfigError, match="cannot run on cluster.learner_strategy='fsdp'.*supports: ddp"):
        check_algorithm(cfg)


@pytest.mark.parametrize(("loss", "strategy"), [("kl", "ddp"), ("kl", "fsdp")])
def test_opd_on_data_parallel_learners_equals_one_process(local_ray, tmp_path, loss, strategy):
    """OPD's exact-KL loss takes whole distributions from the student through the DDP or FSDP wrapper (their
    parameters must reach DDP's search for the tensors the loss uses); two learners with half a batch
    each must still update like one process on the whole batch."""
    from robo_rl.config import from_dict, to_dict
    from robo_rl.run_config import TrainConfig

    base = _cfg()
    _save_teacher(base, tmp_path / "teacher")
    raw = to_dict(base)
    raw["algo"] = {"name": "opd", "teacher": str(tmp_path / "teacher"), "loss": loss, "lr": 1e-3, "epochs": 2,
                   "minibatches": 1}
    raw["cluster"]["learner_strategy"] = strategy
    cfg = from_dict(TrainConfig, raw)
    policy, single, algo, learners, batch = _teacher_guided(cfg, tmp_path / "teacher")
    try:
        want = algo.update(batch)
        got = learners.update(batch)
        assert want["policy_loss"] != 0 and got["policy_loss"] == pytest.approx(want["policy_loss"], abs=1e-5)
        for k, v in single.state_dict().items():
            assert torch.allclose(policy.state_dict()[k], v, atol=1e-5, rtol=1e-4), k
        assert any(not torch.equal(policy.state_dict()[k], v) for k, v in _setup(cfg)[0].state_dict().items())
    finally:
        learners.close()
