"""What the env workers' fork server imports once for ManiSkill CPU workers (``sims.procs``): torch,
gymnasium and ManiSkill's task registry. Importing only: no env, no renderer, no thread is started."""

from __future__ import annotations

try:
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    import torch  # noqa: F401
except Exception:  # noqa: BLE001 - a worker imports it again and reports the error as its one line
    pass
