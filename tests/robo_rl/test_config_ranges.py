"""Numeric config ranges and the strict YAML loader: every numeric field of every config dataclass declares
a range (stated in its docstring, met by its default, checked both when parsed and when built in code),
out-of-range values are one-line errors at parse time, and YAML with duplicate keys or alias bombs is
refused before anything is expanded."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import time
import tracemalloc
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import pytest

from robo_rl.config import (
    INT64_MAX,
    MAX_YAML_NODES,
    Range,
    apply_overrides,
    field_range,
    from_dict,
    load,
    parse_yaml,
    ranged,
)
from robo_rl.errors import ConfigError
from robo_rl.registry import ALGORITHMS, ENVS, POLICIES
from robo_rl.run_config import TrainConfig
from tests.conftest import REPO

BASE = {"env": {"name": "maniskill", "task": "PickCube-v1"}}


def _dataclasses_in(tp: Any) -> list[type]:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    return [c for arg in get_args(tp) for c in _dataclasses_in(arg)]


def config_classes() -> list[type]:
    """TrainConfig, every registered env/policy/algorithm Config, the configs nested in them, and the
    configs built from CLI flags or saved files (steering, the pi0 sampler)."""
    from robo_rl.algorithms.rl2 import SteeringConfig
    from vla.pi0.sampling import SamplerConfig

    roots: list[type] = [TrainConfig, SteeringConfig, SamplerConfig]
    for registry in (ENVS, POLICIES, ALGORITHMS):
        roots += [registry.get(name).Config for name in registry.names()]
    seen: list[type] = []
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [c for f in dataclasses.fields(cls) for c in _dataclasses_in(hints[f.name])]
    return sorted(seen, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _number_kind(tp: Any) -> type | None:
    """int or float if the annotation takes numbers (directly, in a union, or as list items), else None."""
    if tp is bool:
        return None
    if tp in (int, float):
        return tp
    origin = get_origin(tp)
    if origin is Literal:
        return None
    if origin in (Union, types.UnionType, tuple, list):
        kinds = {k for a in get_args(tp) if a is not Ellipsis and (k := _number_kind(a)) is not None}
        return float if float in kinds else (int if kinds else None)
    return None


def _is_list(tp: Any) -> bool:
    return get_origin(tp) in (tuple, list) or any(
        _is_list(a) for a in get_args(tp) if get_origin(tp) is not Literal
    )


def numeric_fields() -> list[tuple[type, dataclasses.Field, type]]:
    out = []
    for cls in config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = _number_kind(hints[f.name])
            if kind is not None:
                out.append((cls, f, kind))
    return out


def _field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it, over the class and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for stmt, nxt in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


NUMERIC = numeric_fields()
IDS = [f"{cls.__name__}.{f.name}" for cls, f, _ in NUMERIC]


def test_the_walk_finds_the_configs():
    names = {c.__name__ for c in config_classes()}
    assert {
        "RunConfig",
        "ClusterConfig",
        "PPOConfig",
        "RPDConfig",
        "OPDConfig",
        "BCConfig",
        "ManiSkillConfig",
        "LiberoConfig",
        "IsaacGymConfig",
        "VariationConfig",
        "MLPConfig",
        "CNNConfig",
        "OpenVLAConfig",
        "Pi0PolicyConfig",
        "SteeringConfig",
        "SamplerConfig",
    } <= names
    assert len(NUMERIC) > 80


@pytest.mark.parametrize("cls,f,kind", NUMERIC, ids=IDS)
def test_every_numeric_field_declares_a_documented_range_its_default_meets(cls, f, kind):
    rng = field_range(f)
    assert rng is not None, (
        f"{cls.__name__}.{f.name}: declare it with robo_rl.config.ranged(default, ge=..., ...)"
    )
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    doc, want = _field_docs(cls).get(f.name, ""), rng.doc(items=_is_list(typing.get_type_hints(cls)[f.name]))
    assert want in doc, f"{cls.__name__}.{f.name}: its docstring should state '{want}'; it is {doc!r}"
    items = default if isinstance(default, (list, tuple)) else [default]
    assert all(rng.problem(v) is None for v in items), (
        f"{cls.__name__}.{f.name}: default {default!r} is out of range"
    )


_REQUIRED = {
    "BCConfig": {"dataset": "demos.npz"},
    "RPDConfig": {"teacher": "runs/t"},
    "OPDConfig": {"teacher": "runs/t"},
    "IsaacGymConfig": {"task": "pkg.mod:Task"},
}


def _bad_value(rng: Range, kind: type) -> Any:
    if kind is float:
        return math.nan
    lower = rng.ge if rng.ge is not None else rng.gt
    upper = rng.le if rng.le is not None else rng.lt
    return int(lower) - 1 if lower is not None else (int(upper) + 1 if upper is not None else INT64_MAX + 1)


@pytest.mark.parametrize("cls,f,kind", NUMERIC, ids=IDS)
def test_configs_built_in_code_are_held_to_the_ranges(cls, f, kind):
    """dataclasses.replace and direct calls go through __post_init__, which checks the same ranges."""
    rng = field_range(f)
    bad = _bad_value(rng, kind)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    value = (bad,) if isinstance(default, tuple) else bad
    with pytest.raises(ValueError) as info:  # ConfigError (SteeringConfig: ValueError with the field name)
        cls(**_REQUIRED.get(cls.__name__, {}), **{f.name: value})
    assert f.name in str(info.value) and "\n" not in str(info.value)


def _parse(overrides: list[str], base: dict | None = None) -> TrainConfig:
    return from_dict(TrainConfig, apply_overrides(base or BASE, overrides))


@pytest.mark.parametrize(
    "override,message",
    [
        ("algo.max_grad_norm=-1", "config key 'algo.max_grad_norm' = -1.0: must be a finite number > 0"),
        ("algo.lr=.inf", "config key 'algo.lr' = inf: must be a finite number > 0"),
        ("algo.lr=nan", "config key 'algo.lr' = nan: must be a finite number > 0"),
        ("algo.lr=1e400", "config key 'algo.lr' = inf: must be a finite number > 0"),
        ("algo.lr=" + "9" * 400, "config key 'algo.lr' = 999"),
        ("algo.ent_coef=.nan", "config key 'algo.ent_coef' = nan: must be a finite number >= 0"),
        (
            "policy.init_log_std=.nan",
            "config key 'policy.init_log_std' = nan: must be a finite number in [-20, 20]",
        ),
        ("algo.vf_coef=-5", "config key 'algo.vf_coef' = -5.0: must be a finite number >= 0"),
        ("algo.target_kl=-1", "config key 'algo.target_kl' = -1.0: must be a finite number > 0 (or null)"),
        ("algo.huber_delta=0", "config key 'algo.huber_delta' = 0.0: must be a finite number > 0"),
        ("algo.gamma=0", "config key 'algo.gamma' = 0.0: must be a finite number in (0, 1]"),
        ("run.max_minutes=.nan", "config key 'run.max_minutes' = nan: must be a finite number > 0 (or null)"),
        (
            "run.stop_at_eval_success=5",
            "config key 'run.stop_at_eval_success' = 5.0: must be a success rate in [0, 1] (or null)",
        ),
        ("run.seed=-1", "config key 'run.seed' = -1: must be an integer in [0, 2**31 - 1]"),
        (
            "run.seed=1180591620717411303424",
            "config key 'run.seed' = 1180591620717411303424: must be an integer in [0, ",
        ),
        (
            "run.total_env_steps=1e30",
            "config key 'run.total_env_steps' = 1000000000000000019884624838656: must be an "
            "integer >= 1 that fits in 64 bits",
        ),
        ("run.torch_threads=0", "config key 'run.torch_threads' = 0: must be an integer in [1, 2**31 - 1]"),
        (
            "run.policy_cpus=[0,-2]",
            "config key 'run.policy_cpus[1]' = -2: must be an integer in [0, 2**31 - 1]",
        ),
        ("policy.hidden=[64,0]", "config key 'policy.hidden[1]' = 0: must be an integer >= 1"),
        (
            "env.step_timeout=1e9",
            "config key 'env.step_timeout' = 1000000000.0: must be a finite number in (0, 2000000] seconds",
        ),
        ("env.image_size=8", "config key 'env.image_size' = 8: must be an integer >= 16 pixels"),
        ("env.render_device=-1", "config key 'env.render_device' = -1: must be an integer >= 0"),
        (
            "env.variations.retexture=1.5",
            "config key 'env.variations.retexture' = 1.5: must be a probability in [0, 1]",
        ),
        (
            "env.variations.camera_offset=[0,.inf,0]",
            "config key 'env.variations.camera_offset[1]' = inf: must be a finite number",
        ),
        (
            "cluster.cpus_per_worker=-1",
            "config key 'cluster.cpus_per_worker' = -1.0: must be a finite number >= 0",
        ),
        (
            "cluster.learner_timeout_s=.inf",
            "config key 'cluster.learner_timeout_s' = inf: must be a finite number in (0, 2000000] seconds",
        ),
    ],
)
def test_out_of_range_values_are_refused_at_parse_time(override, message):
    with pytest.raises(ConfigError) as info:
        _parse([override])
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["algo.name=rpd", "algo.teacher=runs/t", "algo.lambda_=-1"],
            "config key 'algo.lambda_' = -1.0: must be",
        ),
        (
            ["algo.name=rpd", "algo.teacher=runs/t", "algo.max_grad_norm=-1"],
            "config key 'algo.max_grad_norm' = -1.0",
        ),
        (["algo.name=opd", "algo.teacher=runs/t", "algo.lr=.inf"], "config key 'algo.lr' = inf: must be"),
        (
            ["algo.name=bc", "algo.dataset=d.npz", "algo.val_fraction=1"],
            "config key 'algo.val_fraction' = 1.0: must be a fraction in [0, 1)",
        ),
        (
            ["algo.name=bc", "algo.dataset=d.npz", "algo.weight_decay=.nan"],
            "config key 'algo.weight_decay' = nan",
        ),
        (
            ["policy.name=pi0", "policy.min_std=0"],
            "config key 'policy.min_std' = 0.0: must be a finite number > 0",
        ),
        (["policy.name=openvla", "policy.lora_alpha=-16"], "config key 'policy.lora_alpha' = -16.0: must be"),
        (["policy.name=cnn", "policy.init_log_std=100"], "config key 'policy.init_log_std' = 100.0: must be"),
    ],
)
def test_out_of_range_values_of_other_sections_are_refused(overrides, message):
    with pytest.raises(ConfigError) as info:
        _parse(overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_other_simulators_check_their_ranges():
    with pytest.raises(ConfigError, match=r"'env.render_gpu' = -2: must be an integer >= -1"):
        _parse(["env.render_gpu=-2"], {"env": {"name": "libero"}})
    with pytest.raises(ConfigError, match=r"'env.dt' = 0.0: must be a finite number > 0 seconds"):
        _parse(["env.dt=0"], {"env": {"name": "isaacgym", "task": "pkg.mod:Task"}})
    cfg = _parse(["env.render_gpu=-1", "env.task_ids=[0,3]"], {"env": {"name": "libero"}})
    assert cfg.env.render_gpu == -1 and cfg.env.task_ids == (0, 3)


def test_sentinels_and_edges_stay_allowed():
    cfg = _parse(
        [
            "run.max_minutes=null",
            "algo.target_kl=null",
            "algo.clip_value=null",
            "run.seed=2147483647",
            "run.stop_at_eval_success=1",
            "algo.gamma=1",
            "algo.gae_lambda=0",
            "algo.ent_coef=0",
            "env.render_device=cpu",
            "env.scene_workers=null",
            "env.variations.camera_offset=[-0.1,0,0.2]",
        ]
    )
    assert cfg.run.seed == 2**31 - 1 and cfg.algo.target_kl is None and cfg.env.render_device == "cpu"


def test_range_text():
    assert Range(gt=0).doc() == "Range: > 0."
    assert Range(ge=0, le=1).doc() == "Range: in [0, 1]."
    assert Range(gt=0, le=2_000_000, unit="seconds").doc() == "Range: in (0, 2000000] seconds."
    assert Range(ge=0, le=2**32 - 1).doc() == "Range: in [0, 2**32 - 1]."
    assert (
        Range(ge=1, also=(-1,)).problem(-1) is None
        and Range(ge=1, also=(-1,)).problem(0) == "must be an integer >= 1, or -1"
    )
    assert (
        Range(ge=1).doc(items=True) == "Range: each >= 1."
        and Range().doc(items=True) == "Range: any finite numbers."
    )
    assert (
        Range().doc() == "Range: any finite number."
        and Range().problem(math.inf) == "must be a finite number"
    )
    assert Range(gt=0, also=(math.inf,)).problem(math.inf) is None  # a documented sentinel
    assert (
        Range(gt=0).problem(None) is None and Range(gt=0).problem("auto") is None
    )  # the type check's business
    with pytest.raises(TypeError):
        Range(ge=0, gt=0)


def test_ranged_field_in_a_new_config():
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        rate: float = ranged(1.0, gt=0)
        counts: tuple[int, ...] = ranged((1, 2), ge=1)

    assert from_dict(Cfg, {"rate": 2, "counts": [3]}) == Cfg(2.0, (3,))
    with pytest.raises(ConfigError, match=r"config key 'x.counts\[1\]' = 0: must be an integer >= 1"):
        from_dict(Cfg, {"counts": [3, 0]}, prefix="x")


def test_dry_run_refuses_before_building_anything():
    """`robo-rl train --dry-run` parses with the same checks: one line, no traceback, nothing built."""
    from tests.conftest import cli_in_process

    proc = cli_in_process("train", "--json", "configs/quickstart.yaml", "algo.lr=nan", "run.seed=-1", "--dry-run")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "config key 'algo.lr' = nan: must be a finite number > 0" in lines[0], (
        proc.stderr
    )


# ---- YAML ------------------------------------------------------------------------------------------------

BOMB = "".join(
    f"{x}: &{x} [{', '.join([f'*{p}'] * 9 if p else ['lol'] * 9)}]\n"
    for p, x in zip([None, *"abcdefgh"], "abcdefghi")
)


def test_duplicate_keys_are_refused_naming_key_and_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("env:\n  name: maniskill\nalgo:\n  lr: 3.0e-4\n  gamma: 0.9\n  lr: 1.0e-3\n")
    with pytest.raises(ConfigError) as info:
        load(TrainConfig, path)
    assert str(info.value) == f"config file '{path}' has the key 'algo.lr' twice (lines 4 and 6); keep one"
    path.write_text("env:\n  name: maniskill\nrun: {seed: 1}\nrun: {seed: 2}\n")
    with pytest.raises(ConfigError, match=r"has the key 'run' twice \(lines 3 and 4\)"):
        load(TrainConfig, path)
    with pytest.raises(
        ConfigError, match=r"override 'env.extra=\{a: 1, a: 2\}': has the key 'a' twice \(line 1\)"
    ):
        load(TrainConfig, None, ["env.name=maniskill", "env.extra={a: 1, a: 2}"])


def test_alias_bomb_is_refused_fast_with_little_memory(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 500
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            load(TrainConfig, path)
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"expands to more than {MAX_YAML_NODES} YAML nodes through its aliases" in str(info.value)
    assert elapsed < 2.0 and peak < 20 * 2**20, (elapsed, peak)
    with pytest.raises(ConfigError, match="expands to more than"):  # the same in an override value
        load(
            TrainConfig, None, ["env.name=maniskill", "env.extra={" + BOMB.strip().replace("\n", ", ") + "}"]
        )


def test_self_referencing_and_deep_documents_are_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("env: &e\n  name: maniskill\n  extra: *e\n")
    with pytest.raises(ConfigError, match="has an alias inside its own anchor"):
        load(TrainConfig, path)
    path.write_text("env: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(ConfigError, match="nests collections deeper than"):
        load(TrainConfig, path)
    path.write_text("env: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nests collections deeper than"):
        load(TrainConfig, path)


def test_small_aliases_and_merge_keys_still_work():
    data = parse_yaml("base: &b {x: 1, y: [1, 2]}\nuse:\n  <<: *b\n  x: 3\nagain: *b\n")
    assert data == {
        "base": {"x": 1, "y": [1, 2]},
        "use": {"x": 3, "y": [1, 2]},
        "again": {"x": 1, "y": [1, 2]},
    }


def test_shipped_configs_and_robot_configs_load():
    from real_robot.config import load_robot

    train = sorted((REPO / "configs").glob("*.yaml"))
    robots = sorted((REPO / "configs" / "robots").glob("*.yaml"))
    assert train and robots
    for path in train:
        load(TrainConfig, path)
    for path in robots:
        load_robot(str(path))
