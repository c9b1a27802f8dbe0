"""Markov kernels on the unit cube with wrap-around, each acting on a subset of the chains.

A kernel proposes an *unwrapped* offset ``z`` for the lanes it was chosen for; the sampler
wraps ``y = (x + z) mod 1``, evaluates log f (and the derivatives the kernel ``needs``) at every
proposal of the step in one batched call, and asks the kernel for ``log Q(y -> x) - log Q(x -> y)``.
Densities use the unwrapped offsets ``z`` and ``-z`` (spec 5.4: the single-term density; an
exact periodic density would sum over lattice images, negligible for offsets << 1).

``evals_per_proposal`` is the number of target evaluations one proposal costs in the thesis'
Fig 6-6 convention (value, gradient and Hessian at one point count once): 1 for every kernel
here except leapfrog HMC, which costs ``n_steps + 1``.
"""

from __future__ import annotations

import numpy as np

from ._dynamics import T_DEFAULT, _check_variant
from ._proposal import h2mc_proposal


def _variance(sigma2, sigma, who):
    if (sigma2 is None) == (sigma is None):
        raise ValueError(f"{who}: give exactly one of sigma2 (variance) or sigma (std-dev)")
    v = float(sigma2) if sigma2 is not None else float(sigma) ** 2
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{who}: the variance must be finite and > 0, got {v}")
    return v


class Kernel:
    """Base class: see the module docstring for the protocol."""

    name = "kernel"
    needs = None  # None | "grad" | "hess": derivatives needed at x and at the proposal
    evals_per_proposal = 1

    def propose(self, sampler, state, idx, rng):
        """``(z, y_or_None, ctx)`` for lanes ``idx`` (``y`` given when exact, e.g. uniform)."""
        raise NotImplementedError

    def log_q_ratio(self, state, idx, z, prop, ctx):
        """``log Q(y -> x) - log Q(x -> y)`` for lanes ``idx``; ``prop`` holds the y side."""
        return np.zeros(len(idx))

    def commit(self, state, idx, accepted, ctx):
        """Called after the move with the lanes ``idx[accepted]`` that moved."""

    def __repr__(self):
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        return ""


class LargeStep(Kernel):
    """Independent uniform proposal on ``[0, 1]^n`` (ergodicity, jumps between modes)."""

    name = "large"

    def propose(self, sampler, state, idx, rng):
        y = rng.random((len(idx), state.n))
        return y - state.x[idx], y, None


class IsotropicStep(Kernel):
    """Wrap-around ``N(0, sigma2 I)`` offset: Kelemen's small step, and random-walk Metropolis."""

    name = "isotropic"

    def __init__(self, sigma2=None, *, sigma=None, name=None):
        self.sigma2 = _variance(sigma2, sigma, "IsotropicStep")
        if name:
            self.name = name

    def describe(self):
        return f"sigma2={self.sigma2:g}"

    def propose(self, sampler, state, idx, rng):
        return np.sqrt(self.sigma2) * rng.standard_normal((len(idx), state.n)), None, None


def RandomWalk(sigma2=None, *, sigma=None):
    """Random-walk Metropolis: an :class:`IsotropicStep` used on its own."""
    return IsotropicStep(sigma2, sigma=sigma, name="rwm")


class MALA(Kernel):
    """Metropolis-adjusted Langevin: ``y = x + (eps^2 / 2) grad log f(x) + eps xi``."""

    name = "mala"
    needs = "grad"

    def __init__(self, step: float):
        self.step = float(step)
        if not self.step > 0:
            raise ValueError(f"MALA: step must be > 0, got {step}")

    def describe(self):
        return f"step={self.step:g}"

    def propose(self, sampler, state, idx, rng):
        e = self.step
        drift = 0.5 * e * e * state.grad[idx]
        return drift + e * rng.standard_normal((len(idx), state.n)), None, drift

    def log_q_ratio(self, state, idx, z, prop, ctx):
        e2 = self.step ** 2
        fwd = np.sum((z - ctx) ** 2, axis=1)
        back = np.sum((-z - 0.5 * e2 * prop["grad"]) ** 2, axis=1)
        out = (fwd - back) / (2 * e2)
        return np.where(np.isfinite(out), out, -np.inf)


class HMC(Kernel):
    """Leapfrog Hamiltonian Monte Carlo with identity mass, positions wrapped on the torus.

    One proposal costs ``n_steps`` gradient evaluations plus the value at the end point, counted
    as ``n_steps + 1`` target evaluations (Fig 6-6: 12929 = 128 * 101 + 1 for 100 steps).
    A non-finite gradient along the trajectory rejects the proposal.
    """

    name = "hmc"
    needs = "grad"

    def __init__(self, step: float = 0.0005, n_steps: int = 100):
        self.step, self.n_steps = float(step), int(n_steps)
        if not (self.step > 0 and self.n_steps >= 1):
            raise ValueError(f"HMC: need step > 0 and n_steps >= 1, got {step}, {n_steps}")
        self.evals_per_proposal = self.n_steps + 1

    def describe(self):
        return f"step={self.step:g}, n_steps={self.n_steps}"

    def propose(self, sampler, state, idx, rng):
        e, target = self.step, sampler.target
        x0 = state.x[idx]
        p0 = rng.standard_normal(x0.shape)
        q = x0.copy()
        g = state.grad[idx]
        ok = np.isfinite(g).all(axis=1)
        p = p0 + 0.5 * e * g
        for k in range(self.n_steps):
            q = q + e * p
            g = target.gradient(_wrap(q))
            ok &= np.isfinite(g).all(axis=1)
            p = p + (e if k < self.n_steps - 1 else 0.5 * e) * g
        return q - x0, None, {"p0": p0, "p1": p, "grad": g, "ok": ok}

    def log_q_ratio(self, state, idx, z, prop, ctx):
        out = 0.5 * (np.sum(ctx["p0"] ** 2, axis=1) - np.sum(ctx["p1"] ** 2, axis=1))
        return np.where(ctx["ok"] & np.isfinite(out), out, -np.inf)


class H2MCStep(Kernel):
    """The H2MC small step: a Gaussian offset from the Hessian-Hamiltonian dynamics of log f.

    ``sigma2`` is the prior *variance* (``sigma=`` is sugar for ``sigma2 = sigma**2``); ``T`` the
    simulation time (pi/2); ``offset_variant`` ``"exact"`` or ``"thesis"`` (erratum D1); ``eps``
    the eigenvalue cutoff. The Gaussian of the current state is cached with the state, so a step
    costs one value + gradient + Hessian evaluation, at the proposal.
    """

    name = "h2mc"
    needs = "hess"

    def __init__(self, sigma2=None, *, sigma=None, T=T_DEFAULT, offset_variant="exact",
                 eps=1e-10):
        self.sigma2 = _variance(sigma2, sigma, "H2MCStep")
        _check_variant(offset_variant)
        self.T, self.offset_variant, self.eps = float(T), offset_variant, float(eps)

    def describe(self):
        return f"sigma2={self.sigma2:g}, T={self.T:.4g}, offsets={self.offset_variant}"

    def gaussian(self, grad, hess, log_f):
        return h2mc_proposal(grad, hess, self.sigma2, log_f=log_f, T=self.T, eps=self.eps,
                             offset_variant=self.offset_variant)

    def _cache(self, state):
        key = id(self)
        if key not in state.cache:
            B, n = state.x.shape
            g = self.gaussian(np.zeros((B, n)), np.zeros((B, n, n)), None)
            state.cache[key] = (g, np.full(B, -1, np.int64))
        return state.cache[key]

    def gaussian_at_state(self, state, idx):
        cache, stamp = self._cache(state)
        stale = stamp[idx] != state.stamp[idx]
        if stale.any():
            lanes = idx[stale]
            cache.put(lanes, self.gaussian(state.grad[lanes], state.hess[lanes],
                                           state.logf[lanes]))
            stamp[lanes] = state.stamp[lanes]
        return cache.take(idx)

    def propose(self, sampler, state, idx, rng):
        gx = self.gaussian_at_state(state, idx)
        z = gx.sample(rng=None, xi=rng.standard_normal((len(idx), state.n)))
        return z, None, {"gx": gx}

    def log_q_ratio(self, state, idx, z, prop, ctx):
        ok = np.isfinite(prop["logf"])
        gy = self.gaussian(prop["grad"], prop["hess"], prop["logf"])
        ctx["gy"] = gy
        out = gy.log_density(-z) - ctx["gx"].log_density(z)
        return np.where(ok, out, -np.inf)

    def commit(self, state, idx, accepted, ctx):
        if accepted.any():
            cache, stamp = self._cache(state)
            lanes = idx[accepted]
            cache.put(lanes, ctx["gy"].take(accepted))
            stamp[lanes] = state.stamp[lanes]


def _wrap(y):
    """``y mod 1`` into ``[0, 1)`` (rounding can give 1.0 for tiny negatives: mapped to 0)."""
    w = y - np.floor(y)
    return np.where(w >= 1.0, 0.0, w)
