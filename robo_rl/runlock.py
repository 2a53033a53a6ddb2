"""One writer per run directory: an advisory ``fcntl.flock`` on ``<run>/.lock``, which holds the writer's PID.

``robo-rl train`` (fresh or ``--resume``) and ``robo-rl checkpoint upgrade`` hold it for their whole run;
readers (eval, steer, teacher, init_from) never take it. The kernel drops the lock when its process dies,
so a crashed writer never blocks the next one; the PID it left in the file is reported when the next
writer takes over. Processes forked by the writer (env workers) close their copy of the descriptor, so
the lock ends with the writer itself.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType

from robo_rl.errors import RunDirError

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
_held: set[int] = set()


def _close_in_child() -> None:
    """After a fork: the child drops its copies of the lock descriptors (the parent's lock stays)."""
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _read_pid(fd: int) -> int | None:
    """The PID written in the lock file open as ``fd`` (None if empty or not a number)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Exclusive writer lock of ``run_dir`` (a context manager); ``acquire`` fails in one line naming
    the PID that holds it."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise RunDirError(f"cannot open the run lock '{self.path}' ({err.strerror}); the run directory "
                              "must be writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise RunDirError(self._held_message(pid)) from None
        self._take_over(fd)
        return self

    def _held_message(self, pid: int | None) -> str:
        run = self.path.parent
        if pid is None:
            return (f"run directory '{run}' is locked by another process (lock {self.path} names none); "
                    "stop the run writing it, then try again")
        if pid_alive(pid):
            return (f"run directory '{run}' is being written by process {pid} (lock {self.path}); wait for "
                    "it to finish or stop it, then try again")
        return (f"run directory '{run}' is locked by a process that process {pid} (now exited) started and "
                f"that still runs (lock {self.path}); stop that run's remaining processes, then try again")

    def _take_over(self, fd: int) -> None:
        stale = _read_pid(fd)
        if stale is not None and stale != os.getpid():
            log.warning("run lock %s still named process %d, which ended without releasing it (killed or "
                        "crashed); taking it over", self.path, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _held.add(fd)

    def release(self) -> None:
        """Empty the lock file (a clean exit leaves no PID behind) and drop the lock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _held.discard(fd)
        try:
            os.ftruncate(fd, 0)
        except OSError:  # the run directory was removed (a failed start): nothing to empty
            pass
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
