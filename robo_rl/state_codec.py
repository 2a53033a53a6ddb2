"""Trainer state (optimizer, RNG, counters: nested dicts, lists, tuples, tensors, numpy arrays) as JSON
plus named tensors, so a checkpoint's trainer state is safetensors + JSON and loading it runs no code."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

_TAGS = ("$tensor", "$ndarray", "$tuple", "$dict")
_NDARRAY_DTYPE = re.compile(r"[<>|=]?[biufc]\d{1,2}")


def encode_state(obj: Any, tensors: dict[str, torch.Tensor], where: str = "state") -> Any:
    """``obj`` (nested dicts, lists, tuples, tensors, numpy arrays, numbers, strings, None) as JSON, every
    tensor/array moved into ``tensors`` under a generated name. Tuples, dicts with keys other than
    strings (or strings starting with "$") and arrays are tagged objects; other types are a ``TypeError``."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj
        return {"$tensor": name}
    if isinstance(obj, np.ndarray):
        if not _NDARRAY_DTYPE.fullmatch(obj.dtype.str):
            raise TypeError(f"trainer state {where} is a numpy array of dtype {obj.dtype}; only numeric "
                            "arrays are stored")
        name = f"t{len(tensors)}"
        tensors[name] = torch.frombuffer(bytearray(np.ascontiguousarray(obj).tobytes()), dtype=torch.uint8)
        return {"$ndarray": name, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, (list, tuple)):
        items = [encode_state(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
        return {"$tuple": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: encode_state(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"$dict": [[encode_state(k, tensors, f"{where} key"),
                           encode_state(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"trainer state {where} is a {type(obj).__name__}, which a checkpoint cannot store "
                    "(tensors, numpy arrays, numbers, strings, None, lists, tuples and dicts)")


def decode_state(obj: Any, tensors: dict[str, torch.Tensor], where: str = "state") -> Any:
    """The inverse of :func:`encode_state`; ``ValueError`` naming ``where`` for anything it never writes."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode_state(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a {type(obj).__name__}")
    tags = [k for k in obj if k.startswith("$")]
    if not tags:
        return {k: decode_state(v, tensors, f"{where}.{k}") for k, v in obj.items()}
    if len(tags) != 1 or tags[0] not in _TAGS:
        raise ValueError(f"{where} has the unknown tag(s) {tags}; expected one of {list(_TAGS)}")
    return _decode_tagged(tags[0], obj, tensors, where)


def _decode_tagged(tag: str, obj: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> Any:
    value = obj[tag]
    if tag == "$tuple" and isinstance(value, list):
        return tuple(decode_state(v, tensors, f"{where}[{i}]") for i, v in enumerate(value))
    if tag == "$dict" and isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        out = {}
        for k, v in value:
            key = decode_state(k, tensors, f"{where} key")
            if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                raise ValueError(f"{where} has a {type(key).__name__} as a key")
            out[key] = decode_state(v, tensors, f"{where}[{key!r}]")
        return out
    if tag in ("$tensor", "$ndarray") and isinstance(value, str) and value in tensors:
        return tensors[value] if tag == "$tensor" else _decode_ndarray(obj, tensors[value], where)
    raise ValueError(f"{where} is a malformed {tag} entry (or names a tensor trainer.safetensors lacks)")


def is_size(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31


def _decode_ndarray(obj: dict[str, Any], raw: torch.Tensor, where: str) -> np.ndarray:
    dtype, shape = obj.get("dtype"), obj.get("shape")
    if not isinstance(dtype, str) or not _NDARRAY_DTYPE.fullmatch(dtype):
        raise ValueError(f"{where} has the array dtype {dtype!r}; expected a numeric one such as '<u4'")
    if not isinstance(shape, list) or not all(is_size(n) for n in shape):
        raise ValueError(f"{where} has the array shape {shape!r}; expected a list of sizes")
    dt = np.dtype(dtype)
    expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != expected:
        raise ValueError(f"{where} holds {raw.numel()} bytes, not a {dtype} array of shape {shape}")
    return np.frombuffer(raw.numpy().tobytes(), dtype=dt).reshape(shape).copy()
