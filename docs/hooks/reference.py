"""MkDocs hook: generates the CLI and configuration reference pages from the code at build time.

* ``reference/cli.md``: the help of every ``robo-rl`` command and subcommand, rendered from
  ``robo_rl.cli.build_parser()`` (argparse) at a fixed width.
* ``reference/config.md``: every key of a training config (``env``, ``policy``, ``algo`` sections per
  registered implementation, ``run``, ``cluster``) and of a robot config, with its type, default and
  the attribute docstring that follows the field in the source. A field without a docstring is logged
  as a warning, so ``mkdocs build --strict`` fails on it.

Nothing is written into ``docs/``: the pages exist only in the build.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import logging
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HELP_WIDTH = 80
"""Column width the CLI help is rendered at (independent of the terminal the build runs in)."""

log = logging.getLogger("mkdocs.hooks.reference")


# --- CLI ------------------------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of each direct subcommand of ``parser``, in definition order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return out


def _help(parser: argparse.ArgumentParser) -> str:
    """``parser.format_help()`` at ``HELP_WIDTH`` columns."""
    cls = parser.formatter_class
    parser.formatter_class = lambda prog: cls(prog, width=HELP_WIDTH)
    try:
        return parser.format_help().rstrip()
    finally:
        parser.formatter_class = cls


def cli_reference() -> str:
    """Markdown of the help of ``robo-rl`` and every subcommand (depth first, as defined)."""
    from robo_rl.cli import build_parser

    root = build_parser()
    lines = ["# Command line", "",
             "Generated from the argument parser (`robo_rl.cli.build_parser()`) when the documentation is built, "
             "so it always matches the code. Every command prints the same text with `--help`.", "",
             "Bad input (an unknown config key, a wrong type, an unknown name, an unwritable path, a corrupt "
             "checkpoint) ends in one line on stderr naming what is wrong and what would be right, with exit "
             "code 2.", "", "| command | what it does |", "|---|---|"]
    todo = [(f"robo-rl {name}", sub, text) for name, sub, text in _subparsers(root)]
    for prog, _sub, text in todo:
        anchor = prog.replace(" ", "-")
        lines.append(f"| [`{prog}`](#{anchor}) | {_cell(text)} |")
    lines += ["", "## `robo-rl` {#robo-rl}", "", "```text", _help(root), "```", ""]

    def walk(prog: str, parser: argparse.ArgumentParser, depth: int) -> None:
        anchor = prog.replace(" ", "-")
        lines.extend([f"{'#' * depth} `{prog}` {{#{anchor}}}", "", "```text", _help(parser), "```", ""])
        for name, sub, _ in _subparsers(parser):
            walk(f"{prog} {name}", sub, min(depth + 1, 4))

    for prog, sub, _ in todo:
        walk(prog, sub, 2)
    lines += ["`robo-rl bench NAME --help` prints the options of each benchmark (`ppo`, `env`, `decode`, `sample`, "
              "`ros`, `rollout`, `scale`, `chunks`).", ""]
    return "\n".join(lines)


# --- configuration --------------------------------------------------------------------------------------


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal that follows its annotated assignment in the class body,
    for ``cls`` and its base classes (a subclass's own docstring wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _yaml(value: Any) -> str:
    """A default value as it would be written in a YAML config."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, float) and len(repr(value)) > 10:
        return f"{value:.6g}"
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes outside code spans escaped."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.replace("``", "`").split()))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def type_text(tp: Any) -> str:
    """A field's annotation as a config author reads it: ``Literal['a', 'b']`` as ``a | b``, ``None`` as
    ``null``, ``tuple[int, ...]`` as ``list[int]``."""
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    text = re.sub(r"Literal\[([^\]]*)\]",
                  lambda m: " | ".join(x.strip().strip("'\"") for x in m.group(1).split(",")), text)
    text = re.sub(r"tuple\[([^\[\],]+), \.\.\.\]", r"list[\1]", text)
    return re.sub(r"\bNone\b", "null", text)


def _nested(f: dataclasses.Field, cls: type) -> tuple[type | None, bool]:
    """(dataclass type, is a tuple of them) if field ``f`` of ``cls`` holds a config dataclass."""
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    if dataclasses.is_dataclass(default):
        return type(default), False
    if isinstance(default, tuple) and default and all(dataclasses.is_dataclass(d) for d in default):
        return type(default[0]), True
    if isinstance(f.type, str) and f.type.isidentifier():  # a required nested config, e.g. safety: SafetyConfig
        tp = getattr(sys.modules.get(cls.__module__), f.type, None)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return tp, False
    return None, False


def config_rows(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Table rows (key and type, default, description) of dataclass ``cls`` under the dotted ``prefix``,
    nested config dataclasses flattened into dotted keys."""
    docs = attribute_docstrings(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        doc = docs.get(f.name)
        if doc is None:
            log.warning(f"config field {cls.__module__}.{cls.__qualname__}.{f.name} has no docstring: add a string "
                        f"literal right after it (it is this key's entry in the configuration reference)")
            doc = ""
        nested, many = _nested(f, cls)
        if nested is not None:
            rows.append(f"| `{key}`<br>`{'list of ' if many else ''}mapping` | | {_cell(doc)} |")
            rows += config_rows(nested, key + ("[]" if many else ""))
            continue
        if f.default is not dataclasses.MISSING:
            default = f"`{_yaml(f.default)}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{_yaml(f.default_factory())}`"
        else:
            default = "required"
        rows.append(f"| `{key}`<br>`{type_text(f.type)}` | {default} | {_cell(doc)} |")
    return rows


TABLE_HEAD = ["| key and type | default | description |", "|---|---|---|"]


def _section_pages(kind: str, registry: Any, key: str) -> list[str]:
    """One subsection per registered implementation of a ``name``-switched config section."""
    lines = []
    builtin = list(getattr(registry, "_entries", {}))  # built-in order (default first), then plugins by name
    for name in sorted(registry.names(), key=lambda n: (builtin.index(n) if n in builtin else len(builtin), n)):
        target = registry.target(name)
        try:
            cfg_cls = registry.get(name).Config
        except Exception as err:  # a plugin that does not import here: say so instead of failing the build
            log.warning(f"{kind} '{name}' ({target}) could not be imported for the configuration reference: {err}")
            continue
        doc = inspect.getdoc(cfg_cls) or ""
        lines += [f"### `{key}.name: {name}`", "", f"`{target}` reads this section with "
                  f"`{cfg_cls.__module__}.{cfg_cls.__qualname__}`. {doc}".rstrip(), "", *TABLE_HEAD,
                  *config_rows(cfg_cls, key, skip=("name",)), ""]
    return lines


def config_reference() -> str:
    """Markdown of every training-config and robot-config key."""
    from real_robot.config import RobotConfig
    from robo_rl.registry import ALGORITHMS, ENVS, POLICIES
    from robo_rl.run_config import ClusterConfig, RunConfig, TrainConfig

    top = attribute_docstrings(TrainConfig)
    lines = ["# Configuration", "",
             "Generated from the config dataclasses and the docstring that follows each field, when the "
             "documentation is built. A training config is one YAML file with the sections below; any key can "
             "be overridden on the command line with a dotted `key=value` (the value is parsed as YAML):", "",
             "```bash", "robo-rl train configs/quickstart.yaml algo.lr=1e-4 env.num_envs=4 run.max_minutes=10",
             "```", "",
             "Loading is strict: an unknown key, a wrong type or a value outside a field's range is a one-line "
             "error naming the dotted key and what is allowed. The `env`, `policy` and `algo` sections pick "
             "their implementation with `name:`, and each implementation reads the section with its own "
             "dataclass (listed per name below). A run directory keeps the resolved `config.yaml`.", ""]
    for key, kind, registry in (("env", "env", ENVS), ("policy", "policy", POLICIES), ("algo", "algorithm", ALGORITHMS)):
        lines += [f"## `{key}`", "", _cell(top.get(key, "")), ""]
        lines += _section_pages(kind, registry, key)
    for key, cls in (("run", RunConfig), ("cluster", ClusterConfig)):
        lines += [f"## `{key}`", "", inspect.getdoc(cls) or "", "", *TABLE_HEAD, *config_rows(cls, key), ""]
    lines += ["## Robot config", "",
              "`robo-rl deploy RUN --robot ROBOT.yaml` and the ROS 2 tools read a robot config "
              "(`configs/robots/*.yaml`; `real_robot.config.RobotConfig`). " + (inspect.getdoc(RobotConfig) or ""),
              "", *TABLE_HEAD, *config_rows(RobotConfig, ""), ""]
    return "\n".join(lines)


# --- MkDocs events --------------------------------------------------------------------------------------

GENERATED = {"reference/cli.md": cli_reference, "reference/config.md": config_reference}


def on_config(config: Any) -> Any:
    """Make the project importable for the generators (the build may run from another directory)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the build."""
    from mkdocs.structure.files import File

    for uri, make in GENERATED.items():
        files.append(File.generated(config, uri, content=make()))
    return files
