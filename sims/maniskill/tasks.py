"""Which ManiSkill3 tasks run offline, and the fast failure for those that need downloads."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

from robo_rl.errors import SimulatorUnavailable

# Tasks measured to build and step offline with the wheel's own assets (mani-skill 3.0.1).
OFFLINE_TASKS: tuple[str, ...] = (
    "PickCube-v1", "PushCube-v1", "PullCube-v1", "StackCube-v1", "LiftPegUpright-v1",
    "PegInsertionSide-v1", "PlugCharger-v1", "PokeCube-v1", "PlaceSphere-v1", "RollBall-v1",
    "PullCubeTool-v1", "PushT-v1", "StackPyramid-v1", "TwoRobotPickCube-v1", "TwoRobotStackCube-v1",
)


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
    except EOFError:
        raise SimulatorUnavailable(
            f"ManiSkill task {task!r} needs assets that are not on this machine; download them with "
            f"'python -m mani_skill.utils.download_asset {task}' (offline-ready tasks: {', '.join(OFFLINE_TASKS[:6])}, ...)"
        ) from None
    finally:
        sys.stdin = old
