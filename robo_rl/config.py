"""YAML -> frozen dataclasses, strictly.

* Unknown keys, wrong types and bad values raise ``ConfigError`` with one line naming the dotted
  key, the value and what is allowed.
* ``name``-switched sections: a field typed ``Section`` whose YAML has ``name: X`` is parsed with
  the ``Config`` dataclass of registry entry X (so each config lives next to its code).
* Dotted overrides from the command line: ``algo.lr=3e-4 env.num_envs=4`` (values parsed as YAML).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from robo_rl.errors import ConfigError, RegistryError


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the (lightly converted) value."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"config key '{key}' = {value!r} is not allowed; choose one of {_type_name(tp)}")
    if origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(err)
        raise ConfigError(f"config key '{key}' = {value!r} has the wrong type; expected {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"config key '{key}' = {value!r} must be null")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' = {value!r} has the wrong type; expected {_type_name(tp)}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = value
        if isinstance(value, str):  # PyYAML reads 3e5 (no dot) as a string; take it if it is a whole number
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, float) and number.is_integer():
            return int(number)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type):
        if isinstance(value, tp):
            return value
    raise ConfigError(f"config key '{key}' = {value!r} has the wrong type; expected {_type_name(tp)}")


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data`` strictly; nested dataclasses recurse."""
    where = prefix or "<top level>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{where}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"unknown config key '{dotted}': {hint}allowed keys here: {', '.join(fields)}")
        tp = hints[key]
        section_cls = _section_class(tp, value, dotted)
        if section_cls is not None:
            if "name" not in value:
                value = {"name": tp.default_name, **value}
            kwargs[key] = from_dict(section_cls, value, dotted)
        else:
            kwargs[key] = _coerce(value, tp, dotted)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            dotted = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"missing config key '{dotted}' ({_type_name(hints[name])})")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        msg = str(err)
        if not msg.startswith("config key"):
            msg = f"config section '{where}': {msg}"
        raise ConfigError(msg) from None


class Section:
    """Annotation marker: a config section chosen by its ``name`` key through a registry."""

    registry: Any = None
    default_name: str | None = None


def section(registry: Any, default_name: str | None = None) -> type:
    """Make a ``Section`` annotation bound to ``registry`` (e.g. ``env: section(ENVS)``); a section
    without a ``name`` key uses ``default_name`` when given."""
    return type(f"Section[{registry.kind}]", (Section,), {"registry": registry, "default_name": default_name})


def _section_class(tp: Any, value: Any, key: str) -> type | None:
    if not (isinstance(tp, type) and issubclass(tp, Section)):
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"config section '{key}' must be a mapping, got {value!r}")
    name = value.get("name", tp.default_name)
    if name is None:
        raise ConfigError(f"config section '{key}' needs a 'name' key; known: {', '.join(tp.registry.names())}")
    try:
        target = tp.registry.get(name)
    except RegistryError as err:
        raise ConfigError(f"config key '{key}.name': {err}") from None
    return target.Config


def to_dict(cfg: Any) -> Any:
    """Dataclass -> plain dict (tuples become lists) for YAML/JSON."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings to a nested dict (values parsed as YAML scalars/lists)."""
    data = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value (e.g. algo.lr=3e-4)")
        key, _, raw = item.partition("=")
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key; use dotted keys like algo.lr=3e-4")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def read_yaml(path: str | Path, example: str = "configs/quickstart.yaml") -> dict[str, Any]:
    """Read a YAML mapping with one-line errors for missing/invalid files (``example``: a file of the kind
    expected, named in the error)."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a YAML file" if p.is_dir() else "does not exist"
        raise ConfigError(f"config file '{p}' {what}; pass a YAML file such as {example}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file '{p}' is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of sections, got {type(data).__name__}")
    return data


def load(cls: type, path: str | Path | None = None, overrides: list[str] | None = None,
         example: str = "configs/quickstart.yaml") -> Any:
    """Load ``cls`` from an optional YAML file plus dotted overrides (``example``: see :func:`read_yaml`)."""
    data = read_yaml(path, example) if path is not None else {}
    return from_dict(cls, apply_overrides(data, overrides or []))
