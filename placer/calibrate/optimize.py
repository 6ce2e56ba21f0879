"""The least-squares optimiser of ``placer calibrate``: Levenberg–Marquardt from several
starts, a Nelder–Mead polish and a last Levenberg–Marquardt pass, numpy only and
deterministic (no random draws).  Pure functions of a residual ``theta -> [rows]``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

Residual = Callable[[np.ndarray], np.ndarray]


def _loss(r: np.ndarray) -> float:
    return float(r @ r) if np.isfinite(r).all() else math.inf


def _jacobian(residual: Residual, theta: np.ndarray, r0: np.ndarray) -> np.ndarray:
    jac = np.empty((r0.size, theta.size))
    for j in range(theta.size):
        h = 1e-6 * max(1.0, abs(theta[j]))
        t = theta.copy()
        t[j] += h
        jac[:, j] = (residual(t) - r0) / h
    return jac


def _levenberg_marquardt(residual: Residual, theta: np.ndarray,
                         max_iter: int = 60) -> tuple[np.ndarray, float]:
    r = residual(theta)
    f = _loss(r)
    lam = 1e-3
    for _ in range(max_iter):
        if f < 1e-24:
            break
        jac = _jacobian(residual, theta, r)
        grad = jac.T @ r
        hess = jac.T @ jac
        scale = np.diag(hess).copy()
        scale[scale <= 0] = 1.0
        improved = False
        while lam < 1e12:
            try:
                step = np.linalg.solve(hess + lam * np.diag(scale), -grad)
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            trial = theta + step
            r_trial = residual(trial)
            f_trial = _loss(r_trial)
            if f_trial < f:
                small = f - f_trial <= 1e-12 * f and float(np.abs(step).max()) < 1e-9
                theta, r, f = trial, r_trial, f_trial
                lam = max(lam / 5, 1e-12)
                improved = not small
                break
            lam *= 5
        if not improved:
            break
    return theta, f


def _nelder_mead(loss: Callable[[np.ndarray], float], theta: np.ndarray, step: float,
                 max_evals: int) -> tuple[np.ndarray, float]:
    """Nelder–Mead with the adaptive coefficients of Gao and Han (2012)."""
    n = theta.size
    alpha, gamma = 1.0, 1 + 2 / n
    rho, sigma = 0.75 - 1 / (2 * n), 1 - 1 / n
    simplex = np.vstack([theta] + [theta + step * np.eye(n)[i] for i in range(n)])
    values = np.array([loss(x) for x in simplex])
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values, kind="stable")
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] <= 1e-14 * (1 + abs(values[0])) and \
                float(np.abs(simplex[1:] - simplex[0]).max()) < 1e-8:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + alpha * (centroid - simplex[-1])
        fr = loss(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + gamma * (reflected - centroid)
            fe = loss(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            outside = fr < values[-1]
            target = reflected if outside else simplex[-1]
            contracted = centroid + rho * (target - centroid)
            fc = loss(contracted)
            evals += 1
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                simplex[1:] = simplex[0] + sigma * (simplex[1:] - simplex[0])
                values[1:] = [loss(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(values))
    return simplex[best], float(values[best])


def minimize(residual: Residual, starts: list[np.ndarray]) -> np.ndarray:
    """The ``theta`` with the least squared residual found from ``starts``: each start
    by Levenberg–Marquardt, the best polished by Nelder–Mead (across kinks of the max
    in the time model) and finished by Levenberg–Marquardt."""
    best, best_f = starts[0], math.inf
    for start in starts:
        theta, f = _levenberg_marquardt(residual, start)
        if f < best_f:
            best, best_f = theta, f
    if best_f > 1e-20:  # polish across kinks, then let LM finish
        theta, f = _nelder_mead(lambda t: _loss(residual(t)), best, 0.05,
                                max_evals=60 * (best.size + 1))
        theta, f = _levenberg_marquardt(residual, theta)
        if f < best_f:
            best = theta
    return best
