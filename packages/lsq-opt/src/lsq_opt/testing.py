"""Derivative checks shared by the tests (and usable on user energies): a dense Jacobian of a
compiled plan by finite differences, and the relative comparison the acceptance checks use."""
from __future__ import annotations

import numpy as np

__all__ = ["fd_jacobian", "rel_check"]


def fd_jacobian(plan, x, h=1e-3):
    """Dense J of ``plan.residuals`` at x by 4-point central differences (truncation O(h^4))."""
    J = np.zeros((plan.m, plan.n))
    for j in range(plan.n):
        e = np.zeros(plan.n)
        e[j] = h
        d1 = plan.residuals(x + e) - plan.residuals(x - e)
        d2 = plan.residuals(x + 2 * e) - plan.residuals(x - 2 * e)
        J[:, j] = (8 * d1 - d2) / (12 * h)
    return J


def rel_check(a, b, rel=1e-6, floor=1e-8):
    """Assert |a - b| <= rel |b| (+1e-10 for the differences' rounding) on entries with
    |b| > floor, and |a - b| <= floor elsewhere."""
    a, b = np.asarray(a), np.asarray(b)
    big = np.abs(b) > floor
    err = np.abs(a - b)
    assert np.all(err[big] <= rel * np.abs(b[big]) + 1e-10), np.max(err[big] / np.abs(b[big]))
    assert np.all(err[~big] <= floor), np.max(err[~big])
