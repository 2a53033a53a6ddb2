"""Ending a run early and keeping it: a stop request honoured at the next safe point.

A training loop checks ``StopRequest.is_set()`` between iterations (RL: after a whole collect + update;
offline: between gradient steps), so the checkpoint it then writes holds a consistent policy, optimizer
and counter state. ``stop_on_signals`` turns the first SIGINT (Ctrl-C) or SIGTERM into such a request
and a second one into ``KeyboardInterrupt`` (abort without saving). Signal handlers are process-wide, so
only the application (the CLI) installs them; library code only reads the request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any


class StopRequest:
    """A thread-safe flag: set once, read by the training loop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


@contextlib.contextmanager
def stop_on_signals(stop: StopRequest, what: str = "the current iteration") -> Iterator[StopRequest]:
    """Within the block, the first SIGINT/SIGTERM sets ``stop`` (and says so on stderr), a second one
    raises ``KeyboardInterrupt``. Main thread only; the previous handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set("interrupted")
        # os.write, not print: a handler that prints while the interrupted code is inside a write to the
        # same buffered stream raises "reentrant call"; one unbuffered write cannot
        msg = (f"robo-rl: {signal.Signals(signum).name}: stopping after {what} and saving a checkpoint "
               "(again to abort without saving)\n")
        with contextlib.suppress(OSError):
            os.write(2, msg.encode())  # the process's stderr

    for s in previous:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
