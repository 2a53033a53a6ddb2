"""Torch pickles loaded only through an allowlist (the trainer.pt of older runs, LIBERO's init-state
files): a pickle naming any other global fails before that global is called."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl.errors import CheckpointError
from robo_rl.files import first_line


def _legacy_globals() -> list[Any]:
    """The non-torch types older robo-rl pickled into trainer.pt: numpy arrays (numpy's RNG state) and
    their dtypes, under the module names numpy 1 and 2 pickle them with."""
    try:
        from numpy._core.multiarray import _reconstruct  # type: ignore[attr-defined]
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct
    out: list[Any] = [np.ndarray, np.dtype]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out.append((_reconstruct, f"{module}._reconstruct"))
    dtypes = getattr(np, "dtypes", None)
    for kind in ("UInt8", "UInt32", "Int32", "Int64", "UInt64", "Float32", "Float64", "Bool"):
        cls = getattr(dtypes, f"{kind}DType", None)
        if cls is not None:
            out.append(cls)
    return out


def safe_torch_load(file: str | os.PathLike[str]) -> Any:
    """``torch.load(weights_only=True)`` of a file of tensors, numpy arrays and plain containers (an older
    trainer.pt, LIBERO's init-state files): only :func:`_legacy_globals` are allowed beyond torch's own, so
    a pickle naming any other global raises ``pickle.UnpicklingError`` before that global is called."""
    with torch.serialization.safe_globals(_legacy_globals()):
        return torch.load(file, map_location="cpu", weights_only=True)


def load_legacy_trainer(file: Path) -> Any:
    """:func:`safe_torch_load` of an older trainer.pt with one-line errors."""
    import pickle

    try:
        return safe_torch_load(file)
    except pickle.UnpicklingError as err:
        found = re.search(r"(?:GLOBAL|global) ([\w.]+)", str(err))
        what = f"an object of {found.group(1)!r}" if found else "an object"
        raise CheckpointError(f"'{file}' holds {what}, not one of the types robo-rl writes into trainer "
                              "state (tensors, numpy arrays, numbers, strings, lists, dicts); it was not "
                              "converted and nothing in it ran; delete this checkpoint or resume from another"
                              ) from None
    except Exception as err:  # a truncated or foreign file: torch raises many types
        raise CheckpointError(f"'{file}' is not a readable trainer.pt ({type(err).__name__}: {first_line(err)}); "
                              "it was not converted") from None
