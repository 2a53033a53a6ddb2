"""LIBERO behind the VecEnv contract, one robosuite/MuJoCo env per spawn worker.

Observations: ``rgb`` (B, 2, H, W, 3) uint8 = [agentview, wrist], turned upright (LIBERO renders
upside down); ``state`` (B, 8) float32 = end-effector position (3, metres), end-effector orientation
as axis-angle (3, radians), gripper finger positions (2, metres); ``instruction`` list[str].
Actions (B, 7): end-effector delta position (3) and delta rotation (3) in [-1, 1] for LIBERO's
OSC_POSE controller, gripper (1): -1 open, +1 close (LIBERO's convention).
Success comes from LIBERO's own goal predicates (``check_success``); an episode terminates on
success and is truncated at the suite's standard length. Each reset loads the next official init
state of the task (``init_state_index``: the n envs that share a task take consecutive init states
without repeats; with one task, env i of B takes ``seed + i``, ``seed + i + B``, ...), then waits
``settle_steps`` no-op steps for objects to settle, as the standard evaluations do.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from robo_rl.config import check_ranges, ranged
from robo_rl.contracts import ArraySpec
from robo_rl.errors import ConfigError
from sims.libero.suites import MAX_STEPS, check_suite, check_task_ids, suite_tasks
from sims.variations import VariationConfig, paraphrase
from sims.vector import SubprocVecEnv, VecEnvWrapper, render_threads

log = logging.getLogger(__name__)

NOOP = np.array([0, 0, 0, 0, 0, 0, -1], np.float32)


SAMPLED_SEED_BASE = 1_000_003
"""Offset of the placement sampler's seed for ``init_states: sampled`` (layouts apart from any seed
another part of an experiment uses)."""


@dataclass(frozen=True)
class LiberoConfig:
    """Settings of the LIBERO adapter."""

    name: str = "libero"
    """Registry name of the simulator."""
    suite: str = "libero_spatial"
    """libero_spatial | libero_object | libero_goal | libero_10 | libero_90."""
    task_ids: tuple[int, ...] = ranged((0,), ge=0)
    """Tasks of the suite; env i runs task_ids[i % len(task_ids)] (empty list = all tasks); each below the
    suite's task count. Range: each >= 0."""
    num_envs: int = ranged(1, ge=1)
    """Parallel envs, one spawn worker each. Range: >= 1."""
    image_size: int = ranged(128, ge=16, unit="pixels")
    """Camera width/height (pixels). Range: >= 16 pixels."""
    max_episode_steps: int | None = ranged(None, ge=1)
    """Time limit; null = the suite's standard evaluation length. Range: >= 1."""
    settle_steps: int = ranged(10, ge=0)
    """No-op steps after each reset so objects settle (not counted in the episode). Range: >= 0."""
    init_states: Literal["official", "sampled"] = "official"
    """official: the suite's fixed evaluation init states (50 per task); sampled: a fresh layout per episode
    from the task's own placement regions, seeded by the episode's sequence seed (demonstrations and
    training away from the evaluation states)."""
    fast_render: bool = False
    """Cheaper rendering for training (no shadows/reflections/MSAA); off for evaluation parity."""
    blind_chunk_steps: bool = True
    """Inside an action chunk, render the cameras only for the observation the chunk ends on (the other
    steps run physics, reward and success unchanged; the observation equals rendering every step)."""
    gl: Literal["osmesa", "egl"] = "osmesa"
    """MuJoCo headless GL backend."""
    render_gpu: int | Literal["auto"] = ranged("auto", ge=-1)
    """EGL render device: an index, -1 for the default device, or auto (workers balanced over the visible
    GPUs). Range: >= -1."""
    step_timeout: float = ranged(120.0, gt=0, le=2_000_000, unit="seconds")
    """Seconds before a worker step is declared hung and the worker replaced (the wait is a poll in
    milliseconds, a C int). Range: in (0, 2000000] seconds."""
    envs_per_worker: int = ranged(1, ge=1)
    """Envs hosted (and stepped in turn) by one worker process (CPU backend). Range: >= 1."""
    worker_cpus: tuple[int, ...] | None = ranged(None, ge=0, le=2**31 - 1)
    """CPU ids the env worker processes are pinned to (null: no pinning). With ``run.policy_cpus`` on
    the other cores, env steps and policy compute run side by side (what ``run.pipeline`` overlaps).
    Range: each in [0, 2**31 - 1]."""
    variations: VariationConfig = VariationConfig()
    """Per-reset camera / lighting / object-pose / instruction variations (all off by default)."""

    def __post_init__(self) -> None:
        check_ranges(self, "env")
        check_suite(self.suite)
        if self.variations.perturb_distance > 0:
            raise ConfigError("config key 'env.variations.perturb_distance': mid-episode perturbations exist for "
                              "ManiSkill only; set it to 0 for LIBERO")


def init_state_index(seq: int, env_index: int, num_envs: int, num_tasks: int) -> int:
    """Official init state (before ``% N``) for the episode with sequence seed ``seq`` of env
    ``env_index`` in a VecEnv of ``num_envs`` envs cycling over ``num_tasks`` tasks (env i runs task
    i % T). With ``seq`` = base + i + k*B (the VecEnv's seeds), the ``n`` envs of one task (ranks
    r = i // T) take base % B + r + (base // B + k) * n: consecutive states, no two envs the same,
    whatever B and T (``base`` + r + k*B when the envs share one task). A pure function of ``seq``, so
    a replaced worker continues its env's states."""
    off = seq - env_index
    rank, group = env_index // num_tasks, len(range(env_index % num_tasks, num_envs, num_tasks))
    return off % num_envs + rank + (off // num_envs) * group


def sequence_for_init_state(init: int, env_index: int, num_envs: int, num_tasks: int) -> int:
    """The sequence seed that makes env ``env_index`` load official init state ``init`` (the inverse of
    ``init_state_index``): with it, envs of one task given the same ``init`` start from the same state."""
    rank, group = env_index // num_tasks, len(range(env_index % num_tasks, num_envs, num_tasks))
    q, r = divmod(init - rank, group)
    return env_index + q * num_envs + r


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> axis-angle (3,), radians."""
    x, y, z, w = (float(v) for v in q)
    w = max(-1.0, min(1.0, w))
    den = math.sqrt(max(0.0, 1.0 - w * w))
    if den < 1e-8:
        return np.zeros(3, np.float32)
    angle = 2.0 * math.acos(w)
    return np.array([x, y, z], np.float32) * (angle / den)


class LiberoSingleEnv:
    """One LIBERO task in one process (see module docstring for the contract)."""

    def __init__(self, cfg: LiberoConfig, task_index: int, env_index: int = 0, render_gpu: int = -1,
                 init_stride: int = 1, num_tasks: int = 1) -> None:
        """Env ``env_index`` of a VecEnv of ``init_stride`` (= B) envs cycling over ``num_tasks`` tasks."""
        from sims.libero.paths import check_assets, ensure_config

        ensure_config()
        check_assets()
        tasks = suite_tasks(cfg.suite)
        check_task_ids(cfg.suite, (task_index,), len(tasks))
        self.cfg, self.task = cfg, tasks[task_index]
        self._shifted = True  # whether this episode has the fixed offsets (variations.offset_prob)
        self.max_steps = cfg.max_episode_steps or MAX_STEPS[cfg.suite]
        from libero.libero.envs import OffScreenRenderEnv

        from robo_rl.safe_load import safe_torch_load

        # tensors and numpy arrays only: a pickle naming any other global is refused before it runs
        self.init_states = safe_torch_load(self.task.init_states_file)
        self.env = OffScreenRenderEnv(bddl_file_name=self.task.bddl_file, camera_heights=cfg.image_size,
                                      camera_widths=cfg.image_size, render_gpu_device_id=render_gpu,
                                      hard_reset=False,  # keep the MuJoCo model between episodes (~3 s -> 0.4 s)
                                      # robosuite's horizon counts the settle steps too; ours ends episodes first
                                      horizon=self.max_steps + cfg.settle_steps + 1)
        if cfg.fast_render:
            self._lighten_rendering()
        self._env_index, self._stride, self._num_tasks = env_index, max(init_stride, env_index + 1), max(1, num_tasks)
        self._seq = env_index  # the episode's sequence seed (VecEnv contract: seed + i + k * B)
        self.t = 0
        self.instruction = self.task.instruction
        model = self.env.sim.model
        self._cam_id = model.camera_name2id("agentview")
        self._base_cam_pos = model.cam_pos[self._cam_id].copy()
        self._base_light = model.light_diffuse.copy()
        self.obs_spec = {"rgb": ArraySpec((2, cfg.image_size, cfg.image_size, 3), "uint8"),
                         "state": ArraySpec((8,), "float32")}
        self.action_spec = ArraySpec((7,), "float32", -1.0, 1.0, "ee delta pos (3), delta axis-angle (3), gripper")

    def _lighten_rendering(self) -> None:
        model = self.env.sim.model
        model.light_castshadow[:] = 0
        model.mat_reflectance[:] = 0.0
        model.vis.quality.offsamples = 0
        model.vis.quality.shadowsize = 0

    @staticmethod
    def _convert_state(raw: dict[str, Any]) -> np.ndarray:
        return np.concatenate([raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]),
                               raw["robot0_gripper_qpos"]]).astype(np.float32)

    def _convert(self, raw: dict[str, Any]) -> dict[str, Any]:
        rgb = np.stack([raw["agentview_image"][::-1, ::-1], raw["robot0_eye_in_hand_image"][::-1, ::-1]])
        return {"rgb": np.ascontiguousarray(rgb, dtype=np.uint8), "state": self._convert_state(raw),
                "instruction": self.instruction}

    def _apply_variations(self, episode_seed: int) -> None:
        """Draw this episode's variations (after the init state is loaded)."""
        v = self.cfg.variations
        if not v.active:
            return
        rng = np.random.default_rng([episode_seed, 7919])
        shifted = self._shifted = v.offset_applies(episode_seed)
        sim = self.env.sim
        model = sim.model
        model.cam_pos[self._cam_id] = (self._base_cam_pos + rng.uniform(-v.camera_jitter, v.camera_jitter, 3)
                                       + np.asarray(v.camera_offset) * shifted)
        model.light_diffuse[:] = self._base_light * rng.uniform(*v.light_scale)
        if v.object_pose_jitter > 0 or any(v.object_pose_offset):
            for obj in self.env.env.objects_dict.values():
                joints = getattr(obj, "joints", None) or []
                if not joints:
                    continue
                qpos = sim.data.get_joint_qpos(joints[-1]).copy()
                if qpos.shape != (7,):  # only free-floating objects move
                    continue
                qpos[:2] += (rng.uniform(-v.object_pose_jitter, v.object_pose_jitter, 2)
                             + np.asarray(v.object_pose_offset) * shifted)
                sim.data.set_joint_qpos(joints[-1], qpos)
            sim.forward()
        self.instruction = paraphrase(self.task.instruction, rng) if v.paraphrase else self.task.instruction


    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Load the next official init state; ``seed`` is the episode's sequence seed (VecEnv env i of B
        gets seed + i, then seed + i + B, ... on its own resets), mapped by ``init_index``."""
        if seed is not None:
            self._seq = seed
            self.env.seed(seed % 2**32)  # group rollouts' sequences may be negative (sequence_for_init_state)
        init = init_state_index(self._seq, self._env_index, self._stride, self._num_tasks)
        if self.cfg.init_states == "sampled":  # the placement sampler draws from numpy's global generator
            self.env.seed(SAMPLED_SEED_BASE + init)  # one layout per index: a group's envs share it
            raw = self.env.reset()
        else:
            self.env.reset()
            raw = self.env.set_init_state(self.init_states[init % len(self.init_states)])
        if self.cfg.variations.active:
            self._apply_variations(self._seq)  # the episode's own seed: unique per env and episode
            self.env._update_observables(force=True)
            raw = self.env.env._get_observations()
        self._seq += self._stride
        for _ in range(self.cfg.settle_steps):
            raw, _, _, _ = self.env.step(NOOP.tolist())
        self.t = 0
        return self._convert(raw)

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        raw, reward, done, _ = self.env.step(np.asarray(action, np.float64).tolist())
        self.t += 1
        success = bool(done) or bool(self.env.check_success())
        truncated = not success and self.t >= self.max_steps
        info: dict[str, Any] = {"success": success}
        if (success or truncated) and self.cfg.variations.offset_prob < 1.0:
            info["offset_applied"] = self._shifted  # which part of a mixed split the ending episode was
        return self._convert(raw), float(reward), success, truncated, info

    def step_blind(self, action: np.ndarray) -> tuple[float, bool, bool, dict[str, Any]]:
        """``step`` without rendering the cameras (``sims.worker.BlindStepEnv``). robosuite renders a
        camera once per control step, at its first physics substep; here the camera sensors keep a copy
        of the MuJoCo data at that moment instead, and ``observe`` renders from it only if asked (an
        episode that ends on this step). With ``blind_chunk_steps`` off: a plain step."""
        if not self.cfg.blind_chunk_steps:
            return self.step(action)[1:]
        import copy

        data = self.env.sim.data._data
        cams = [o for o in self.env.env._observables.values() if o.modality == "image"]
        originals = [o._sensor for o in cams]
        snapshot: list[Any] = []

        def deferred(observable: Any, original: Any) -> Any:
            def sensor(obs_cache: dict[str, Any]) -> np.ndarray:
                if not snapshot:  # the data a render now would show (all cameras sample together)
                    snapshot.append(copy.copy(data))
                return observable._current_observed_value  # a placeholder of the right shape, never returned
            sensor.__modality__ = original.__modality__  # type: ignore[attr-defined]
            return sensor

        try:
            for o, original in zip(cams, originals):
                o._sensor = deferred(o, original)
            _, reward, success, truncated, info = self.step(action)
        finally:
            for o, original in zip(cams, originals):
                o._sensor = original
        self._pending = (snapshot[0] if snapshot else None, cams)
        return reward, success, truncated, info

    def state_now(self) -> np.ndarray:
        """(8,) the proprioceptive state as the last step observed it, without rendering (e.g. after
        ``step_blind``, for a privileged expert that needs no images)."""
        return self._convert_state(self.env.env._get_observations())

    def observe(self) -> dict[str, Any]:
        """The observation the last step would have returned, cameras rendered now (from the data copy a
        blind step kept)."""
        import mujoco

        snap, cams = getattr(self, "_pending", (None, []))
        inner = self.env.env
        if snap is not None:
            sim = self.env.sim
            data, model = sim.data._data, sim.model._model
            saved = mujoco.MjData(model)
            mujoco.mj_copyData(saved, model, data)
            timers = [(o._sampled, o._time_since_last_sample, o._current_delay) for o in cams]
            try:
                mujoco.mj_copyData(data, model, snap)
                for o in cams:
                    o.update(timestep=0.0, obs_cache=inner._obs_cache, force=True)
            finally:
                mujoco.mj_copyData(data, model, saved)
                for o, (sampled, since, delay) in zip(cams, timers):
                    o._sampled, o._time_since_last_sample, o._current_delay = sampled, since, delay
            self._pending = (None, [])
        return self._convert(inner._get_observations())

    def render(self) -> np.ndarray:
        return self.env.sim.render(height=256, width=256, camera_name="agentview")[::-1, ::-1].copy()

    def close(self) -> None:
        self.env.close()


@dataclass(frozen=True)
class _Factory:
    cfg: LiberoConfig
    task_index: int
    env_index: int
    render_gpu: int
    num_tasks: int = 1

    def __call__(self) -> LiberoSingleEnv:
        return LiberoSingleEnv(self.cfg, self.task_index, self.env_index, self.render_gpu, init_stride=self.cfg.num_envs,
                               num_tasks=self.num_tasks)


def render_devices(cfg: LiberoConfig) -> list[int]:
    """EGL render device per worker: fixed, or balanced over the visible GPUs (-1 = default/CPU)."""
    if cfg.render_gpu != "auto":
        return [int(cfg.render_gpu)] * cfg.num_envs
    if cfg.gl != "egl":
        return [-1] * cfg.num_envs
    from robo_rl.distributed.placement import devices_per_env, egl_device_id

    devices = devices_per_env(cfg.num_envs, cfg.envs_per_worker, "LIBERO render")
    return [-1 if d is None else egl_device_id(d) for d in devices]


class LiberoVecEnv(VecEnvWrapper):
    """VecEnv over LIBERO tasks in spawn workers (``render`` is accepted for the common signature;
    frames come from the agentview camera)."""

    Config = LiberoConfig

    def __init__(self, cfg: LiberoConfig, render: bool = False) -> None:
        from sims.libero.paths import check_assets, ensure_config

        ensure_config()
        check_assets()
        tasks = suite_tasks(cfg.suite)
        ids = cfg.task_ids or tuple(range(len(tasks)))
        check_task_ids(cfg.suite, ids, len(tasks))
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        self.instructions = [tasks[ids[i % len(ids)]].instruction for i in range(cfg.num_envs)]
        workers = -(-cfg.num_envs // cfg.envs_per_worker)
        worker_env = {"MUJOCO_GL": cfg.gl, "PYOPENGL_PLATFORM": cfg.gl,
                      "LP_NUM_THREADS": render_threads(workers, cfg.worker_cpus),
                      "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.render_devices = render_devices(cfg)
        factories = [_Factory(cfg, ids[i % len(ids)], i, self.render_devices[i], len(ids)) for i in range(cfg.num_envs)]
        self._impl = SubprocVecEnv(factories, step_timeout=cfg.step_timeout, worker_env=worker_env,
                                       envs_per_worker=cfg.envs_per_worker, worker_cpus=cfg.worker_cpus)
        self.obs_spec, self.action_spec = self._impl.obs_spec, self._impl.action_spec
        self._num_tasks = len(ids)

    def reset_each(self, seeds: list[int | None]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset env i to official init state ``seeds[i]`` (modulo the task's count; None: its next one).
        Envs that run the same task and get the same index start from the same state (group rollouts)."""
        b = self.num_envs
        seqs = [None if k is None else sequence_for_init_state(int(k), i, b, self._num_tasks)
                for i, k in enumerate(seeds)]
        return self._impl.reset_each(seqs)
