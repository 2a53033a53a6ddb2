"""Distractor objects for ManiSkill tabletop tasks (the vision split's "distractors").

ManiSkill builds actors when a scene loads, so distractors cannot be added to a running env; instead
``with_distractors(task, n)`` registers (once per process) a subclass of the task's env class whose
``_load_scene`` also builds ``n`` small coloured boxes and whose ``_initialize_episode`` scatters them
on the table, at least 6 cm from the task's object and goal, from the episode's seeded torch RNG. The
task's observations, rewards and success are the parent's (the boxes are not in the state vector).
"""

from __future__ import annotations

from typing import Any

COLOURS = ([0.1, 0.3, 0.9, 1.0], [0.9, 0.8, 0.1, 1.0], [0.6, 0.2, 0.7, 1.0], [0.1, 0.7, 0.7, 1.0])
HALF = 0.015  # box half size (metres)
SPREAD = 0.2  # boxes land in [-SPREAD, SPREAD]^2 around the table centre
CLEAR = 0.06  # minimum distance to the task's object and goal


def variant_id(task: str, n: int) -> str:
    return f"RoboRL-{task.removesuffix('-v1')}-Distract{n}-v1"


def with_distractors(task: str, n: int) -> str:
    """The registered id of ``task`` with ``n`` distractor boxes (registered here on first use)."""
    import sapien
    import torch
    from mani_skill.utils.building import actors
    from mani_skill.utils.registration import REGISTERED_ENVS, register_env
    from mani_skill.utils.structs.pose import Pose

    name = variant_id(task, n)
    if name in REGISTERED_ENVS:
        return name
    spec = REGISTERED_ENVS[task]
    base = spec.cls

    class Distracted(base):  # type: ignore[misc, valid-type]
        def _load_scene(self, options: dict) -> None:
            super()._load_scene(options)
            self._distractors = [
                actors.build_box(self.scene, half_sizes=[HALF] * 3, color=COLOURS[i % len(COLOURS)],
                                 name=f"distractor_{i}", initial_pose=sapien.Pose(p=[0.5 + 0.1 * i, 0.5, HALF]))
                for i in range(n)]

        def _initialize_episode(self, env_idx: Any, options: dict) -> None:
            super()._initialize_episode(env_idx, options)
            keep_clear = [a.pose.p[..., :2] for a in (getattr(self, k, None) for k in
                          ("cube", "obj", "goal_site", "goal_region")) if a is not None]
            with torch.device(self.device):
                b = len(env_idx)
                for box in self._distractors:
                    xy = torch.zeros(b, 2)
                    for _ in range(50):  # rejection sampling: away from the object and the goal
                        xy = (torch.rand(b, 2) * 2 - 1) * SPREAD
                        if all((xy - (c[env_idx] if c.shape[0] != b else c)).norm(dim=-1).min() >= CLEAR
                               for c in keep_clear):
                            break
                    keep_clear.append(xy)
                    xyz = torch.cat([xy, torch.full((b, 1), HALF)], dim=-1)
                    box.set_pose(Pose.create_from_pq(xyz))

    Distracted.__name__ = Distracted.__qualname__ = f"{base.__name__}Distract{n}"
    register_env(name, max_episode_steps=spec.max_episode_steps)(Distracted)
    return name
