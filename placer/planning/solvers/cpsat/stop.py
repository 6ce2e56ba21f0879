"""Ctrl-C, SIGTERM and SIGHUP stop a CP-SAT solve at once.

A solve runs in OR-Tools' C++ code, which does not return to the interpreter until it is
done, so Python's signal handlers (Ctrl-C's ``KeyboardInterrupt``, the CLI's SIGTERM and
SIGHUP turned into it: :func:`placer.cli.common.handle_errors`) would wait for the solve's
own time limit.  :func:`solve` runs every solve registered here: a watcher thread wakes on
the signal itself (``signal.set_wakeup_fd``: the interpreter writes each caught signal's
number to a pipe the moment it arrives, whatever the main thread is doing) and calls
``StopSearch`` on the solves running, which return within milliseconds; the main thread
then raises the signal's exception as usual, and the run ends as on any Ctrl-C (exit 130,
nothing written).

Only the main thread of the process that installed the watcher is watched (signals are
delivered there); a worker process dies of SIGTERM by itself and ignores SIGINT
(:mod:`placer.parallel`).  Where the wakeup pipe is already taken (an event loop), solves
run as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["STOP_SIGNALS", "solve"]

#: Signals that stop a run (and so its solves): Ctrl-C, a polite kill, the terminal lost.
STOP_SIGNALS = frozenset(int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                         if hasattr(signal, name))

#: A solve that starts this soon after a stop signal is given no time at all (the signal
#: arrived while it was being set up, after the interpreter last looked).
_LATE_S = 0.5

#: ``prctl`` option that names the calling thread (Linux).
_PR_SET_NAME = 15

_lock = threading.Lock()
_running: set[Any] = set()
_watching_pid: int | None = None
_write_fd = -1
_last_stop = -float("inf")


def solve(solver: Any, model: Any) -> Any:
    """``solver.solve(model)``, stopped by :data:`STOP_SIGNALS` (see the module)."""
    _watch()
    with _lock:
        _running.add(solver)
        if time.monotonic() - _last_stop < _LATE_S:
            solver.parameters.max_time_in_seconds = 1e-3
    try:
        return solver.solve(model)
    finally:
        with _lock:
            _running.discard(solver)


def _watch() -> None:
    """Start the watcher of this process, once, from the main thread (a forked child
    leaves its parent's pipe, which it inherited, for one of its own)."""
    global _watching_pid, _write_fd
    if _watching_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    inherited = _write_fd if _watching_pid is not None else -1
    _watching_pid = os.getpid()  # tried once per process, installed or not
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read)
        os.close(write)
        return
    if previous not in (-1, inherited):  # taken (an event loop): leave it
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return
    _write_fd = write
    threading.Thread(target=_watcher, args=(read,), name="placer-cpsat-stop",
                     daemon=True).start()


def _name_thread(name: bytes) -> None:
    """Give the calling thread ``name`` where ``ps -L`` and /proc show it (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(_PR_SET_NAME, name[:15], 0, 0, 0)


def _watcher(read: int) -> None:
    """Stop the running solves whenever a stop signal arrives."""
    global _last_stop
    _name_thread(b"placer-cpsat-st")
    while True:
        try:
            caught = os.read(read, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not caught:
            return
        if not STOP_SIGNALS.intersection(caught):
            continue
        with _lock:
            _last_stop = time.monotonic()
            for solver in list(_running):
                with contextlib.suppress(Exception):
                    solver.stop_search()
