"""YAML -> frozen dataclasses, strictly.

* Unknown keys, wrong types and bad values raise ``ConfigError`` with one line naming the dotted
  key, the value and what is allowed.
* ``name``-switched sections: a field typed ``Section`` whose YAML has ``name: X`` is parsed with
  the ``Config`` dataclass of registry entry X (so each config lives next to its code).
* Dotted overrides from the command line: ``algo.lr=3e-4 env.num_envs=4`` (values parsed as YAML).
* Numeric fields declare their allowed values with :func:`ranged` (``lr: float = ranged(3e-4, gt=0)``):
  finite, within the bounds; ``from_dict`` checks them under the dotted key, and each config's
  ``__post_init__`` calls :func:`check_ranges` so that configs built in code are held to the same ranges.
* YAML (files and override values) is read by a loader that refuses duplicate keys and documents whose
  aliases expand past ``MAX_YAML_NODES`` nodes, before anything is constructed or copied.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from robo_rl.errors import ConfigError, RegistryError

INT64_MAX = 2**63 - 1
"""Largest integer any config field takes (numpy and torch hold counts as int64)."""
MAX_YAML_NODES = 100_000
"""Most YAML nodes a config document may have once its aliases are expanded (a config has a few hundred)."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of YAML collections a config document may have."""
_RANGE = "robo_rl.range"


def _num(x: float) -> str:
    """A bound as written in messages and docstrings: 1, 0.5, 1e-08, 2**31 - 1."""
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
    if x >= 2**20 and (x + 1) & x == 0:
        return f"2**{(x + 1).bit_length() - 1} - 1"
    return str(x)


@dataclasses.dataclass(frozen=True)
class Range:
    """Allowed values of a numeric config field (of each item, for a list of numbers): a finite number
    within the given bounds, or one of the sentinel values ``also``. Integers are also held to
    [-2**63, 2**63 - 1]."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple[float, ...] = ()
    unit: str = ""
    what: str = ""

    def __post_init__(self) -> None:
        if (self.ge is not None and self.gt is not None) or (self.le is not None and self.lt is not None):
            raise TypeError("a Range takes one lower bound (ge or gt) and one upper bound (le or lt)")

    def bounds(self) -> str:
        """The bounds as text: ``> 0``, ``in [0, 1]``, ``in (0, 1]``, ``>= -1``, or '' when unbounded."""
        lo = hi = None
        if self.ge is not None or self.gt is not None:
            lo = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}"
        if self.le is not None or self.lt is not None:
            hi = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})"
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>=' if self.ge is not None else '>'} {lo[1:]}"
        if hi:
            return f"{'<=' if self.le is not None else '<'} {hi[:-1]}"
        return ""

    def _tail(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        also = "".join(f", or {_num(a)}" for a in self.also)
        return f"{unit}{also}"

    def doc(self, items: bool = False) -> str:
        """What a field docstring states: ``Range: > 0.``, ``Range: in [0, 1].``, ``Range: any finite
        number.``; for a list of numbers (``items``) ``Range: each >= 1.`` or ``Range: any finite
        numbers.``"""
        bounds = self.bounds()
        if items:
            return f"Range: {'each ' + bounds if bounds else 'any finite numbers'}{self._tail()}."
        return f"Range: {bounds or 'any finite number'}{self._tail()}."

    def problem(self, value: Any) -> str | None:
        """None if ``value`` is allowed (or is not a number: null, a string choice, which the type check
        handles), else what is allowed."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value in self.also:
            return None
        is_int = isinstance(value, int)
        ok = math.isfinite(value)
        ok = ok and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
        ok = ok and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt)
        wide = is_int and not -INT64_MAX - 1 <= value <= INT64_MAX
        if ok and not wide:
            return None
        bounds = self.bounds()
        what = self.what or ("an integer" if is_int else "a finite number")
        what += f" {bounds}" if bounds else ""
        if wide and ok:
            what += " that fits in 64 bits"
        return f"must be {what}{self._tail()}"


def ranged(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
           also: tuple[float, ...] = (), unit: str = "", what: str = "") -> Any:
    """A dataclass field of numbers (or a list of numbers) with a :class:`Range`:
    ``lr: float = ranged(3e-4, gt=0)``. ``also``: sentinel values allowed outside the bounds;
    ``unit``: named in error messages after the bounds; ``what``: the kind of number named in them (default
    "an integer" / "a finite number", e.g. "a probability")."""
    rng = Range(ge=ge, gt=gt, le=le, lt=lt, also=tuple(also), unit=unit, what=what)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_RANGE: rng})


def field_range(f: dataclasses.Field) -> Range | None:
    """The :class:`Range` a dataclass field was declared with (None: not a ranged field)."""
    return f.metadata.get(_RANGE)


def _check_range(value: Any, rng: Range, key: str, nullable: bool) -> None:
    items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    for i, item in items:
        problem = rng.problem(item)
        if problem is not None:
            where = key if i is None else f"{key}[{i}]"
            null = " (or null)" if nullable and i is None else ""
            raise ConfigError(f"config key '{where}' = {item!r}: {problem}{null}")


def _allows_none(tp: Any) -> bool:
    if get_origin(tp) in (Union, types.UnionType):
        return any(_allows_none(a) for a in get_args(tp))
    return tp is type(None)


@functools.cache
def _ranged_fields(cls: type) -> tuple[tuple[str, Range, bool], ...]:
    """(name, range, whether null is allowed) of each ranged field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, rng, _allows_none(hints[f.name])) for f in dataclasses.fields(cls)
                 if (rng := field_range(f)) is not None)


def check_ranges(cfg: Any, prefix: str) -> None:
    """Check every ranged field of the config dataclass ``cfg``; errors name ``prefix.field``. Each config's
    ``__post_init__`` calls this first, so a config built in code (``dataclasses.replace``, a direct call)
    is held to the ranges a parsed one is."""
    for name, rng, nullable in _ranged_fields(type(cfg)):
        _check_range(getattr(cfg, name), rng, f"{prefix}.{name}" if prefix else name, nullable)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
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
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"config key '{key}' = {value!r} has the wrong type; expected a mapping of names to values")
        item_tp = get_args(tp)[1] if get_args(tp) else Any
        return {k: _coerce(v, item_tp, f"{key}.{k}") for k, v in value.items()}
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
            try:
                return float(value)
            except OverflowError:  # an integer beyond the float range
                raise ConfigError(f"config key '{key}' = {value!r}: must be a finite number") from None
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
            rng = field_range(fields[key])
            if rng is not None:
                _check_range(kwargs[key], rng, dotted, _allows_none(tp))
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


class _Refused(yaml.YAMLError):
    """A YAML document refused by :class:`StrictLoader`; the text completes "config file 'x' ..."."""


def _key_text(node: yaml.Node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else f"<{node.id} key>"


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a key given twice (naming the dotted key and both
    lines), and a document that nests deeper than ``MAX_YAML_DEPTH`` or whose aliases expand to more than
    ``MAX_YAML_NODES`` nodes (or contain themselves). The node graph is checked after composing and
    before anything is constructed: aliases share nodes there, so the check takes time and memory in the
    size of the text, not of the expansion."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._paths: dict[int, str] = {}  # id of a mapping node -> its dotted path, for error messages

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            self._check_graph(node)
        return node

    def _check_graph(self, root: yaml.Node) -> None:
        sizes: dict[int, int] = {}  # expanded node count of each node measured so far
        open_nodes: set[int] = set()  # collections being measured (an alias to one of them is a cycle)
        shared: list[bool] = []  # non-empty once a node is reached a second time (through an alias)

        def size(node: yaml.Node, path: str, depth: int) -> int:
            nid = id(node)
            if nid in sizes:
                shared.append(True)
                return sizes[nid]
            line = node.start_mark.line + 1
            if nid in open_nodes:
                raise _Refused(f"has an alias inside its own anchor (line {line}); a config cannot contain "
                               f"itself")
            if depth > MAX_YAML_DEPTH:
                raise _Refused(f"nests collections deeper than {MAX_YAML_DEPTH} levels (line {line})")
            total = 1
            if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
                open_nodes.add(nid)
                if isinstance(node, yaml.MappingNode):
                    self._paths.setdefault(nid, path)
                    children = [(k, path) for k, _ in node.value]
                    children += [(v, f"{path}.{_key_text(k)}" if path else _key_text(k))
                                 for k, v in node.value]
                else:
                    children = [(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
                for child, child_path in children:
                    total += size(child, child_path, depth + 1)
                    if total > MAX_YAML_NODES and shared:
                        raise _Refused(f"expands to more than {MAX_YAML_NODES} YAML nodes through its "
                                       f"aliases (at line {line}); write the values out instead of nesting "
                                       f"aliases")
                    if total > MAX_YAML_NODES:
                        raise _Refused(f"has more than {MAX_YAML_NODES} YAML nodes (at line {line}); a "
                                       f"config needs far fewer")
                open_nodes.discard(nid)
            sizes[nid] = total
            return total

        size(root, "", 0)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' merges; explicit keys override it
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class names it
                    continue
                if first is not None:
                    path = self._paths.get(id(node), "")
                    where = f"line {line}" if first == line else f"lines {first} and {line}"
                    dotted = f"{path}.{key}" if path else str(key)
                    raise _Refused(f"has the key '{dotted}' twice ({where}); keep one")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """One YAML document through :class:`StrictLoader` (raises ``yaml.YAMLError``)."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader
    except RecursionError:
        raise _Refused(f"nests collections deeper than {MAX_YAML_DEPTH} levels") from None


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
            value = parse_yaml(raw) if raw != "" else ""
        except _Refused as err:
            raise ConfigError(f"override {item!r}: {err}") from None
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
        data = parse_yaml(p.read_text())
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file '{p}' is not UTF-8 text (byte {err.start}); pass a YAML file such as "
                          f"{example}") from None
    except _Refused as err:
        raise ConfigError(f"config file '{p}' {err}") from None
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
