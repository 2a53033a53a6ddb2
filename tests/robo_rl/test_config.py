import dataclasses

import pytest

from robo_rl.config import apply_overrides, from_dict, load
from robo_rl.errors import ConfigError, RegistryError
from robo_rl.registry import ENVS, POLICIES, Registry
from robo_rl.run_config import TrainConfig
from tests.conftest import REPO

BASE = {"env": {"name": "maniskill", "task": "PickCube-v1"}}


def test_defaults_and_sections_resolve_to_their_config_classes():
    cfg = from_dict(TrainConfig, BASE)
    assert type(cfg.env).__name__ == "ManiSkillConfig" and cfg.env.task == "PickCube-v1"
    assert cfg.policy.name == "mlp" and cfg.algo.name == "ppo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.run.seed = 3  # frozen


def test_dotted_overrides_parse_yaml_values():
    data = apply_overrides(BASE, ["algo.lr=1e-3", "policy.hidden=[64,64]", "run.name=x", "env.max_episode_steps=null"])
    cfg = from_dict(TrainConfig, data)
    assert cfg.algo.lr == 1e-3 and cfg.policy.hidden == (64, 64) and cfg.run.name == "x"
    assert cfg.env.max_episode_steps is None
    assert BASE == {"env": {"name": "maniskill", "task": "PickCube-v1"}}  # input untouched

    cfg = from_dict(TrainConfig, apply_overrides(BASE, ["run.total_env_steps=3e5", "run.rollout_steps=1.6e1"]))
    assert cfg.run.total_env_steps == 300_000 and cfg.run.rollout_steps == 16  # as 3e-4 is a float
    with pytest.raises(ConfigError, match="'run.total_env_steps' = '2.5e0' has the wrong type; expected int"):
        from_dict(TrainConfig, apply_overrides(BASE, ["run.total_env_steps=2.5e0"]))


@pytest.mark.parametrize("overrides, fragment", [
    (["algo.lrr=1e-3"], "unknown config key 'algo.lrr': did you mean 'lr'?"),
    (["algo.epochs=two"], "config key 'algo.epochs' = 'two' has the wrong type; expected int"),
    (["env.obs_mode=depth"], "config key 'env.obs_mode' = 'depth' is not allowed; choose one of 'state' | 'rgb'"),
    (["policy.name=mlpp"], "unknown policy 'mlpp': did you mean 'mlp'?"),
    (["algo.name=ppx"], "unknown algorithm 'ppx': did you mean 'ppo'?"),
    (["run.total_env_steps=0"], "'run.total_env_steps' = 0: must be an integer >= 1"),
    (["run.video=3"], "config key 'run.video' = 3 has the wrong type; expected bool"),
    (["run.checkpoint_every_steps=0"], "'run.checkpoint_every_steps' = 0: must be an integer >= 1"),
    (["run.keep_checkpoints=0"], "'run.keep_checkpoints' = 0: must be an integer >= 1"),
    (["run.eval_every_steps=-5"], "'run.eval_every_steps' = -5: must be an integer >= 0"),
    (["run.final_eval_episodes=-1"], "'run.final_eval_episodes' = -1: must be an integer >= 0"),
    (["run.max_minutes=0"], "'run.max_minutes' = 0.0: must be a finite number > 0 (or null)"),
    (["nosuch=1"], "unknown config key 'nosuch'"),
    (["algo.gamma"], "must look like key.sub=value"),
])
def test_bad_configs_give_one_line_errors(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        from_dict(TrainConfig, apply_overrides(BASE, overrides))
    msg = str(info.value)
    assert fragment in msg
    assert "\n" not in msg


def test_missing_env_section_is_named():
    with pytest.raises(ConfigError, match="missing config key 'env'"):
        from_dict(TrainConfig, {})


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; pass a YAML file such as configs/quickstart.yaml"):
        load(TrainConfig, tmp_path / "nope.yaml")
    from real_robot.config import load_robot

    with pytest.raises(ConfigError, match="does not exist; pass a YAML file such as configs/robots/panda_sim.yaml"):
        load_robot(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load(TrainConfig, bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load(TrainConfig, lst)


def test_shipped_configs_load():

    for path in sorted((REPO / "configs").glob("*.yaml")):
        load(TrainConfig, path)


def test_registry_lazy_and_close_matches():
    reg = Registry("widgets", {"alpha": "json:dumps"})
    assert "alpha" in reg and reg.get("alpha").__name__ == "dumps"
    with pytest.raises(RegistryError, match="did you mean 'alpha'"):
        reg.get("alpah")
    with pytest.raises(RegistryError, match="must look like"):
        reg.register("beta", "no_colon")
    assert "maniskill" in ENVS.names() and "mlp" in POLICIES.names()


def test_core_imports_no_simulator():
    import subprocess
    import sys

    code = ("import sys, robo_rl.cli, robo_rl.runners.train, robo_rl.config, robo_rl.registry; "
            "bad=[m for m in ('mani_skill','sapien','libero','rclpy','cyclonedds') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
