"""Error types: every user-facing failure is one line naming what is wrong and what would be right."""

from __future__ import annotations


class RoboRLError(Exception):
    """Base class; the CLI prints ``str(err)`` as a single line and exits non-zero."""


class ConfigError(RoboRLError, ValueError):
    """A config key, value or type is wrong."""


class RegistryError(RoboRLError, KeyError):
    """An unknown registered name (env, policy, algorithm)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CheckpointError(RoboRLError):
    """A checkpoint is missing, corrupt or belongs to another model/config."""


class SimulatorUnavailable(RoboRLError):
    """A simulator backend cannot run on this machine (missing package, driver or assets)."""


class RunDirError(RoboRLError):
    """The run directory cannot be created or written."""
