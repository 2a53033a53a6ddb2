"""ManiSkill3 behind the VecEnv contract.

CPU (``backend: cpu`` or ``auto`` without CUDA): ``physx_cpu`` allows one env per process, so each
env lives in a spawn worker of ``sims.vector.SubprocVecEnv``.
GPU (``backend: gpu`` or ``auto`` with CUDA): ``env.scene_workers`` spawn workers (default 1), each one
``physx_cuda`` scene batching its share of the envs on the GPU placement gives it; two or more let
pipelined collection step one scene while the policy acts for the other. The same batched-scene
workers run on CPU with ``env.scene_workers = env.num_envs`` (``physx_cpu``: one env per scene).

Observations: ``state`` (B, D) float32 always; ``rgb`` (B, V, H, W, 3) uint8 in ``obs_mode: rgb``
(V = number of sensor cameras). ``info["success"]`` (B,) comes from the task's own evaluate().
Episodes end ``terminated`` on success (ManiSkill's convention) and ``truncated`` at the time limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError, SimulatorUnavailable
from sims.maniskill.tasks import check_assets, instruction_for, no_stdin_prompts
from sims.variations import VariationConfig
from sims.vector import SubprocVecEnv, VecEnvWrapper, render_threads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManiSkillConfig:
    """Settings of the ManiSkill3 adapter."""

    name: str = "maniskill"
    """Registry name of the simulator."""
    task: str = "PushCube-v1"
    """ManiSkill env id, e.g. PickCube-v1."""
    num_envs: int = ranged(2, ge=1)
    """Parallel envs (CPU: one spawn worker each). Range: >= 1."""
    obs_mode: Literal["state", "rgb"] = "state"
    """'state' (flat vector) or 'rgb' (camera images + proprio state)."""
    control_mode: str | None = "pd_joint_delta_pos"
    """Controller, e.g. pd_joint_delta_pos or pd_ee_delta_pose (null: the task's default)."""
    reward_mode: Literal["normalized_dense", "dense", "sparse", "none"] | None = "normalized_dense"
    """Reward shaping used for training (null: the task's default)."""
    max_episode_steps: int | None = ranged(None, ge=1)
    """Time limit; null keeps the task's default. Range: >= 1."""
    backend: Literal["auto", "cpu", "gpu"] = "auto"
    """Physics backend: auto picks gpu when CUDA is available."""
    image_size: int = ranged(128, ge=16, unit="pixels")
    """Sensor camera width/height in rgb mode (pixels). Range: >= 16 pixels."""
    render_size: int = ranged(256, ge=16, unit="pixels")
    """Width/height of video frames (pixels). Range: >= 16 pixels."""
    blind_chunk_steps: bool = True
    """rgb mode, single-env workers: render the cameras only on the step an action chunk ends on (the
    only observation the policy sees); the other steps of the chunk skip the render, which is nearly all
    of a CPU step's cost. Same physics, rewards and observations; false renders every step."""
    step_timeout: float = ranged(60.0, gt=0, le=2_000_000, unit="seconds")
    """Seconds before a worker step is declared hung and the worker replaced (the wait is a poll in
    milliseconds, a C int). Range: in (0, 2000000] seconds."""
    envs_per_worker: int = ranged(1, ge=1)
    """Envs hosted (and stepped in turn) by one worker process (CPU backend). Range: >= 1."""
    worker_cpus: tuple[int, ...] | None = ranged(None, ge=0, le=2**31 - 1)
    """CPU ids the env worker processes are pinned to (null: no pinning). With ``run.policy_cpus`` on
    the other cores, env steps and policy compute run side by side (what ``run.pipeline`` overlaps).
    Range: each in [0, 2**31 - 1]."""
    scene_workers: int | None = ranged(None, ge=1)
    """Worker processes each holding one batched ManiSkill scene (GPU backend: null means 1; CPU
    backend: must equal num_envs, as physx_cpu holds one env per scene; null there means the
    single-env workers above); at most ``num_envs``. Range: >= 1."""
    variations: VariationConfig = VariationConfig()
    """Per-reset camera / lighting / object-pose variations (CPU backend; off by default)."""
    render_device: int | Literal["auto", "cpu"] = ranged("auto", ge=0)
    """Render device of CPU-physics workers: a GPU index, cpu, or auto (balanced over visible GPUs).
    Range: >= 0."""
    extra: dict = field(default_factory=dict)
    """Extra keyword arguments passed to gym.make (e.g. sim_config)."""

    def __post_init__(self) -> None:
        check_ranges(self, "env")
        if self.scene_workers is not None and self.scene_workers > self.num_envs:
            raise ConfigError(f"config key 'env.scene_workers' = {self.scene_workers} must be in 1..env.num_envs "
                              f"({self.num_envs})")

    def with_num_envs(self, n: int) -> ManiSkillConfig:
        """This config for ``n`` envs (evaluation, a Ray actor's share): one scene per env stays so on
        the CPU backend; on the GPU no more scenes than envs."""
        if self.scene_workers is None or n == self.num_envs:
            return replace(self, num_envs=n)
        cpu = self.backend == "cpu" or (self.backend == "auto" and not cuda_available())
        scenes = n if cpu and self.scene_workers == self.num_envs else min(self.scene_workers, n)
        return replace(self, num_envs=n, scene_workers=scenes)


def _make_gym_env(cfg: ManiSkillConfig, sim_backend: str, num_envs: int, render: bool,
                  render_backend: str | None = None) -> Any:
    import gymnasium as gym

    try:
        import mani_skill.envs  # noqa: F401  (registers the envs)
    except ImportError as err:
        raise SimulatorUnavailable(
            f"ManiSkill3 is not installed ({err}); install it with: pip install 'robo-rl[maniskill]'") from None
    from mani_skill.utils.registration import REGISTERED_ENVS

    if cfg.task not in REGISTERED_ENVS:
        import difflib

        close = difflib.get_close_matches(cfg.task, list(REGISTERED_ENVS), n=3)
        raise ConfigError(f"config key 'env.task' = {cfg.task!r} is not a ManiSkill task"
                          + (f"; did you mean {', '.join(close)}?" if close else ""))
    kwargs: dict[str, Any] = dict(
        obs_mode=cfg.obs_mode,
        sim_backend=sim_backend, num_envs=num_envs,
        render_mode="rgb_array" if render else None,
        human_render_camera_configs=dict(width=cfg.render_size, height=cfg.render_size),
    )
    if render_backend is not None:
        kwargs["render_backend"] = render_backend
    if cfg.control_mode is not None:
        kwargs["control_mode"] = cfg.control_mode
    if cfg.reward_mode is not None:
        kwargs["reward_mode"] = cfg.reward_mode
    if cfg.obs_mode == "rgb":
        kwargs["sensor_configs"] = dict(width=cfg.image_size, height=cfg.image_size)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    kwargs.update(cfg.extra)
    check_assets(cfg.task)
    task_id = cfg.task
    if cfg.variations.distractors:
        from sims.maniskill.distractors import with_distractors

        task_id = with_distractors(cfg.task, cfg.variations.distractors)
    with no_stdin_prompts(cfg.task):
        try:
            env = gym.make(task_id, **kwargs)
        except (RuntimeError, FileNotFoundError, NotImplementedError, ImportError, AssertionError, KeyError) as err:
            text = str(err)
            if "registered agents" in text:  # robot_uids names no registered robot
                import difflib

                from mani_skill.agents.registration import REGISTERED_AGENTS

                close = difflib.get_close_matches(str(cfg.extra.get("robot_uids")), list(REGISTERED_AGENTS), n=3)
                raise ConfigError(f"config key 'env.extra.robot_uids' = {cfg.extra.get('robot_uids')!r} is not a ManiSkill "
                                  f"robot{'; did you mean ' + ', '.join(close) + '?' if close else ''}") from None
            if isinstance(err, AssertionError) and "supported modes" in text:
                raise ConfigError(f"config key 'env.control_mode' = {cfg.control_mode!r} is not a controller of "
                                  f"{cfg.task}'s robot: {text.split('supported modes:', 1)[-1].strip()}") from None
            if isinstance(err, (AssertionError, KeyError)):
                raise
            if isinstance(err, ImportError):
                raise SimulatorUnavailable(f"ManiSkill task {cfg.task!r} needs an extra package: {text.splitlines()[-1]}") from None
            if "physical device" in text or "Vulkan" in text:
                raise SimulatorUnavailable(vulkan_fix_hint(text)) from None
            if isinstance(err, FileNotFoundError) or "download_asset" in text or "not found" in text:
                raise SimulatorUnavailable(
                    f"ManiSkill task {cfg.task!r} needs assets that are not on this machine ({text.splitlines()[0][:160]}); "
                    f"download them with 'python -m mani_skill.utils.download_asset {cfg.task}'") from None
            if isinstance(err, NotImplementedError) and "reward mode" in text:
                raise ConfigError(f"config key 'env.reward_mode' = {cfg.reward_mode!r}: {text} for {cfg.task}; "
                                  "use env.reward_mode=null for the task's default") from None
            raise
    if not hasattr(env.action_space, "shape") or env.action_space.shape is None:
        env.close()
        raise SimulatorUnavailable(f"ManiSkill task {cfg.task!r} has a multi-agent (dict) action space, "
                                   "which the single-policy VecEnv contract does not support")
    if cfg.obs_mode == "rgb":
        from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

        env = FlattenRGBDObservationWrapper(env, rgb=True, depth=False, state=True)
    return env


def vulkan_fix_hint(detail: str) -> str:
    return (f"SAPIEN found no usable Vulkan device ({detail.splitlines()[0]}); install Mesa >= 24 lavapipe: "
            "on Debian 12 'apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1' "
            "(bash scripts/setup.sh does this)")


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _split_obs(raw: Any, obs_mode: str) -> dict[str, np.ndarray]:
    """ManiSkill batched obs -> contract keys with batch dim kept. rgb: (B,H,W,3V) -> (B,V,H,W,3)."""
    if obs_mode == "state":
        return {"state": _to_numpy(raw).astype(np.float32, copy=False)}
    rgb = _to_numpy(raw["rgb"])
    b, h, w, c = rgb.shape
    rgb = rgb.reshape(b, h, w, c // 3, 3).transpose(0, 3, 1, 2, 4)
    return {"rgb": np.ascontiguousarray(rgb, dtype=np.uint8),
            "state": _to_numpy(raw["state"]).astype(np.float32, copy=False)}


def _materials(actor: Any) -> list[tuple[Any, Any, list[float]]]:
    """(material, its texture, its base colour) of every visual part of an actor, to repaint and restore."""
    import sapien

    out = []
    for obj in actor._objs:
        body = obj.find_component_by_type(sapien.render.RenderBodyComponent)
        for shape in body.render_shapes if body is not None else []:
            parts = getattr(shape, "parts", None)
            out += [(m, m.base_color_texture, list(m.base_color)) for m in ([q.material for q in parts] if parts else [shape.material])]
    return out


def _paint(materials: list[tuple[Any, Any, list[float]]], colour: list[float] | None) -> None:
    """Plain ``colour`` on every material (texture removed), or None: the original look back."""
    for mat, texture, base in materials:
        mat.base_color_texture = None if colour is not None else texture
        mat.base_color = colour if colour is not None else base


def _action_bounds(space: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension (low, high), each (A,) float32, of a ManiSkill action space. Actions are clipped
    to them before the controller sees them: ManiSkill clips only normalized controllers, and an
    absolute ``pd_joint_pos`` target past a joint limit would drive against the limit, not stop at
    it (a robot's safety filter clips there, so sim and robot would disagree)."""
    a = space.shape[-1]
    return (np.asarray(space.low, np.float32).reshape(-1, a)[0].copy(),
            np.asarray(space.high, np.float32).reshape(-1, a)[0].copy())


class ManiSkillSingleEnv:
    """One CPU-physics ManiSkill env, unbatched, for a worker process."""

    def __init__(self, cfg: ManiSkillConfig, render: bool = False, render_backend: str | None = "cpu",
                 seed_stride: int = 0) -> None:
        self.cfg = cfg
        self.env = _make_gym_env(cfg, "physx_cpu", 1, render, render_backend)
        self._episode_seed: int | None = None
        self._episodes = 0
        self._shifted = True  # whether this episode has the fixed offsets (variations.offset_prob)
        self.seed_stride = seed_stride
        self.instruction = instruction_for(cfg.task)
        obs = self.reset(seed=0)
        self._seeded: int | None = None  # the caller's last explicit seed (the reset above does not count)
        space = self.env.action_space
        self.action_spec = ArraySpec(tuple(space.shape[-1:]), "float32", *_action_bounds(space),
                                     cfg.control_mode or "default")
        self._bounds = _action_bounds(space)
        self.obs_spec = {k: ArraySpec(v.shape, str(v.dtype)) for k, v in obs.items() if isinstance(v, np.ndarray)}

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Reset; with ``seed_stride`` B an unseeded reset after a seeded one continues the seed
        sequence (seed + B, seed + 2B, ...), so env i of B covers seeds seed + i + kB and a VecEnv's
        episodes are pinned to seeds whatever the worker that runs them."""
        if seed is None and self.seed_stride and getattr(self, "_seeded", None) is not None:
            seed = self._seeded + self.seed_stride
        if seed is not None:
            self._seeded = seed
        raw, _ = self.env.reset(seed=seed)
        self._t = 0
        if self.cfg.variations.active:
            if seed is not None:
                self._episode_seed, self._episodes = seed, 0
            key = (self._episode_seed or 0, self._episodes)
            self._shifted = self.cfg.variations.offset_applies(*key)
            self._apply_variations(np.random.default_rng([*key, 7919]), self._shifted)
            self._perturb_rng = np.random.default_rng([self._episode_seed or 0, self._episodes, 104_729])
            self._episodes += 1
            return self.observe()
        return self._obs(raw)

    def _obs(self, raw: Any) -> dict[str, Any]:
        return {**{k: v[0] for k, v in _split_obs(raw, self.cfg.obs_mode).items()}, "instruction": self.instruction}

    def observe(self) -> dict[str, Any]:
        """The observation of the current state (cameras rendered now), as ``step`` returns it."""
        raw = self.env.unwrapped.get_obs()
        if self.cfg.obs_mode == "rgb":
            raw = self.env.observation(raw)  # the flattening wrapper
        return self._obs(raw)

    def _apply_variations(self, rng: np.random.Generator, shifted: bool = True) -> None:
        """Move static sensor cameras, scale the lights and nudge dynamic objects, as configured; the fixed
        offsets only where ``shifted`` (this episode's draw of ``variations.offset_prob``)."""
        import sapien

        v, u = self.cfg.variations, self.env.unwrapped
        if not hasattr(self, "_base_cams"):
            self._base_cams = {uid: s.config.pose.sp for uid, s in u._sensors.items() if s.entity is None}
            self._base_lights = [(light, np.array(light.color)) for sub in u.scene.sub_scenes
                                 for light in sub.render_system.lights]
        for uid, base in self._base_cams.items():
            offset = rng.uniform(-v.camera_jitter, v.camera_jitter, 3) + np.asarray(v.camera_offset) * shifted
            u._sensors[uid].camera.set_local_pose(sapien.Pose(p=np.asarray(base.p) + offset, q=base.q))
        scale = rng.uniform(*v.light_scale)
        for light, color in self._base_lights:
            light.color = (color * scale).tolist()
        if v.retexture > 0:
            self._retexture(rng, v.retexture)
        if v.object_recolor > 0:
            self._recolor_objects(rng, v.object_recolor)
        if v.object_pose_jitter > 0 or any(v.object_pose_offset):
            self._nudge_objects(rng, v.object_pose_jitter, v.object_pose_offset if shifted else (0.0, 0.0))

    def _retexture(self, rng: np.random.Generator, p: float) -> None:
        """With probability p, the table and the floor get random plain colours instead of their textures
        (SAPIEN renders a changed base colour of a textured material only once its texture is removed)."""
        u = self.env.unwrapped
        if not hasattr(self, "_surfaces"):
            self._surfaces = [_materials(u.scene.actors[n]) for n in ("table-workspace", "ground") if n in u.scene.actors]
        swap = rng.random() < p
        for mats in self._surfaces:
            _paint(mats, [*rng.uniform(0.15, 0.9, 3), 1.0] if swap else None)

    def _recolor_objects(self, rng: np.random.Generator, p: float) -> None:
        """With probability p the task's dynamic objects (not distractors) get a random colour."""
        u = self.env.unwrapped
        if not hasattr(self, "_objects"):
            self._objects = [m for name, actor in u.scene.actors.items()
                             if actor.px_body_type == "dynamic" and not name.startswith("distractor_")
                             for m in _materials(actor)]
        swap = rng.random() < p
        _paint(self._objects, [*rng.uniform(0.1, 0.9, 3), 1.0] if swap else None)

    def _nudge_objects(self, rng: np.random.Generator, dist: float, shift: tuple[float, float] = (0.0, 0.0)) -> None:
        """Move every dynamic object by a uniform +-dist xy offset plus the fixed xy ``shift``."""
        import torch

        for actor in self.env.unwrapped.scene.actors.values():
            if actor.px_body_type != "dynamic":
                continue
            pose = actor.pose
            p = pose.p.clone()
            p[..., :2] += torch.as_tensor(rng.uniform(-dist, dist, 2) + np.asarray(shift), dtype=p.dtype)
            actor.set_pose(type(pose).create_from_pq(p, pose.q))

    def before_step(self) -> None:
        """Count control steps; at ``variations.perturb_step`` push the objects (mid-episode perturbation).
        ``step`` calls it; code that steps the gym env directly (the scripted experts) calls it too."""
        v = self.cfg.variations
        if v.perturb_distance > 0 and self._t == v.perturb_step:
            self._nudge_objects(self._perturb_rng, v.perturb_distance)
        self._t += 1

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        raw, rew, term, trunc, info = self._step(self.env, action)
        return (self._obs(raw), *self._outcome(rew, term, trunc, info))

    def step_blind(self, action: np.ndarray) -> tuple[float, bool, bool, dict[str, Any]]:
        """``step`` without rendering the cameras (``sims.worker.BlindStepEnv``): ManiSkill computes a
        state-dict observation instead, below the rgb flattening wrapper, and the caller ``observe``s
        when it needs the images. With ``blind_chunk_steps`` off or in state mode: a plain step."""
        if self.cfg.obs_mode != "rgb" or not self.cfg.blind_chunk_steps:
            return self.step(action)[1:]
        base = self.env.unwrapped
        mode, base._obs_mode = base._obs_mode, "state_dict"  # ManiSkill's get_obs dispatches on it each step
        try:
            _, rew, term, trunc, info = self._step(self.env.env, action)
        finally:
            base._obs_mode = mode
        return self._outcome(rew, term, trunc, info)

    def _step(self, env: Any, action: np.ndarray) -> tuple:
        import torch

        self.before_step()
        return env.step(torch.as_tensor(np.clip(action, *self._bounds)[None]))

    def _outcome(self, rew: Any, term: Any, trunc: Any, info: dict[str, Any]) -> tuple[float, bool, bool, dict[str, Any]]:
        """(reward, terminated, truncated, info) of one env from ManiSkill's batched step outputs."""
        success = bool(_to_numpy(info.get("success", False)).reshape(-1)[0])
        term, trunc = bool(_to_numpy(term).reshape(-1)[0]), bool(_to_numpy(trunc).reshape(-1)[0])
        out: dict[str, Any] = {"success": success}
        if (term or trunc) and self.cfg.variations.offset_prob < 1.0:
            out["offset_applied"] = self._shifted  # which part of a mixed split the ending episode was
        return float(_to_numpy(rew).reshape(-1)[0]), term, trunc, out

    def render(self) -> np.ndarray:
        return _to_numpy(self.env.render())[0].astype(np.uint8, copy=False)

    def close(self) -> None:
        self.env.close()


def physx_gpu_library() -> Path | None:
    """Where SAPIEN looks for ``libPhysXGpu_64.so`` (None if SAPIEN is not importable)."""
    try:
        import sapien
    except ImportError:
        return None
    return Path.home() / ".sapien" / "physx" / sapien.physx.version() / "libPhysXGpu_64.so"


def physx_gpu_url() -> str:
    import sapien

    return f"https://github.com/sapien-sim/physx-precompiled/releases/download/{sapien.physx.version()}/linux-so.zip"


@dataclass(frozen=True)
class _Factory:
    """Picklable factory for spawn workers."""

    cfg: ManiSkillConfig
    render: bool
    render_backend: str

    def __call__(self) -> ManiSkillSingleEnv:
        return ManiSkillSingleEnv(self.cfg, self.render, self.render_backend, seed_stride=self.cfg.num_envs)


def render_backends(cfg: ManiSkillConfig) -> list[str]:
    """ManiSkill render backend per env of the CPU backend: 'cpu' or 'gpu:<i>' (balanced over the
    visible GPUs per worker, so rendering never piles onto one GPU)."""
    if cfg.render_device != "auto":
        return ["cpu" if cfg.render_device == "cpu" else f"gpu:{cfg.render_device}"] * cfg.num_envs
    from robo_rl.distributed.placement import devices_per_env

    devices = devices_per_env(cfg.num_envs, cfg.envs_per_worker, "ManiSkill render")
    return ["cpu" if d is None else f"gpu:{d}" for d in devices]


def _start(gpu: bool) -> dict[str, Any]:
    """How the env workers start: CPU workers fork from a server that imported ManiSkill once (~4.4 s saved
    per worker, 2-core AMD EPYC); GPU scene workers spawn, so none can inherit a process that touched CUDA."""
    return {"start_method": "spawn"} if gpu else {"start_method": "forkserver", "preload": ("sims.maniskill.preload",)}


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


class ManiSkillVecEnv(VecEnvWrapper):
    """VecEnv over ManiSkill3 (see module docstring). ``render=True`` enables video frames."""

    Config = ManiSkillConfig

    def __init__(self, cfg: ManiSkillConfig, render: bool = False) -> None:
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        per_env_variations = cfg.variations.active and not cfg.variations.distractors_only
        if cfg.backend == "gpu" and per_env_variations:
            raise ConfigError("env.variations (camera, light, pose, texture, instruction) are applied per env by the CPU "
                              "backend only; set env.backend=cpu (or auto) for a variation split")
        # auto picks the CPU backend for a variation split: the GPU batch would silently run it in distribution
        use_gpu = cfg.backend == "gpu" or (cfg.backend == "auto" and cuda_available() and not per_env_variations)
        if cfg.backend == "gpu" and not cuda_available():
            raise SimulatorUnavailable("env.backend=gpu needs CUDA, which this machine lacks; use env.backend=cpu")
        self.backend = "gpu" if use_gpu else "cpu"
        self._impl: Any
        scenes = cfg.scene_workers
        if not use_gpu and cfg.backend == "auto" and scenes is not None and (scenes != cfg.num_envs or per_env_variations):
            log.info("env.backend=auto resolved to CPU physics: env.scene_workers=%d ignored, single-env workers", scenes)
            scenes = None  # a GPU config (or a variation split of its checkpoint) still runs on a CPU machine
        if use_gpu or scenes is not None:
            if not use_gpu and scenes != cfg.num_envs:
                raise ConfigError(f"config key 'env.scene_workers' = {cfg.scene_workers}: the CPU backend (physx_cpu) "
                                  f"holds one env per scene, so it must equal env.num_envs ({cfg.num_envs}) or be null")
            if per_env_variations:
                raise ConfigError("env.variations are applied per env by the single-env CPU workers only; "
                                  "set env.scene_workers=null and env.backend=cpu for a variation split")
            from sims.maniskill.batch import scene_factories

            factories = scene_factories(cfg, use_gpu, render)
            self.render_backends = [f.render_backend or "cpu" for f in factories for _ in range(f.num_envs)]
            self._impl = SubprocVecEnv(factories, step_timeout=cfg.step_timeout, worker_cpus=cfg.worker_cpus,
                                       **_start(use_gpu), worker_env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                                   "LP_NUM_THREADS": render_threads(len(factories), cfg.worker_cpus)})
        else:
            workers = -(-cfg.num_envs // cfg.envs_per_worker)
            worker_env = {"LP_NUM_THREADS": render_threads(workers, cfg.worker_cpus), "OMP_NUM_THREADS": "1",
                          "MKL_NUM_THREADS": "1"}
            self.render_backends = render_backends(cfg)
            self._impl = SubprocVecEnv([_Factory(cfg, render, rb) for rb in self.render_backends],
                                       step_timeout=cfg.step_timeout, worker_env=worker_env,
                                       envs_per_worker=cfg.envs_per_worker, worker_cpus=cfg.worker_cpus,
                                       **_start(False))
        self.obs_spec = self._impl.obs_spec
        self.action_spec = self._impl.action_spec
