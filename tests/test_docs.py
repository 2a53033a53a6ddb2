"""The documentation site: `mkdocs build --strict` passes (no broken link or anchor, no page missing from
the nav, no config field without a docstring, API pages resolve), the generated reference covers every
command and config section, the hand-written pages speak to users, and the built site loads in headless
Chromium without console errors or broken images."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"
FORBIDDEN = re.compile(r"\b(stop \d+|sessions?|issues?|must-show|lent|our machines)\b", re.IGNORECASE)
"""Lab-notebook words that do not belong in user documentation."""


def _need_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material are not installed: pip install -e '.[dev]' (scripts/setup.sh does)")


def _need_chromium() -> None:
    from tests.browser import find_chromium

    if not find_chromium():
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium must be installed in CI (scripts/setup.sh installs Debian's chromium)")
        pytest.skip("no Chromium: install Debian's 'chromium' package (scripts/setup.sh does) to check the site")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with ``mkdocs build --strict`` into a temporary directory."""
    _need_mkdocs()
    out = tmp_path_factory.mktemp("site")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out),
                           "--config-file", str(REPO / "mkdocs.yml")], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    problems = [line for line in proc.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or [proc.stderr[-3000:]])
    logging.getLogger(__name__).info("docs built in %.1f s", time.monotonic() - t0)
    return out


def test_docs_build_strictly(site):
    for page in ("index.html", "install/index.html", "guides/training/index.html", "reference/cli/index.html",
                 "reference/config/index.html", "reference/contracts/index.html", "extending/simulator/index.html",
                 "results/index.html"):
        assert (site / page).is_file(), page


def test_generated_reference_covers_every_command_and_config_section(site):
    from robo_rl.cli import build_parser
    from robo_rl.registry import ALGORITHMS, ENVS, POLICIES

    cli = (site / "reference/cli/index.html").read_text()
    reference = _hooks()
    for name, sub, _ in reference._subparsers(build_parser()):
        assert f'id="robo-rl-{name}"' in cli, name
        for inner, _, _ in reference._subparsers(sub):
            assert f'id="robo-rl-{name}-{inner}"' in cli, f"{name} {inner}"
    config = (site / "reference/config/index.html").read_text()
    for key, registry in (("env", ENVS), ("policy", POLICIES), ("algo", ALGORITHMS)):
        for name in registry.names():
            assert f"{key}.name: {name}" in config, f"{key}.name: {name}"
    for key in ("env.task", "env.variations.camera_offset", "policy.hidden", "algo.lr", "algo.teacher",
                "run.total_env_steps", "cluster.num_workers", "safety.max_delta", "cameras[].topic"):
        assert f"<code>{key}</code>" in config, key


def _hooks():
    """docs/hooks/reference.py as a module."""
    spec = importlib.util.spec_from_file_location("robo_rl_docs_reference", DOCS / "hooks" / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_config_reference_reads_field_docstrings_and_flags_a_missing_one(caplog):
    reference = _hooks()

    @dataclass(frozen=True)
    class Base:
        lr: float = 1e-3
        """Learning rate."""

    @dataclass(frozen=True)
    class Child(Base):
        steps: int = 10
        """How many steps."""
        undocumented: bool = False

    assert reference.attribute_docstrings(Child) == {"lr": "Learning rate.", "steps": "How many steps."}
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.reference"):
        rows = reference.config_rows(Child, "algo")
    assert rows[0] == "| `algo.lr`<br>`float` | `0.001` | Learning rate. |"
    assert any("Child.undocumented has no docstring" in r.getMessage() for r in caplog.records)


def test_pages_use_user_words(site):
    """Neither the hand-written pages nor the built site (which includes the reference generated from the
    code's docstrings) use lab-notebook words."""
    hits = []
    for page in sorted(DOCS.rglob("*.md")):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if m := FORBIDDEN.search(line):
                hits.append(f"{page.relative_to(REPO)}:{n}: {m.group(0)!r}")
    for page in sorted(site.rglob("*.html")):
        text = re.sub(r"<[^>]+>", " ", page.read_text())
        hits += [f"{page.relative_to(site)}: {m.group(0)!r} in '...{text[max(0, m.start() - 60):m.end() + 20]}...'"
                 for m in FORBIDDEN.finditer(text)]
    assert not hits, "\n".join(hits)


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (as a reader would get it; search needs http, not file://)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_site_in_headless_chromium(served):
    _need_chromium()
    from tests.browser import Chromium

    shots = os.environ.get("ROBO_RL_SCREENSHOTS")
    pages = {"index": ("/", "Two commands"), "guide-evaluation": ("/guides/evaluation/", "Generalization benchmarks"),
             "reference-config": ("/reference/config/", "env.variations.camera_offset")}
    with Chromium() as browser:
        for name, (path, text) in pages.items():
            rep = browser.check_page(served + path, screenshot=Path(shots) / f"docs-{name}.png" if shots else None)
            assert rep.problems == [], f"{path}: {rep.problems}"
            assert text in rep.dom, f"{path} lacks {text!r}"
            assert "robo-rl" in rep.title


def test_the_browser_check_sees_console_errors_and_broken_media(tmp_path):
    _need_chromium()
    from tests.browser import Chromium

    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><head><title>bad</title></head><body><img src="missing.png">'
                    '<video src="data:video/mp4;base64,AAAA"></video>'
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    with Chromium() as browser:
        rep = browser.check_page(page.as_uri())
    text = "\n".join(rep.problems)
    assert "boom" in text and "undefinedFunction" in text, text
    assert any("missing.png" in p for p in rep.broken_images), rep.broken_images
    assert rep.broken_videos, rep.problems
