"""Where independent pieces of work run: this process, local processes, or a Ray cluster.

Planning solves layers independently and ``placer compare`` runs scenarios independently;
both hand their pieces to :meth:`Backend.run`, which returns the results in the pieces'
order whatever order they finish in, so the answer does not depend on where they ran
(every piece is deterministic for its inputs and seed).

Faults.  A worker that dies while it runs a piece (killed, out of memory, its node lost)
does not lose the run: the piece runs again, at most :data:`RETRIES` times, with a
:class:`WorkerWarning` that names it, and the answer is the fault-free one.  When the
retries run out, :class:`WorkerLostError` names the piece that was lost and why; the
caller has written nothing yet.  An exception *raised* by a piece is not a fault of the
machine: it is raised again here, at once, and the other workers are stopped.  Local
workers die with the process that started them, whatever ends it (an exception, Ctrl-C,
SIGTERM or SIGHUP turned into an exception by the CLI, or SIGKILL: on Linux each worker
asks the kernel for SIGKILL when its parent dies).

One piece of work can run beside this process in a forked child (:class:`Background`):
the parts of a plan's summary that do not wait on each other share the cores.

Ray (``pip install 'placer[ray]'``) is the optional cluster backend: ``ray="local"``
starts a Ray instance on this machine, any other value is the address of a running
cluster (``"auto"``, ``"host:6379"``, ``"ray://head:10001"``), whose workers need placer
installed at the same version.  An address that does not answer within
:data:`CONNECT_TIMEOUT_S` is a clear error, not a wait.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for
from typing import Any

from placer.errors import Param, PlacerError, PlacerWarning, UsageError

#: ``Backend.ray`` value that starts a Ray instance on this machine.
RAY_LOCAL = "local"
#: Times a piece whose worker died runs again before the run fails (3 tries in all).
RETRIES = 2
#: Seconds to wait for a Ray cluster's address to answer before saying it does not.
CONNECT_TIMEOUT_S = 10.0
#: Seconds a stopped local worker gets to exit before it is killed.
STOP_GRACE_S = 2.0
#: ``prctl`` option: the signal a process gets when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


class WorkerLostError(PlacerError):
    """A piece of work was lost: its worker died more often than :data:`RETRIES` allows
    (exit code 1; nothing was written)."""


class WorkerWarning(PlacerWarning):
    """A worker died while it ran a piece; the piece runs again."""


@dataclass(frozen=True)
class Backend:
    """How to run independent pieces of work.

    Attributes
    ----------
    jobs: local processes at once (1: in this process); with Ray, the CPUs a local
        instance may use.
    ray: None for local processes, :data:`RAY_LOCAL` to start Ray here, or the address
        of a Ray cluster.
    retries: times a piece whose worker died runs again (:data:`RETRIES`).
    """

    jobs: int = 1
    ray: str | None = None
    retries: int = RETRIES

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise UsageError(f"jobs must be at least 1, got {self.jobs}", where=Param("jobs"),
                             hint="1 runs in this process; the nearest valid value is 1")
        if self.retries < 0:
            raise UsageError(f"retries must be zero or more, got {self.retries}",
                             where=Param("retries"), hint="the nearest valid value is 0")

    def run(self, fn: Callable[..., Any], items: Sequence[Any], *, shared: Any = None,
            on_done: Callable[[int, Any], None] | None = None,
            names: Sequence[str] | None = None) -> list[Any]:
        """``fn(item)`` (or ``fn(shared, item)`` when ``shared`` is given) for every item;
        results in item order.  ``on_done(index, result)`` is called as pieces finish;
        ``names[i]`` names piece ``i`` in messages (``"layer 3"``; default ``"piece 4
        of 9"``).

        ``fn`` must be a module-level function (it is sent to other processes).

        Raises
        ------
        WorkerLostError: a piece's worker died ``retries + 1`` times.
        UsageError: Ray is missing, or its cluster cannot be started or reached.
        Whatever ``fn`` raises, as it raised it.
        """
        report = on_done or (lambda i, result: None)
        pieces = _Pieces(items, names, shared is not None)
        if self.ray is not None:
            return _run_on_ray(self, fn, pieces, shared, report)
        if self.jobs == 1 or len(items) <= 1:
            results: list[Any] = [None] * len(items)
            for i, item in enumerate(items):
                results[i] = fn(item) if shared is None else fn(shared, item)
                report(i, results[i])
            return results
        return _LocalPool(self, fn, shared, pieces).run(report)

    def describe(self) -> str:
        """``2 local processes``, ``Ray (local instance)``, ``Ray at ADDRESS``."""
        if self.ray is None:
            return "this process" if self.jobs == 1 else f"{self.jobs} local processes"
        return "Ray (local instance)" if self.ray == RAY_LOCAL else f"Ray at {self.ray}"


class _Pieces:
    """The items of one run, their names, and how often each one's worker died."""

    def __init__(self, items: Sequence[Any], names: Sequence[str] | None, with_shared: bool):
        self.items = items
        self.with_shared = with_shared
        count = len(items)
        self.names = list(names) if names is not None else [
            f"piece {i + 1} of {count}" for i in range(count)]
        self.deaths = [0] * count

    def died(self, index: int, why: str, retries: int, where: str) -> None:
        """Count a death of piece ``index``'s worker: a warning while retries are left,
        else WorkerLostError."""
        self.deaths[index] += 1
        name = self.names[index]
        if self.deaths[index] > retries:
            tries = "once" if self.deaths[index] == 1 else f"{self.deaths[index]} times"
            raise WorkerLostError(
                f"{name} was lost: its worker died {tries} ({why}); nothing was written",
                where=where,
                hint="a worker killed by the system is usually out of memory: use fewer"
                " `jobs` (each worker holds one piece), or a machine with more memory",
            )
        warnings.warn(WorkerWarning(
            f"the worker running {name} died ({why}); {name} runs again (retry"
            f" {self.deaths[index]} of {retries})"), stacklevel=3)


# -- local processes ------------------------------------------------------------------------


def _die_with_parent(parent: int | None) -> None:
    """In a worker: ask the kernel (Linux) for SIGKILL when the parent dies, so a parent
    killed by any signal leaves no worker behind; exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc to ask: the parent's cleanup remains
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _worker_main(conn: Any, fn: Callable[..., Any], shared: Any, with_shared: bool,
                 parent: int | None) -> None:
    """A local worker: run the pieces the parent sends until it sends None or goes away."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops us
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # not the parent's "raise KeyboardInterrupt"
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, item = task
        message: tuple[int, bool, Any]
        try:
            message = (index, True, _call(fn, shared, item, with_shared))
        except BaseException as exc:  # sent to the parent, raised there
            message = (index, False, exc)
        try:
            conn.send(message)
        except Exception as exc:  # the result or the exception cannot be pickled
            conn.send((index, False, RuntimeError(
                f"the result of a piece cannot be sent back: {type(exc).__name__}: {exc}")))


class _Worker:
    """One local worker process, its pipe, and the piece it runs (None: idle)."""

    def __init__(self, ctx: Any, fn: Callable[..., Any], shared: Any, with_shared: bool):
        parent = os.getpid() if ctx.get_start_method() == "fork" else None
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, daemon=True,
                                   args=(child, fn, shared, with_shared, parent))
        self.process.start()
        child.close()
        self.piece: int | None = None

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`)."""
        if self.process.is_alive():
            self.process.terminate()
        self.reap()

    def reap(self) -> None:
        """Wait for a process told to end (SIGKILL past :data:`STOP_GRACE_S`)."""
        self.process.join(STOP_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def exit_reason(exitcode: int | None) -> str:
    """Why a process ended, in words: ``killed by SIGKILL (out of memory, or kill -9)``."""
    if exitcode is None:
        return "it stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (out of memory, or kill -9)" if exitcode == -signal.SIGKILL else ""
        return f"killed by {name}{why}"
    return f"exit code {exitcode}"


class _LocalPool:
    """Pieces on ``backend.jobs`` local processes; a worker that dies is replaced and its
    piece runs again (:meth:`_Pieces.died`); every worker is stopped when the run ends,
    however it ends."""

    def __init__(self, backend: Backend, fn: Callable[..., Any], shared: Any, pieces: _Pieces):
        self.backend, self.fn, self.shared, self.pieces = backend, fn, shared, pieces
        self.ctx = multiprocessing.get_context()
        self.todo: deque[int] = deque(range(len(pieces.items)))
        self.workers: list[_Worker] = []

    def run(self, report: Callable[[int, Any], None]) -> list[Any]:
        results: list[Any] = [None] * len(self.pieces.items)
        left = len(results)
        try:
            for _ in range(min(self.backend.jobs, left)):
                self._feed(self._start())
            while left:
                for worker, index, value in self._finished():
                    results[index] = value
                    left -= 1
                    report(index, value)
                    self._feed(worker)
        finally:  # all told at once, then reaped: no worker waits for another
            for worker in self.workers:
                if worker.process.is_alive():
                    worker.process.terminate()
            for worker in self.workers:
                worker.reap()
        return results

    def _start(self) -> _Worker:
        worker = _Worker(self.ctx, self.fn, self.shared, self.pieces.with_shared)
        self.workers.append(worker)
        return worker

    def _feed(self, worker: _Worker) -> None:
        """Give an idle worker the next piece (or nothing, when none is left)."""
        if not self.todo:
            return
        index = self.todo.popleft()
        worker.piece = index
        with suppress(BrokenPipeError, ConnectionResetError):  # it died: its sentinel
            worker.conn.send((index, self.pieces.items[index]))  # says so, the piece reruns

    def _finished(self) -> list[tuple[_Worker, int, Any]]:
        """Wait for results; returns ``(worker, index, result)`` of the pieces that
        finished, replaces the workers that died (their pieces go back in line) and
        raises what a piece raised."""
        busy = [w for w in self.workers if w.piece is not None]
        ready = set(wait_for([w.conn for w in busy] + [w.process.sentinel for w in busy]))
        done = []
        for worker in busy:
            if worker.conn in ready or worker.process.sentinel in ready:
                message = self._receive(worker)
                if message is None:
                    self._replace(worker)
                    continue
                index, ok, value = message
                worker.piece = None
                if not ok:
                    raise value
                done.append((worker, index, say_again(value)))
        return done

    def _receive(self, worker: _Worker) -> tuple[int, bool, Any] | None:
        """The worker's message, or None when it died before sending one."""
        try:
            if worker.conn.poll():
                return worker.conn.recv()  # type: ignore[no-any-return]
        except (EOFError, OSError):
            pass
        return None

    def _replace(self, dead: _Worker) -> None:
        """A worker died: count it against its piece, put the piece back first in line,
        and start a new worker in its place."""
        dead.process.join()
        index = dead.piece
        assert index is not None
        dead.piece = None
        self.workers.remove(dead)
        dead.stop()
        self.pieces.died(index, exit_reason(dead.process.exitcode), self.backend.retries,
                         where=self.backend.describe())
        self.todo.appendleft(index)
        self._feed(self._start())


# -- Ray ------------------------------------------------------------------------------------


def _call(fn: Callable[..., Any], shared: Any, item: Any, with_shared: bool) -> _Said:
    """``fn``'s result on ``item`` with the warnings it issued (in a worker)."""
    return _said(lambda: fn(shared, item) if with_shared else fn(item))


# -- warnings said in another process --------------------------------------------------
# A piece that runs in another process warns there; its warnings travel back with its
# result and are issued again here, so a command says the same warnings whatever ran it.


@dataclass(frozen=True)
class _Said:
    """A piece's result and the warnings it issued: ``(message, category, file, line)``."""

    value: Any
    said: tuple[tuple[Any, type[Warning], str, int], ...]


def _said(compute: Callable[[], Any]) -> _Said:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = compute()
    return _Said(value, tuple((_sendable(w.message), w.category, w.filename, w.lineno)
                              for w in caught))


def _sendable(message: Warning | str) -> Warning | str:
    """The warning itself when it survives pickling (its attributes with it), else its
    text (the parent issues it again under its category)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(message))
    except Exception:
        return str(message)
    return message


def say_again(result: Any) -> Any:
    """Issue again here the warnings a piece issued in another process; its result."""
    if not isinstance(result, _Said):
        return result
    for message, category, filename, lineno in result.said:
        warnings.warn_explicit(message, category, filename, lineno)
    return result.value


def import_ray() -> Any:
    """The ``ray`` module, or a UsageError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "`ray` needs Ray, which is not installed", where=Param("ray"),
            hint="pip install 'placer[ray]' (or pip install ray), or drop `ray` to use"
            " local processes",
        ) from None
    return ray


def ray_host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address (``"head:6379"``, ``"ray://head:10001"``); None
    for ``"auto"``, :data:`RAY_LOCAL` and addresses without a port."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """UsageError unless the Ray address accepts a connection within ``timeout_s``."""
    target = ray_host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        waited = f" within {timeout_s:g} s" if isinstance(exc, TimeoutError) else ""
        raise UsageError(
            f"cannot reach the Ray cluster at {address}: {why}{waited}", where=Param("ray"),
            hint="check that the cluster is up (ray status on its head node) and the address"
            " and port; or use `ray` local for a Ray instance on this machine",
        ) from None


def connect_ray(ray: Any, backend: Backend) -> None:
    """Start or join the Ray instance ``backend`` names, once per process; a clear
    UsageError (no wait past :data:`CONNECT_TIMEOUT_S`) when that fails."""
    if ray.is_initialized():
        return
    quiet = {"ignore_reinit_error": True, "include_dashboard": False,
             "log_to_driver": False, "logging_level": "ERROR"}
    if backend.ray != RAY_LOCAL:
        check_reachable(str(backend.ray))
    try:
        if backend.ray == RAY_LOCAL:
            ray.init(num_cpus=backend.jobs, **quiet)
        else:
            ray.init(address=backend.ray, **quiet)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
        raise UsageError(
            f"cannot start or reach Ray ({backend.describe()}): {exc}", where=Param("ray"),
            hint="check the address (ray status on the head node), or use `ray` local"
            " for a Ray instance on this machine",
        ) from None


def _lost_worker_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's exceptions for a task whose worker, node or result went away."""
    names = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "ObjectLostError",
             "LocalRayletDiedError", "TaskCancelledError")
    found = (getattr(ray.exceptions, name, None) for name in names)
    return tuple(kind for kind in found if isinstance(kind, type))


def _run_on_ray(backend: Backend, fn: Callable[..., Any], pieces: _Pieces, shared: Any,
                report: Callable[[int, Any], None]) -> list[Any]:
    ray = import_ray()
    connect_ray(ray, backend)
    remote = ray.remote(max_retries=0)(_call)  # placer retries, saying so
    ref = ray.put(shared) if pieces.with_shared else None

    def submit(i: int) -> Any:
        return remote.remote(fn, ref, pieces.items[i], pieces.with_shared)

    pending = {submit(i): i for i in range(len(pieces.items))}
    results: list[Any] = [None] * len(pieces.items)
    try:
        while pending:
            with _cluster_faults(ray, backend, pieces, pending):
                finished, _ = ray.wait(list(pending), num_returns=1)
            for handle in finished:
                i = pending.pop(handle)
                done, value = _ray_result(ray, handle, backend, pieces, pending)
                if not done:
                    pieces.died(i, value, backend.retries, where=backend.describe())
                    pending[submit(i)] = i
                    continue
                results[i] = value = say_again(value)
                report(i, value)
    finally:
        for handle in pending:  # the run failed: leave no work on the cluster
            with suppress(Exception):
                ray.cancel(handle, force=True)
    return results


def _ray_result(ray: Any, handle: Any, backend: Backend, pieces: _Pieces,
                pending: dict[Any, int]) -> tuple[bool, Any]:
    """``(True, result)`` of a finished task, ``(False, why)`` when its worker was lost;
    what the piece raised is raised again as it was raised."""
    failure: BaseException | None = None
    with _cluster_faults(ray, backend, pieces, pending):
        try:
            return True, ray.get(handle)
        except _lost_worker_errors(ray) as exc:
            return False, _ray_reason(exc)
        except ray.exceptions.RayTaskError as exc:  # the piece raised
            cause = getattr(exc, "cause", None)
            failure = cause if isinstance(cause, BaseException) else exc
    raise failure from None


@contextmanager
def _cluster_faults(ray: Any, backend: Backend, pieces: _Pieces,
                    pending: dict[Any, int]) -> Iterator[None]:
    """Ray's own failures inside the block (the cluster or the connection to it went
    away) as WorkerLostError naming the pieces left."""
    try:
        yield
    except (ray.exceptions.RaySystemError, ConnectionError) as exc:
        left = sorted(pending.values())
        names = ", ".join(pieces.names[i] for i in left[:3]) + (", ..." if len(left) > 3 else "")
        raise WorkerLostError(
            f"lost the Ray cluster ({type(exc).__name__}: {_first_line(exc)}) with"
            f" {len(left)} piece(s) unfinished ({names}); nothing was written",
            where=backend.describe(),
            hint="check the cluster (ray status on its head node) and run again",
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:160] if lines else ""


def _ray_reason(exc: BaseException) -> str:
    """A Ray lost-worker exception in a few words (its first line)."""
    first = _first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# -- one piece of work beside this process ---------------------------------------------
# After a plan's layer search, this process times the plan (the judge) and summarizes it
# on one core; work that does not wait on that (half the judge's layers, the summary's
# explanation rows) runs beside it in a forked child, on the other core.  The answer is
# the same wherever it was computed: the function is pure, and when the child cannot give
# it (no fork here, the child died or raised) the caller computes it.  The child runs at
# the caller's priority: a child at a lower one starves whenever other jobs keep the
# cores busy, and the caller would wait on it.

def _background_child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                      parent: int) -> None:
    """In the forked child: die with the parent, send ``fn(*args)``."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    try:
        message: tuple[bool, Any] = (True, _said(lambda: fn(*args)))
    except BaseException:  # the parent computes it again and raises it there
        message = (False, None)
    try:
        conn.send(message)
    except Exception:  # cannot be pickled: the parent computes it
        conn.send((False, None))
    conn.close()


class Background:
    """``fn(*args)`` computed in a forked child, beside this process (see the module).

    ``fn`` must be pure: :meth:`result` returns the child's answer, or computes
    ``fn(*args)`` in this process when the child could not answer or could not be started
    (no ``fork`` here, or this process is a daemonic worker, which may not have children).
    """

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args
        self.process: Any = None
        self.conn: Any = None
        if ("fork" not in multiprocessing.get_all_start_methods()
                or multiprocessing.current_process().daemon):  # a worker has no children
            return
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_background_child, daemon=True,
                                   args=(child, fn, args, os.getpid()))
        self.process.start()
        child.close()

    def result(self) -> Any:
        """The answer: the child's, or computed here (the child is reaped either way)."""
        if self.process is None:
            return self.fn(*self.args)
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):  # the child died without an answer
            ok, value = False, None
        finally:
            self.cancel()
        return say_again(value) if ok else self.fn(*self.args)

    def cancel(self) -> None:
        """Stop the child if it still runs, and reap it."""
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
