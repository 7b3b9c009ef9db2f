"""One run per output folder: a lock file that a command holds for its whole life.

Two runs into one ``--out`` would interleave their metrics, validation records and
checkpoints (every step logged twice). The first takes ``<out>/run.lock`` with ``flock``
and writes into it who it is (pid, host, command, start time); a second is refused with
:class:`RunLockedError`, one line naming the first. The kernel drops a ``flock`` when its
process dies, however it dies, so a lock file left behind by a killed run is free: the next
run takes it over and says whose it was. The file is emptied, not deleted, on release
(deleting it would let a waiting opener lock a file no one else can see).

The lock file is opened without following links: anything but a plain file of its own is
refused (:class:`LockPathError`) before a byte is written (``docs/reliability.md``).

Under ``torchrun`` the lock is per run, not per rank: rank 0 alone takes it (the others
share rank 0's folder and would refuse each other); see :func:`algos.commands.train.run_pipeline`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_NAME = "run.lock"


class RunLockedError(RuntimeError):
    """Another live run holds the output folder: ``str(error)`` is one line naming it."""


class LockPathError(RunLockedError):
    """``<out>/run.lock`` is not a plain file of its own (module docstring). A
    :class:`RunLockedError`, so every command that reports a held lock in one line reports this."""


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, opened (created when absent) without following a link;
    :class:`LockPathError` for anything but a plain file with one name."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        kind = "a symbolic link" if path.is_symlink() else "a folder" if path.is_dir() else None
        why = f"it is {kind}" if kind else f"it cannot be opened ({err.strerror or type(err).__name__})"
        raise LockPathError(f"{path}: refusing the run lock: {why}; the lock must be a plain file "
                            "(remove it, or give another --out)") from None
    info = os.fstat(fd)
    why = ("it is not a plain file (a fifo, a socket or a device)" if not stat.S_ISREG(info.st_mode)
           else f"it is a hard link ({info.st_nlink} names for one file)" if info.st_nlink != 1 else None)
    if why:
        os.close(fd)
        raise LockPathError(f"{path}: refusing the run lock: {why}; the lock must be a plain file "
                            "(remove it, or give another --out)")
    os.set_blocking(fd, True)
    return fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _read(fd: int) -> dict[str, Any]:
    """The holder's record in the lock file (``{}`` when empty or not ours to read)."""
    raw = os.pread(fd, 65536, 0)
    try:
        record = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        return {"unreadable": True}
    return record if isinstance(record, dict) else {"unreadable": True}


def describe(record: dict[str, Any]) -> str:
    """``pid 123 on host h, started 2026-12-01T10:00:00, command 'python -m algos train'``:
    values quoted with ``repr`` (the file is data: no control character reaches a terminal).

    >>> describe({"pid": 7, "host": "h", "started": "2026-12-01T10:00:00", "command": "a\\x1bb"})
    "pid 7 on host 'h', started '2026-12-01T10:00:00', command 'a\\\\x1bb'"
    """
    if not record or record.get("unreadable"):
        return "an unknown run (its lock record is unreadable)"
    pid = record.get("pid")
    pid_text = str(pid) if isinstance(pid, int) else repr(pid)
    return (f"pid {pid_text} on host {str(record.get('host'))!r}, started {str(record.get('started'))!r}, "
            f"command {str(record.get('command'))!r}")


@contextmanager
def run_lock(out_dir: str | Path, *, log: Callable[[str], None] = print,
             command: str | None = None) -> Iterator[dict[str, Any]]:
    """Hold ``<out_dir>/run.lock`` for the ``with`` block; yields the record written into it.
    :class:`RunLockedError` when a live run holds it; a lock left by a run that is gone is
    taken over with one ``log`` line. ``command``: what the record names (default: argv)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where the folder should be, no permission
        raise LockPathError(f"{out}: cannot hold a run lock there: not a folder we can create "
                            f"({err.strerror or type(err).__name__})") from None
    path = out / LOCK_NAME
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunLockedError(f"{out} is in use by another run ({describe(holder)}; lock {path}); "
                             "wait for it to end or give another --out") from None
    try:
        previous = _read(fd)
        if previous:  # its run ended without releasing it: killed, or its machine went down
            host = previous.get("host")
            pid = previous.get("pid")
            if host == socket.gethostname() and isinstance(pid, int):
                why = "no longer running" if not _alive(pid) else "alive but not holding it (a reused pid)"
            else:
                why = "not holding it"
            log(f"{path}: taking over the stale lock of {describe(previous)}: {why}")
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "command": command if command is not None else shlex.join(sys.orig_argv),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)  # emptied first: no byte of a longer earlier record is left behind
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        os.fsync(fd)
        yield record
    finally:
        try:
            os.ftruncate(fd, 0)  # released: the next run finds no record (a killed run leaves one)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
