"""Named generalization benchmarks, evaluated reproducibly and resumably (`robo-rl eval CKPT --benchmark NAME`).

A benchmark is a list of tasks plus what it varies, applied on top of the env the policy was trained
in: LIBERO suites (every task of the suite, the official init states, the suite's episode length; the
``-vision``, ``-semantic`` and ``-execution`` splits add camera/light, instruction or object-pose shifts),
and ManiSkill splits in the RL4VLA taxonomy built on the simulators' variation hooks (``id``: nothing;
``vision``: camera pose and lighting; ``semantic``: paraphrased instructions; ``execution``: object
initial poses). Episodes run in blocks with pinned seeds: episode j of task k uses seed / init state
``seed + 1000 k + j`` whichever env worker runs it (the envs continue their seed sequences with a
stride of the env count), so results do not depend on ``--num-envs`` or the block size; the results JSON is rewritten atomically after every block, so a killed
evaluation resumes where it stopped and gives the same numbers as an uninterrupted one.

Results JSON (schema 1): ``{"schema", "benchmark", "varies", "checkpoint", "seed", "episodes_per_task",
"block", "strengths", "task_set": [task names], "env": {the policy's env config, less worker/env-count keys},
"environment": {package versions, simulator backend}, "tasks": {task: {"blocks": {b: [episodes,
successes, return sum, per-env episode outcomes (0/1)]}, "episodes", "successes", "success_rate", "ci95": [low, high], "mean_return"}},
"aggregate": {"mean", "mean_low", "mean_high", "iqm_over_tasks", "tasks"}}`` (per-task CIs from the
bootstrap of the task's episodes; the mean over tasks with rliable's stratified bootstrap over episodes);
``"actions": "sampled"`` after the header's ``strengths`` when actions were sampled, not greedy, and
``"policy_settings"`` when ``policy.KEY=VALUE`` overrides changed how the policy acts (e.g. a pi0 sampler).
A file resumes only an evaluation with the same keys up to ``env`` (its identity); another is refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.eval.reference import (
    REFERENCE_POLICIES,
    UniformRandomPolicy,
    expert_block,
    reference_env,
    simulator_support,
)

SCHEMA = 1

_RUNTIME_KEYS = ("num_envs", "envs_per_worker", "scene_workers", "worker_cpus", "step_timeout")
"""Env config keys that change how episodes are run, not what they are (left out of a file's identity)."""

PLACEMENT_KEYS = ("gl", "render_gpu", "render_device", "backend", "envs_per_worker", "scene_workers", "worker_cpus",
                  "step_timeout")
"""Env config keys an evaluation may override: where and how the envs run (a GPU machine: ``gl=egl``). The
renderer keys stay in the file's identity (images differ between renderers), so compare files made alike."""


@dataclass(frozen=True)
class Benchmark:
    """One named benchmark."""

    sim: str
    """maniskill or libero."""
    varies: str
    """Exactly what the benchmark changes (shown in reports)."""
    suite: str | None = None
    """LIBERO suite (all its tasks)."""
    variations: dict[str, Any] = field(default_factory=dict)
    """ManiSkill: fields of ``env.variations`` to set."""
    needs_rgb: bool = False
    """Only meaningful for policies that see images."""


BENCHMARKS: dict[str, Benchmark] = {
    **{f"libero-{s}": Benchmark("libero", f"the {s} suite: all its tasks from the official init states", f"libero_{s}",
                                needs_rgb=True) for s in ("spatial", "object", "goal", "10", "90")},
    **{f"libero-{s}-vision": Benchmark("libero", f"the {s} suite from the official init states with the agentview "
                                       "camera moved +-3 cm and light intensity x U(0.5, 1.5) per episode", f"libero_{s}",
                                       variations={"camera_jitter": 0.03, "light_scale": (0.5, 1.5)}, needs_rgb=True)
       for s in ("spatial", "object", "goal", "10")},
    **{f"libero-{s}-semantic": Benchmark("libero", f"the {s} suite from the official init states with the instruction "
                                         "paraphrased (verb synonyms and politeness frames)", f"libero_{s}",
                                         variations={"paraphrase": True}) for s in ("spatial", "object", "goal", "10")},
    **{f"libero-{s}-execution": Benchmark("libero", f"the {s} suite from the official init states with every movable "
                                          "object moved +-2 cm in x and y", f"libero_{s}",
                                          variations={"object_pose_jitter": 0.02}) for s in ("spatial", "object", "goal", "10")},
    "maniskill-id": Benchmark("maniskill", "nothing: the training distribution"),
    "maniskill-vision": Benchmark("maniskill", "camera position +-3 cm, light intensity x U(0.5, 1.5), table and floor "
                                  "textures replaced by random plain colours in half of the episodes, and 2 distractor "
                                  "boxes on the table, per episode",
                                  variations={"camera_jitter": 0.03, "light_scale": (0.5, 1.5), "retexture": 0.5,
                                              "distractors": 2},
                                  needs_rgb=True),
    "maniskill-semantic": Benchmark("maniskill", "the instruction (verb synonyms and politeness frames) and, in half of "
                                    "the episodes, the object's colour (a random colour unseen in training)",
                                    variations={"paraphrase": True, "object_recolor": 0.5}),
    "maniskill-execution": Benchmark("maniskill", "initial object positions +-5 cm in x and y",
                                     variations={"object_pose_jitter": 0.05}),
    "maniskill-perturbation": Benchmark("maniskill", "a mid-episode push: at control step 20 every movable object "
                                        "is displaced +-5 cm in x and y (execution family)",
                                        variations={"perturb_step": 20, "perturb_distance": 0.05}),
}


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        close = difflib.get_close_matches(name, list(BENCHMARKS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(BENCHMARKS))}"
        raise ConfigError(f"unknown benchmark {name!r}{hint}")
    return BENCHMARKS[name]


def _environment(sim: str, env_cfg: Any) -> dict[str, str]:
    """Package versions plus the physics/render backend the episodes ran on."""
    from importlib.metadata import PackageNotFoundError, version

    support = simulator_support(sim, "benchmark support")
    out = dict(support.backend(env_cfg))
    for pkg in ("robo-rl", "torch", "numpy", *support.packages):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def task_env_configs(bench: Benchmark, train_env: Any, num_envs: int | None,
                     strengths: tuple[float, ...] = (1.0,)) -> dict[str, tuple[Any, int]]:
    """task name -> (env config, task index for seeding) for every task of the benchmark, built on the
    training env's settings. With several ``strengths`` a ManiSkill split is run at each multiple of
    its variations ("PickCube-v1 x0.5"); the levels share the task's seeds (paired comparison)."""
    from robo_rl.build import with_num_envs

    n = {"num_envs": num_envs} if num_envs else {}
    if bench.sim == "maniskill":
        if train_env.name != "maniskill":
            raise ConfigError(f"benchmark is a ManiSkill split but the policy was trained in {train_env.name!r}")
        if tuple(strengths) != (1.0,) and not bench.variations:
            raise ConfigError(f"this benchmark varies {bench.varies}: --strengths needs a split with variations "
                              "(maniskill-vision, maniskill-semantic or maniskill-execution)")
        varied = dataclasses.replace(train_env.variations, **bench.variations)
        out = {}
        for s in strengths:
            key = train_env.task if tuple(strengths) == (1.0,) else f"{train_env.task} x{s:g}"
            split = dataclasses.replace(train_env, variations=varied.scaled(s))
            out[key] = (with_num_envs(split, num_envs) if num_envs else split, 0)
        return out
    if train_env.name != "libero":
        raise ConfigError(f"benchmark is a LIBERO suite but the policy was trained in {train_env.name!r}; evaluate it "
                          "on a ManiSkill split (maniskill-id, maniskill-vision, ...)")
    if tuple(strengths) != (1.0,):
        raise ConfigError("--strengths applies to ManiSkill splits; LIBERO splits vary at one strength")
    size = simulator_support("libero", "benchmark support").suite_size(bench.suite)
    # the official init states always, whatever the policy trained on; a split's variations on top
    fixed = {"suite": bench.suite, "max_episode_steps": None, "init_states": "official",
             "variations": dataclasses.replace(train_env.variations, **bench.variations)}
    return {f"{bench.suite}/{i}": (dataclasses.replace(train_env, task_ids=(i,), **fixed, **n), i) for i in range(size)}


def _save_media(env_cfg: Any, make_policy: Any, seed: int, media: Path, task: str) -> None:
    """Thumbnails (last frame, named by outcome) of the first episode of every env and an mp4 of them side
    by side: the same seeds as the task's first episodes. Kept out of the results JSON."""
    import imageio.v2 as imageio

    from robo_rl.build import build_env
    from robo_rl.eval.plots import write_video
    from robo_rl.runners.evaluate import evaluate_policy

    slug = task.replace("/", "_").replace(" ", "_")
    if (media / f"{slug}.mp4").is_file():
        return
    media.mkdir(parents=True, exist_ok=True)
    env = build_env(env_cfg, render=True)
    try:
        res = evaluate_policy(env, make_policy(env), env.num_envs, seed=seed, deterministic=True, record_video=True)
    finally:
        env.close()
    width = res.frames[0].shape[1] // len(res.first_outcomes)
    for i, (t, ok) in enumerate(res.first_outcomes):
        imageio.imwrite(media / f"{slug}_env{i}_{'success' if ok else 'failure'}.png",
                        res.frames[t][:, i * width:(i + 1) * width])
    write_video(res.frames, media / f"{slug}.mp4")


def check_placement_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    """One-line error for benchmark overrides other than ``env.KEY=VALUE`` with KEY in ``PLACEMENT_KEYS``
    and ``policy.KEY=VALUE`` (how the policy acts, e.g. a pi0 sampler: the episodes stay the same)."""
    def allowed(override: str) -> bool:
        section, _, key = override.partition("=")[0].partition(".")
        return (section == "env" and key in PLACEMENT_KEYS) or (section == "policy" and bool(key) and "." not in key)

    bad = [o for o in overrides if not allowed(o)]
    if bad:
        raise ConfigError(f"--benchmark fixes the episodes; its overrides may only say where the envs run "
                          f"(env.{', env.'.join(PLACEMENT_KEYS)}) or how the policy acts (policy.KEY=VALUE, "
                          f"e.g. policy.sampler=ode); got {', '.join(bad)}")


def _split_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, Any]]:
    """(the ``env.KEY=VALUE`` placement overrides, the ``policy.KEY=VALUE`` settings as {KEY: parsed value},
    checked against the checkpoint's policy config when it is loaded); a one-line error for anything else."""
    from robo_rl.config import apply_overrides

    check_placement_overrides(overrides)
    settings = apply_overrides({"policy": {}}, [o for o in overrides if o.startswith("policy.")])["policy"]
    return [o for o in overrides if o.startswith("env.")], settings


def _placed(config: dict[str, Any], env_overrides: list[str]) -> Any:
    """The run's env config with checked ``env.KEY=VALUE`` placement overrides applied."""
    from robo_rl.config import apply_overrides, from_dict
    from robo_rl.run_config import TrainConfig

    return from_dict(TrainConfig, apply_overrides(config, env_overrides)).env


def _identity(env_cfg: Any) -> dict[str, Any]:
    """What of an env config decides the episodes (JSON-normalised): all keys but ``_RUNTIME_KEYS``."""
    from robo_rl.config import to_dict

    return json.loads(json.dumps({k: v for k, v in to_dict(env_cfg).items() if k not in _RUNTIME_KEYS}))


def _resumable(path: Path, header: dict[str, Any]) -> dict[str, Any]:
    """The finished tasks/blocks of ``path`` if it holds this evaluation (same ``header``), else a one-line error."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bytes that are not UTF-8
        why = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
        raise ConfigError(f"'{path}' exists but is not a readable results file ({why}); delete it or pick another "
                          "--out") from None
    if not isinstance(old, dict) or not isinstance(old.get("tasks"), dict):
        raise ConfigError(f"'{path}' exists but is not a robo-rl benchmark results file (no 'tasks' object); delete "
                          "it or pick another --out")
    diffs = []
    for k, new in header.items():
        if k in ("task_set", "env") and k not in old:  # a file from before they were recorded: its other keys
            continue                                    # decide, and its next write records them
        was = old.get(k)
        if was == new:
            continue
        if k == "env" and isinstance(was, dict):
            keys = sorted(x for x in set(was) | set(new) if was.get(x) != new.get(x))
            diffs += [f"env.{x} {was.get(x)!r} vs {new.get(x)!r}" for x in keys]
        else:
            diffs.append(f"{k} {was!r} vs {new!r}" if k != "varies" else "varies")
    if diffs:
        raise ConfigError(f"'{path}' holds another evaluation (in the file vs this call: {'; '.join(diffs)}); "
                          "choose another --out or delete it")
    return old["tasks"]


def _write(path: Path, results: dict[str, Any]) -> None:
    from robo_rl.files import atomic_write_text

    try:
        atomic_write_text(path, json.dumps(results, indent=1))
    except OSError as err:
        raise RoboRLError(f"cannot write benchmark results '{path}' ({err.strerror or err}); pass --out in a "
                          "writable directory") from None


def _open_results(path: Path, header: dict[str, Any]) -> dict[str, Any]:
    """The finished tasks' blocks of ``path`` when it holds this very evaluation (``header``), else {}
    (creating its directory)."""
    if path.is_dir():
        raise ConfigError(f"--out '{path}' is a directory; pass a results file path, e.g. '{path / 'results.json'}'")
    if path.is_file():
        return _resumable(path, header)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RoboRLError(f"cannot create the directory of --out '{path}' ({err.strerror or err}); pass --out in a "
                          "writable place") from None
    return {}


def _task_blocks(checkpoint: str, policy: Any, env_cfg: Any, todo: list[int], episodes: int, block: int,
                 seed: int, deterministic: bool = True) -> Any:
    """Yield (block index, [episodes, successes, return sum, per-env episode outcomes]) for each block in
    ``todo`` of one task (the expert's blocks: the first three); block b's episodes start from seed
    ``seed + block * b``."""
    from robo_rl.build import build_env
    from robo_rl.runners.evaluate import evaluate_policy

    if not todo:
        return
    if checkpoint == "expert":
        for b in todo:
            yield b, list(expert_block(env_cfg, min(block, episodes - b * block), seed + block * b))
        return
    env = build_env(env_cfg)
    try:
        for b in todo:
            s_b = seed + block * b
            pol = UniformRandomPolicy(env.action_spec, s_b) if checkpoint == "random" else policy
            res = evaluate_policy(env, pol, min(block, episodes - b * block), seed=s_b, deterministic=deterministic)
            yield b, [res.episodes, res.successes, res.mean_return * res.episodes,
                      [[int(x) for x in e] for e in res.episode_success]]
    finally:
        env.close()


def _aggregate(tasks: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    """Over tasks: the mean with a stratified bootstrap over each task's episodes (rows = episodes), and the
    IQM over the tasks' success rates (a point value; it needs several tasks to mean anything)."""
    from robo_rl.eval.stats import aggregate

    outcomes = np.stack([np.r_[np.ones(t["successes"]), np.zeros(t["episodes"] - t["successes"])] for t in tasks], axis=1)
    agg = aggregate({"policy": outcomes}, seed=seed)["policy"]
    iqm = aggregate({"policy": np.array([[t["success_rate"] for t in tasks]])}, reps=10, seed=seed)["policy"]["iqm"]
    return {"mean": agg["mean"], "mean_low": agg["mean_low"], "mean_high": agg["mean_high"],
            "iqm_over_tasks": iqm, "tasks": len(tasks)}


def evaluate_benchmark(checkpoint: str, name: str, episodes: int, out: str, num_envs: int | None = None,
                       seed: int = 10_000, block: int = 10, task: str | None = None,
                       strengths: tuple[float, ...] = (1.0,), media: bool = False,
                       stochastic: bool = False, env_overrides: list[str] | tuple[str, ...] = (),
                       device: str = "cpu") -> dict[str, Any]:
    """Evaluate ``checkpoint`` on benchmark ``name`` (``episodes`` per task), resuming ``out`` if it holds
    finished blocks of the same evaluation. ``checkpoint`` may name a reference policy instead
    (``random`` or ``expert``, see ``robo_rl.eval.reference``; ``task`` picks the ManiSkill task).
    ``strengths``: multiples of the split's variations to sweep; ``media``: thumbnails and videos of a few
    episodes per task in ``<out>.media/`` (policies run through the vector envs; not the expert).
    ``task`` for a LIBERO checkpoint: comma-separated SUITE/INDEX tasks (e.g. the ones it trained on);
    ``stochastic``: sampled actions instead of the greedy ones (part of the file's identity);
    ``env_overrides``: ``env.KEY=VALUE`` for ``PLACEMENT_KEYS`` and ``policy.KEY=VALUE`` inference settings
    (recorded in the file's identity as ``policy_settings``); ``device``: where the policy runs."""
    from robo_rl.build import load_run, policy_from_checkpoint
    from robo_rl.eval.stats import success_ci

    bench = get_benchmark(name)
    if episodes < 1 or block < 1:
        raise ConfigError("--episodes and the block size must be >= 1")
    reference = checkpoint in REFERENCE_POLICIES
    placement, settings = _split_overrides(env_overrides)
    policy: Any = None
    if reference:
        train_env = reference_env(bench.sim, task)
        label = checkpoint
    else:
        if task is not None and bench.sim != "libero":
            raise ConfigError("--task is for reference policies (random, expert) and LIBERO suites; a ManiSkill "
                              "checkpoint evaluates its own task")
        run = load_run(checkpoint)
        label = str(run.ckpt)
        train_env = run.config.env
        if placement:
            train_env = _placed(run.meta["config"], placement)
    if env_overrides and reference:
        raise ConfigError(f"env overrides apply to checkpoints; the {checkpoint} reference runs on this machine's CPU")
    if stochastic and checkpoint in ("random", "expert"):
        raise ConfigError(f"--stochastic applies to checkpoints; the {checkpoint} reference has one way to act")
    envs = task_env_configs(bench, train_env, num_envs, tuple(strengths))  # refuses another simulator's policy
    if task is not None and bench.sim == "libero":  # --task SUITE/INDEX[,SUITE/INDEX]: those tasks of the suite
        wanted = [t.strip() for t in task.split(",") if t.strip()]
        unknown = [t for t in wanted if t not in envs]
        if unknown or not wanted:
            raise ConfigError(f"--task {', '.join(repr(t) for t in unknown) or repr(task)} is not a task of benchmark "
                              f"{name!r}: use {bench.suite}/N with N in 0..{len(envs) - 1} (several: comma-separated), "
                              "or omit --task for all of them")
        envs = {t: envs[t] for t in wanted}
    if not reference:
        from robo_rl.rollout.device import on_device, place, resolve_device

        policy, obs_spec, _ = policy_from_checkpoint(run, settings, settings_key="policy")
        where = resolve_device(device, "--device")
        policy = on_device(place(policy, where), where)  # CPU tensors in and out, the forward passes on ``where``
        if bench.needs_rgb and "rgb" not in obs_spec:
            raise ConfigError(f"benchmark {name!r} varies {bench.varies}, but the policy observes only "
                              f"{', '.join(sorted(obs_spec))}: evaluate it on a split a state policy can feel")
    path = Path(out)
    header = json.loads(json.dumps({
        "schema": SCHEMA, "benchmark": name, "varies": bench.varies, "checkpoint": label, "seed": seed,
        "episodes_per_task": episodes, "block": block, "strengths": [float(x) for x in strengths],
        **({"actions": "sampled"} if stochastic else {}),
        **({"policy_settings": settings} if settings else {}),  # e.g. another sampler: other actions
        **({"policy_device": device} if device != "cpu" else {}),  # sampling and rounding differ by device
        "task_set": list(envs), "env": _identity(train_env)}))
    results: dict[str, Any] = {**header, "environment": _environment(bench.sim, next(iter(envs.values()))[0]),
                               "tasks": _open_results(path, header)}
    n_blocks = (episodes + block - 1) // block
    for task, (env_cfg, k) in envs.items():
        rec = results["tasks"].setdefault(task, {"blocks": {}})
        todo = [b for b in range(n_blocks) if str(b) not in rec["blocks"]]
        for b, outcome in _task_blocks(checkpoint, policy, env_cfg, todo, episodes, block, seed + 1000 * k,
                                       deterministic=not stochastic):
            rec["blocks"][str(b)] = outcome
            _write(path, results)  # every finished block is kept: an interrupted evaluation resumes here
        if media and checkpoint != "expert":
            s_0 = seed + 1000 * k
            make = (lambda e, s0=s_0: UniformRandomPolicy(e.action_spec, s0)) if checkpoint == "random" else (lambda e: policy)
            _save_media(env_cfg, make, s_0, path.with_suffix(".media"), task)
        eps = sum(v[0] for v in rec["blocks"].values())
        succ = sum(v[1] for v in rec["blocks"].values())
        rate, lo, hi = success_ci(np.r_[np.ones(succ), np.zeros(eps - succ)], seed=seed)
        rec.update(episodes=eps, successes=succ, success_rate=rate, ci95=[lo, hi],
                   mean_return=sum(v[2] for v in rec["blocks"].values()) / max(1, eps))
    results["aggregate"] = _aggregate(list(results["tasks"].values()), seed)
    _write(path, results)
    return results
