"""What evaluation and benchmarks need from LIBERO beyond its VecEnv: the scripted pick-and-place expert,
the reference env of a suite, suite sizes and the render backend a run used. Reached through
``robo_rl.registry.SIMULATORS`` ("libero")."""

from __future__ import annotations

import dataclasses
from typing import Any

from robo_rl.errors import ConfigError


def libero_task(task: str) -> tuple[str, int]:
    """``--task SUITE/INDEX`` of a LIBERO benchmark (``libero_object/3``) as (suite, task index)."""
    suite, _, idx = task.partition("/")
    if not suite or not idx.isdigit():
        raise ConfigError(f"--task {task!r} on a LIBERO benchmark must be SUITE/INDEX, e.g. libero_object/3 "
                          "(omit --task to evaluate every task of the suite)")
    return suite, int(idx)


class LiberoSupport:
    name = "libero"
    packages = ("libero", "mujoco")

    def expert_block(self, env_cfg: Any, episodes: int, seed: int) -> tuple[int, int, float]:
        """(episodes, successes, return sum) of the pick-and-place expert on the first task of ``env_cfg``."""
        from sims.libero.env import LiberoSingleEnv
        from sims.libero.experts import PickPlaceExpert

        # the expert reads privileged state only: its steps render no camera (blind steps, same physics)
        env = LiberoSingleEnv(dataclasses.replace(env_cfg, num_envs=1, blind_chunk_steps=True), env_cfg.task_ids[0])
        try:
            succ, ret = 0, 0.0
            for j in range(episodes):
                state = env.reset(seed=seed + j)["state"]
                expert = PickPlaceExpert(env)
                done, info = False, {"success": False}
                while not done:
                    r, term, trunc, info = env.step_blind(expert.act(state))
                    state = env.state_now()
                    ret += r
                    done = term or trunc
                succ += int(info["success"])
            return episodes, succ, ret
        finally:
            env.close()

    def reference_env(self, task: str | None) -> Any:
        """The benchmark's suite with its standard episode length; ``task`` = ``SUITE/INDEX`` picks one task."""
        from sims.libero.env import LiberoConfig

        if task is None:
            return LiberoConfig()
        suite, idx = libero_task(task)
        return LiberoConfig(suite=suite, task_ids=(idx,))

    def backend(self, env_cfg: Any) -> dict[str, str]:
        return {"physics": "mujoco", "render": f"{env_cfg.gl} (device {env_cfg.render_gpu})"}

    def suite_size(self, suite: str) -> int:
        from sims.libero.suites import suite_tasks

        return len(suite_tasks(suite))


SUPPORT = LiberoSupport()
