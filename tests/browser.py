"""Headless Chromium page checks over the DevTools protocol (``--remote-debugging-pipe``; no driver,
no downloaded browser: Debian's ``chromium`` package).

``check_page(url)`` loads a page and returns what a person would see go wrong: console errors
(``console.error``, uncaught exceptions, browser log errors such as a failed resource load), failed
network requests, and images that did not load. It can also save a full-page screenshot and return
the DOM after scripts ran.

    python -m tests.browser URL [URL ...] [--screenshot-dir DIR]   # prints the problems; exit 1 if any
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

_BROKEN_IMAGES = """Array.from(document.images)
  .filter(i => i.loading !== 'lazy' || i.complete)
  .filter(i => !i.complete || i.naturalWidth === 0)
  .map(i => i.currentSrc || i.src || '(no src)')"""

_BROKEN_VIDEOS = """Promise.all(Array.from(document.querySelectorAll('video')).map(v => new Promise(done => {
  const verdict = () => done(v.error ? `${(v.currentSrc || v.src).slice(0, 60)}: media error ${v.error.code}` : null);
  if (v.error || v.readyState >= 1) return verdict();
  v.addEventListener('loadedmetadata', verdict, {once: true});
  v.addEventListener('error', verdict, {once: true});
  setTimeout(() => done(`${(v.currentSrc || v.src).slice(0, 60)}: no metadata within 10 s`), 10000);
}))).then(r => r.filter(x => x))"""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary: ``$ROBO_RL_CHROMIUM`` or the first of ``CANDIDATES`` on PATH."""
    env = os.environ.get("ROBO_RL_CHROMIUM")
    if env:
        return env if Path(env).exists() else shutil.which(env)
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class PageReport:
    """What loading one page showed."""

    url: str
    console_errors: list[str] = field(default_factory=list)
    """console.error / console.assert messages, uncaught exceptions and browser log entries of level error."""
    failed_requests: list[str] = field(default_factory=list)
    """Requests that failed (network error, or HTTP status >= 400), as 'URL: reason'."""
    broken_images: list[str] = field(default_factory=list)
    """<img> elements that did not load (not complete, or zero natural width)."""
    broken_videos: list[str] = field(default_factory=list)
    """<video> elements whose source failed to load or decode its metadata."""
    title: str = ""
    dom: str = ""
    """document.documentElement.outerHTML after the load event."""
    load_seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        """Every error above, one line each (empty: the page is fine)."""
        return ([f"console: {m}" for m in self.console_errors] + [f"request failed: {m}" for m in self.failed_requests]
                + [f"image not loaded: {m}" for m in self.broken_images]
                + [f"video not playable: {m}" for m in self.broken_videos])


class Chromium:
    """One headless Chromium process driven over the DevTools pipe (fd 3 in, fd 4 out)."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 900, timeout: float = 30.0) -> None:
        binary = binary or find_chromium()
        if not binary:
            raise RuntimeError("no Chromium found: install Debian's 'chromium' package (scripts/setup.sh does) "
                               "or set ROBO_RL_CHROMIUM")
        self.timeout, self.width, self.height = timeout, width, height
        self._profile = tempfile.mkdtemp(prefix="robo-rl-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child reads commands on fd 3 and writes replies on fd 4 (moved there by bash)
        flags = ["--headless", "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
                 "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio",
                 "--hide-scrollbars", f"--window-size={width},{height}", "about:blank"]
        # above fd 9 first, so that moving them to 3 and 4 cannot clobber one another
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        shell = f'exec "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-'
        self.proc = subprocess.Popen([shutil.which("bash") or "/bin/bash", "-c", shell, "bash", binary, *flags], pass_fds=(r, w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r)
        os.close(w)
        self._buf = b""
        self._id = 0
        self._events: list[dict[str, Any]] = []

    # --- protocol ---

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send a command and wait for its result (events that arrive meanwhile are queued)."""
        mid = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._read(deadline)
            if msg is None:
                raise TimeoutError(f"chromium did not answer {method} within {self.timeout:.0f} s")
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            self._events.append(msg)

    def _events_until(self, done: Any, deadline: float) -> None:
        """Queue events until ``done(event)`` is true for one, or the deadline."""
        if any(done(e) for e in self._events):
            return
        while (msg := self._read(deadline)) is not None:
            self._events.append(msg)
            if done(msg):
                return

    # --- pages ---

    def check_page(self, url: str, screenshot: str | Path | None = None, settle: float = 0.5) -> PageReport:
        """Load ``url`` in a fresh tab and report its errors; optionally save a full-page PNG screenshot."""
        t0 = time.monotonic()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._events.clear()
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=sid)
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=sid)
        self.call("Page.navigate", {"url": url}, session=sid)
        deadline = time.monotonic() + self.timeout
        self._events_until(lambda e: e.get("method") == "Page.loadEventFired" and e.get("sessionId") == sid, deadline)
        # let late scripts, fonts and lazy requests finish: wait until no event came for `settle` seconds
        quiet_until = time.monotonic() + settle
        while time.monotonic() < min(quiet_until, deadline):
            msg = self._read(min(quiet_until, deadline))
            if msg is None:
                break
            self._events.append(msg)
            quiet_until = time.monotonic() + settle
        report = PageReport(url=url)
        requests: dict[str, str] = {}
        for e in self._events:
            if e.get("sessionId") != sid:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                report.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                      for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                report.console_errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                entry = p["entry"]
                report.console_errors.append(f"{entry.get('text')} ({entry.get('url', '')})".replace(" ()", ""))
            elif m == "Network.requestWillBeSent":
                requests[p["requestId"]] = p["request"]["url"]
            elif m == "Network.loadingFailed" and not p.get("canceled"):
                report.failed_requests.append(f"{requests.get(p['requestId'], '?')}: {p.get('errorText')}")
            elif m == "Network.responseReceived" and p.get("response", {}).get("status", 200) >= 400:
                r = p["response"]
                report.failed_requests.append(f"{r.get('url')}: HTTP {r.get('status')}")
        evaluate = {"returnByValue": True, "awaitPromise": True}
        report.broken_images = self.call("Runtime.evaluate", {"expression": _BROKEN_IMAGES, **evaluate},
                                         session=sid)["result"].get("value") or []
        report.broken_videos = self.call("Runtime.evaluate", {"expression": _BROKEN_VIDEOS, **evaluate},
                                         session=sid)["result"].get("value") or []
        report.title = self.call("Runtime.evaluate", {"expression": "document.title", **evaluate},
                                 session=sid)["result"].get("value", "")
        report.dom = self.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML", **evaluate},
                               session=sid)["result"].get("value", "")
        if screenshot:
            shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        self.call("Target.closeTarget", {"targetId": target})
        report.load_seconds = time.monotonic() - t0
        return report

    def close(self) -> None:
        """End the browser process and remove its profile."""
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.browser", description=__doc__.split("\n\n")[0])
    ap.add_argument("urls", nargs="+", help="pages to load (http://, file://)")
    ap.add_argument("--screenshot-dir", help="save a full-page PNG of each page here (page1.png, ...)")
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args(argv)
    bad = 0
    with Chromium(width=args.width) as browser:
        for i, url in enumerate(args.urls, 1):
            shot = Path(args.screenshot_dir) / f"page{i}.png" if args.screenshot_dir else None
            rep = browser.check_page(url, screenshot=shot)
            print(f"{url}: {rep.title!r}, {rep.load_seconds:.1f} s, {len(rep.problems)} problem(s)")
            for line in rep.problems:
                print(f"  {line}")
            bad += bool(rep.problems)
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
