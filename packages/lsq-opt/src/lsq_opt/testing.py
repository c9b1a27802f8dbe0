"""Derivative checks shared by the tests (and usable on user energies): a dense Jacobian of a
compiled plan by finite differences, and the relative comparison the acceptance checks use;
and a graph problem shared by the tests and the benchmarks (:func:`spring_network`)."""
from __future__ import annotations

import numpy as np

__all__ = ["fd_jacobian", "rel_check", "spring_network"]


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


def spring_network(nx=40, ny=25, seed=0):
    """A compiled plan: a jittered ``nx`` x ``ny`` lattice (grid edges + one diagonal per cell)
    pulled apart by its two pinned ends (the right end stretched by 30 %, sheared and bent),
    with a robust loss on each edge's strain. A graph energy on which LM crawls with rho ~ 1/2
    (bench_defaults' spring network; the tests use a 12 x 8 one)."""
    from lsq_opt import (Array, Dim, Energy, Graph, Param, Select, Unknown, compile_problem,
                         sqrt)

    N = Dim("N")
    P, Q = Unknown("P", N, 2), Array("Q", N, 2)
    Pin = Array("Pin", N, 2)
    w_fit, s = Param("w_fitSqrt"), Param("s")
    G = Graph("G", ["v0", "v1"], N)
    dp = P(G.v0) - P(G.v1)
    dq = Q(G.v0) - Q(G.v1)
    e = sqrt(dp[0] * dp[0] + dp[1] * dp[1]) - sqrt(dq[0] * dq[0] + dq[1] * dq[1])
    robust = e * (1 + (e / s) * (e / s)) ** -0.25
    pinned = Pin(0)[0] > -1e5
    energy = Energy(Select(pinned, w_fit * (P(0) - Pin(0)), 0), robust)
    rng = np.random.default_rng(seed)
    ii, jj = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    idx = ii * ny + jj
    q = np.stack([ii, jj], -1).reshape(-1, 2).astype(float) + rng.uniform(-.2, .2, (nx * ny, 2))
    e0 = [idx[:-1, :].ravel(), idx[:, :-1].ravel(), idx[:-1, :-1].ravel()]
    e1 = [idx[1:, :].ravel(), idx[:, 1:].ravel(), idx[1:, 1:].ravel()]
    v0, v1 = np.concatenate(e0), np.concatenate(e1)
    pin = np.full((nx * ny, 2), -1e6)
    left, right = idx[0].ravel(), idx[-1].ravel()
    pin[left] = q[left]
    # right end: stretched by 30 %, sheared and bent upwards
    pin[right] = q[right] + np.array([0.3 * nx, 0.15 * nx]) + np.stack([0 * right, 0.3 * (q[right, 1] - ny / 2)], -1)
    p0 = q.copy()
    p0[right] = pin[right]
    plan = compile_problem(energy, arrays={"Q": q, "Pin": pin, "P": p0},
                           params={"w_fitSqrt": 10.0, "s": 0.5}, graphs={"G": {"v0": v0, "v1": v1}})
    return plan
