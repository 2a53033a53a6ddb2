"""Which ManiSkill3 tasks run offline, and the fast failure for those that need downloads."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

from robo_rl.errors import SimulatorUnavailable

# Tasks measured to build, step and seed deterministically offline (mani-skill 3.0.1, this wheel's assets).
OFFLINE_TASKS: tuple[str, ...] = (
    "PickCube-v1", "PushCube-v1", "PullCube-v1", "StackCube-v1", "LiftPegUpright-v1",
    "PegInsertionSide-v1", "PokeCube-v1", "PlaceSphere-v1", "RollBall-v1", "PullCubeTool-v1", "PushT-v1",
)


# Language instructions for VLA policies (ManiSkill tasks carry none of their own).
INSTRUCTIONS: dict[str, str] = {
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "PushCube-v1": "push the cube into the goal region",
    "PullCube-v1": "pull the cube into the goal region",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "LiftPegUpright-v1": "lift the peg upright",
    "PegInsertionSide-v1": "insert the peg into the hole",
    "PlaceSphere-v1": "place the sphere into the bin",
    "PokeCube-v1": "poke the cube with the peg",
    "RollBall-v1": "roll the ball to the goal region",
    "PushT-v1": "push the T-shaped block onto the target",
}


def instruction_for(task: str) -> str:
    """The task's instruction, or one made from its id ("PullCubeTool-v1" -> "pull cube tool")."""
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    import re

    return " ".join(w.lower() for w in re.findall(r"[A-Z][a-z]*|\d+", task.split("-")[0]))


def missing_assets(task: str) -> list[str]:
    """Asset ids the task declares that are not downloaded (ManiSkill's own check, without the prompt)."""
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils import assets
    from mani_skill.utils.registration import REGISTERED_ENVS

    missing: list[str] = []
    for asset_id in REGISTERED_ENVS[task].asset_download_ids or []:
        if asset_id in assets.DATA_GROUPS:
            ids = assets.expand_data_group_into_individual_data_source_ids(asset_id)
        else:
            ids = [asset_id]
        missing.extend(i for i in ids if not assets.is_data_source_downloaded(i))
    return missing


def check_assets(task: str) -> None:
    """Raise ``SimulatorUnavailable`` at once if ``task`` needs assets that are not on disk."""
    missing = missing_assets(task)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise SimulatorUnavailable(
            f"ManiSkill task {task!r} needs assets that are not on this machine ({shown}); download them with "
            f"'python -m mani_skill.utils.download_asset {task}' or pick an offline task such as PickCube-v1")


def registered_tasks() -> list[str]:
    """All env ids ManiSkill registers (imports mani_skill.envs)."""
    import mani_skill.envs  # noqa: F401  (registers the envs)
    from mani_skill.utils.registration import REGISTERED_ENVS

    return sorted(REGISTERED_ENVS)


@contextlib.contextmanager
def no_stdin_prompts(task: str) -> Iterator[None]:
    """Turn ManiSkill's interactive asset-download prompt into an immediate clear error."""
    old = sys.stdin
    sys.stdin = io.StringIO("")  # input() raises EOFError at once instead of waiting
    try:
        yield
    except (EOFError, SystemExit):
        raise SimulatorUnavailable(
            f"ManiSkill task {task!r} needs assets that are not on this machine; download them with "
            f"'python -m mani_skill.utils.download_asset {task}' (offline-ready tasks: {', '.join(OFFLINE_TASKS[:6])}, ...)"
        ) from None
    finally:
        sys.stdin = old
