"""Where independent pieces of work run: this process, local processes, or a Ray cluster.

Planning solves layers independently and ``placer compare`` runs scenarios independently;
both hand their pieces to :meth:`Backend.run`, which returns the results in the pieces'
order whatever order they finish in, so the answer does not depend on where they ran
(every piece is deterministic for its inputs and seed).

Ray (``pip install 'placer[ray]'``) is the optional cluster backend: ``ray="local"``
starts a Ray instance on this machine, any other value is the address of a running
cluster (``"auto"``, ``"ray://head:10001"``), whose workers need placer installed at
the same version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from placer.errors import Param, UsageError

#: ``Backend.ray`` value that starts a Ray instance on this machine.
RAY_LOCAL = "local"

_SHARED: Any = None  # what every piece shares, in a local worker process


@dataclass(frozen=True)
class Backend:
    """How to run independent pieces of work.

    Attributes
    ----------
    jobs: local processes at once (1: in this process); with Ray, the CPUs a local
        instance may use.
    ray: None for local processes, :data:`RAY_LOCAL` to start Ray here, or the address
        of a Ray cluster.
    """

    jobs: int = 1
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise UsageError(f"jobs must be at least 1, got {self.jobs}", where=Param("jobs"))

    def run(self, fn: Callable[..., Any], items: Sequence[Any], *, shared: Any = None,
            on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
        """``fn(item)`` (or ``fn(shared, item)`` when ``shared`` is given) for every item;
        results in item order.  ``on_done(index, result)`` is called as pieces finish.

        ``fn`` must be a module-level function (it is sent to other processes).
        """
        report = on_done or (lambda i, result: None)
        if self.ray is not None:
            return _run_on_ray(self, fn, items, shared, report)
        results: list[Any] = [None] * len(items)
        if self.jobs == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                results[i] = fn(item) if shared is None else fn(shared, item)
                report(i, results[i])
            return results
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(items)),
                                 initializer=_set_shared, initargs=(shared,)) as pool:
            futures = {pool.submit(_call_shared, fn, item, shared is not None): i
                       for i, item in enumerate(items)}
            for future in as_completed(futures):
                i = futures[future]
                results[i] = future.result()
                report(i, results[i])
        return results

    def describe(self) -> str:
        """``2 local processes``, ``Ray (local instance)``, ``Ray at ADDRESS``."""
        if self.ray is None:
            return "this process" if self.jobs == 1 else f"{self.jobs} local processes"
        return "Ray (local instance)" if self.ray == RAY_LOCAL else f"Ray at {self.ray}"


def _set_shared(shared: Any) -> None:
    global _SHARED
    _SHARED = shared


def _call_shared(fn: Callable[..., Any], item: Any, with_shared: bool) -> Any:
    return fn(_SHARED, item) if with_shared else fn(item)


def _call(fn: Callable[..., Any], shared: Any, item: Any, with_shared: bool) -> Any:
    return fn(shared, item) if with_shared else fn(item)


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


def _run_on_ray(backend: Backend, fn: Callable[..., Any], items: Sequence[Any], shared: Any,
                report: Callable[[int, Any], None]) -> list[Any]:
    ray = import_ray()
    if not ray.is_initialized():
        quiet = {"ignore_reinit_error": True, "include_dashboard": False,
                 "log_to_driver": False, "logging_level": "ERROR"}
        try:
            if backend.ray == RAY_LOCAL:
                ray.init(num_cpus=backend.jobs, **quiet)
            else:
                ray.init(address=backend.ray, **quiet)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
            raise UsageError(
                f"cannot start or reach Ray ({backend.describe()}): {exc}", where=Param("ray"),
                hint="check the address (ray status on the head node), or use `ray` alone"
                " for a local instance",
            ) from None
    remote = ray.remote(_call)
    ref = ray.put(shared) if shared is not None else None
    pending = {remote.remote(fn, ref, item, shared is not None): i
               for i, item in enumerate(items)}
    results: list[Any] = [None] * len(items)
    while pending:
        finished, _ = ray.wait(list(pending), num_returns=1)
        for handle in finished:
            i = pending.pop(handle)
            results[i] = ray.get(handle)
            report(i, results[i])
    return results
