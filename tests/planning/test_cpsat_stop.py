"""A stop signal ends a running CP-SAT solve at once (placer.planning.solvers.cpsat.stop):
without the hook the solve below runs to its 60 s limit before Python sees the signal."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from ortools.sat.python import cp_model

from placer.planning.solvers.cpsat import stop


def _hard_model() -> cp_model.CpModel:
    """Sixty intervals that may not overlap, summed: a search that runs to its limit."""
    model = cp_model.CpModel()
    x = [model.new_int_var(0, 1000, f"x{i}") for i in range(60)]
    for i in range(60):
        for j in range(i + 1, 60):
            before = model.new_bool_var("")
            model.add(x[i] + (j - i) <= x[j]).only_enforce_if(before)
            model.add(x[j] + (j - i) <= x[i]).only_enforce_if(~before)
    model.minimize(sum(x))
    return model


def _solver(seconds: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.catch_sigint_signal = False
    return solver


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
def test_sigterm_stops_the_solve_within_a_second():
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            stop.solve(_solver(60.0), _hard_model())
            time.sleep(5)  # the handler runs here, once the solve returned
        assert time.monotonic() - start < 2.0
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    time.sleep(stop._LATE_S + 0.2)
    solver = _solver(1.5)  # later solves run as asked
    start = time.monotonic()
    assert stop.solve(solver, _hard_model()) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    assert time.monotonic() - start > 1.2


@pytest.mark.slow
def test_other_signals_do_not_stop_a_solve():
    def ignore(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR1, ignore)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        start = time.monotonic()
        stop.solve(_solver(1.0), _hard_model())
        assert time.monotonic() - start > 0.9
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
