"""Many independent Markov chains advanced together, with a mixture of kernels.

At every step each chain picks a kernel at random with fixed probabilities (never depending on
the state, so each sub-kernel keeps detailed balance on its own; spec 4.7 rule 4). The exception
is a chain whose state has f = 0 (an invalid start): it always takes a large step, as in the
reference renderer; such states have zero target mass, so this does not bias the chain.

Per step, for the whole batch: one log f evaluation of every proposal, one ``batch_hessian``
call for the proposals of the kernels that need Hessians (and one gradient call for those that
need gradients), plus, only for chains whose current derivatives are unknown (the first step,
or after a move by a kernel that does not compute derivatives), one call at the current states.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ._kernels import Kernel, LargeStep, _wrap
from ._target import Target


class InvalidStateError(ValueError):
    """Initial states the sampler cannot start from."""


@dataclass
class ChainState:
    """The batch of chains: positions and cached derivatives of log f.

    ``stamp`` counts the moves of each chain; kernels key their caches on it.
    """

    x: np.ndarray
    logf: np.ndarray
    grad: np.ndarray
    hess: np.ndarray
    has_grad: np.ndarray
    has_hess: np.ndarray
    stamp: np.ndarray
    cache: dict = field(default_factory=dict)
    wrapped_on_init: int = 0

    @property
    def B(self) -> int:
        return self.x.shape[0]

    @property
    def n(self) -> int:
        return self.x.shape[1]


@dataclass
class KernelStats:
    proposed: int = 0
    accepted: int = 0
    accept_prob_sum: float = 0.0
    evals: int = 0

    @property
    def acceptance(self) -> float:
        """Fraction of proposals accepted (nan if none)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accept_prob(self) -> float:
        """Mean of min(1, a) over proposals (a lower-variance acceptance estimate)."""
        return self.accept_prob_sum / self.proposed if self.proposed else float("nan")


@dataclass
class RunResult:
    """Output of :meth:`Sampler.run`: recorded positions ``(steps, B, n)`` and log f."""

    samples: np.ndarray | None
    logf: np.ndarray | None
    state: ChainState
    stats: dict
    evals: int
    seconds: float
    steps: int


class Sampler:
    """A mixture of kernels run on ``B`` chains at once.

    ``kernels``: a list of ``(probability, kernel)`` pairs (probabilities summing to 1), or a
    single kernel. Example (the spec's AE-4 mixture)::

        Sampler(target, [(0.1, LargeStep()), (0.2, IsotropicStep(sigma2=1e-4)),
                         (0.7, H2MCStep(sigma2=1e-3))])
    """

    def __init__(self, target: Target, kernels):
        if not isinstance(target, Target):
            raise TypeError("Sampler: target must be an h2mc.Target")
        if isinstance(kernels, Kernel):
            kernels = [(1.0, kernels)]
        pairs = [(float(p), k) for p, k in kernels]
        if not pairs:
            raise ValueError("Sampler: need at least one kernel")
        probs = np.array([p for p, _ in pairs])
        if (probs < 0).any() or abs(probs.sum() - 1.0) > 1e-9:
            raise ValueError(f"Sampler: kernel probabilities must be >= 0 and sum to 1, got"
                             f" {probs.tolist()}")
        for _, k in pairs:
            if not isinstance(k, Kernel):
                raise TypeError(f"Sampler: {k!r} is not a Kernel")
        self.target = target
        self.kernels = [k for _, k in pairs]
        self.probs = probs
        self._cum = np.cumsum(probs)
        self._cum[-1] = 1.0
        names = [k.name for k in self.kernels]
        self.names = [nm if names.count(nm) == 1 else f"{nm}{i}" for i, nm in enumerate(names)]
        self._large = next((i for i, k in enumerate(self.kernels) if isinstance(k, LargeStep)),
                           None)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {nm: KernelStats() for nm in self.names}
        self.refresh_evals = 0
        self.steps = 0

    # ------------------------------------------------------------------ state
    def init(self, x0) -> ChainState:
        """Chains at ``x0`` ``(B, n)``: non-finite entries are an error, positions outside
        ``[0, 1)`` are wrapped (``x mod 1``, counted in ``state.wrapped_on_init``), and states
        with f = 0 need a :class:`LargeStep` in the mixture to escape."""
        x = np.array(x0, dtype=np.float64)
        n = self.target.n
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.shape[1] != n:
            raise InvalidStateError(f"Sampler.init: x0 must have shape (B, {n}), got {x.shape}")
        if not np.isfinite(x).all():
            b = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InvalidStateError(f"Sampler.init: x0 has non-finite entries (chain {b}:"
                                    f" {x[b].tolist()}); states must lie in [0, 1)^{n}")
        outside = ((x < 0) | (x >= 1)).any(axis=1)
        x = _wrap(x)
        logf = self.target.log_f(x)
        if self._large is None and not np.isfinite(logf).all():
            b = int(np.flatnonzero(~np.isfinite(logf))[0])
            raise InvalidStateError(
                f"Sampler.init: f = 0 (log f = -inf or NaN) at chain {b} (x = {x[b].tolist()})"
                " and the mixture has no LargeStep to leave it; start the chains where f > 0")
        B = x.shape[0]
        return ChainState(x, logf, np.zeros((B, n)), np.zeros((B, n, n)),
                          np.zeros(B, bool), np.zeros(B, bool), np.zeros(B, np.int64),
                          wrapped_on_init=int(outside.sum()))

    def _ensure_derivatives(self, state, lanes, level):
        lanes = lanes[np.isfinite(state.logf[lanes])]
        if level == "hess":
            lanes = lanes[~state.has_hess[lanes]]
            if lanes.size:
                g, H = self.target.derivatives(state.x[lanes])
                state.grad[lanes], state.hess[lanes] = g, H
                state.has_grad[lanes] = state.has_hess[lanes] = True
        else:
            lanes = lanes[~state.has_grad[lanes]]
            if lanes.size:
                state.grad[lanes] = self.target.gradient(state.x[lanes])
                state.has_grad[lanes] = True
        self.refresh_evals += int(lanes.size)

    # ------------------------------------------------------------------ one step
    def step(self, state: ChainState, rng) -> np.ndarray:
        """Advance every chain by one kernel application; returns the accepted mask ``(B,)``."""
        B, n = state.x.shape
        choice = np.searchsorted(self._cum, rng.random(B), side="right")
        choice = np.minimum(choice, len(self.kernels) - 1)
        if self._large is not None:
            choice[~np.isfinite(state.logf)] = self._large
        groups = [np.flatnonzero(choice == j) for j in range(len(self.kernels))]

        for level in ("hess", "grad"):
            lanes = [g for g, k in zip(groups, self.kernels) if k.needs == level and g.size]
            if lanes:
                self._ensure_derivatives(state, np.concatenate(lanes), level)

        z = np.zeros((B, n))
        y = np.empty((B, n))
        ctxs = [None] * len(self.kernels)
        exact_y = np.zeros(B, bool)
        for j, (k, idx) in enumerate(zip(self.kernels, groups)):
            if idx.size:
                zj, yj, ctxs[j] = k.propose(self, state, idx, rng)
                z[idx] = zj
                if yj is not None:
                    y[idx], exact_y[idx] = yj, True
        y[~exact_y] = _wrap(state.x[~exact_y] + z[~exact_y])
        logf_y = self.target.log_f(y)
        finite = np.isfinite(logf_y)

        grad_y = np.zeros((B, n))
        hess_y = np.zeros((B, n, n))
        has_g = np.zeros(B, bool)
        has_h = np.zeros(B, bool)
        need_h = [idx for k, idx in zip(self.kernels, groups) if k.needs == "hess" and idx.size]
        if need_h:
            lanes = np.concatenate(need_h)
            lanes = lanes[finite[lanes]]
            if lanes.size:
                grad_y[lanes], hess_y[lanes] = self.target.derivatives(y[lanes])
                has_g[lanes] = has_h[lanes] = True
        need_g = []
        for j, (k, idx) in enumerate(zip(self.kernels, groups)):
            if k.needs == "grad" and idx.size:
                if isinstance(ctxs[j], dict) and "grad" in ctxs[j]:
                    grad_y[idx], has_g[idx] = ctxs[j]["grad"], True
                else:
                    need_g.append(idx)
        if need_g:
            lanes = np.concatenate(need_g)
            lanes = lanes[finite[lanes]]
            if lanes.size:
                grad_y[lanes] = self.target.gradient(y[lanes])
                has_g[lanes] = True

        with np.errstate(invalid="ignore"):
            log_a = logf_y - state.logf
        for j, (k, idx) in enumerate(zip(self.kernels, groups)):
            if idx.size:
                prop = {"logf": logf_y[idx], "grad": grad_y[idx], "hess": hess_y[idx]}
                log_a[idx] += k.log_q_ratio(state, idx, z[idx], prop, ctxs[j])
        log_a = np.where(finite & ~np.isnan(log_a), log_a, -np.inf)
        accept = np.log(rng.random(B)) < log_a

        acc = np.flatnonzero(accept)
        state.x[acc] = y[acc]
        state.logf[acc] = logf_y[acc]
        state.grad[acc] = grad_y[acc]
        state.hess[acc] = hess_y[acc]
        state.has_grad[acc] = has_g[acc]
        state.has_hess[acc] = has_h[acc]
        state.stamp[acc] += 1

        prob = np.exp(np.minimum(log_a, 0.0))
        for j, (k, idx, nm) in enumerate(zip(self.kernels, groups, self.names)):
            if idx.size:
                k.commit(state, idx, accept[idx], ctxs[j])
                st = self.stats[nm]
                st.proposed += idx.size
                st.accepted += int(accept[idx].sum())
                st.accept_prob_sum += float(prob[idx].sum())
                st.evals += idx.size * k.evals_per_proposal
        self.steps += 1
        return accept

    # ------------------------------------------------------------------ many steps
    def evaluations(self) -> int:
        """Target evaluations so far (Fig 6-6 convention) including derivative refreshes."""
        return self.refresh_evals + sum(s.evals for s in self.stats.values())

    def run(self, state: ChainState, n_steps: int, rng=None, *, record: bool = True,
            thin: int = 1, callback=None, progress: bool | str = False) -> RunResult:
        """Run ``n_steps`` steps on every chain.

        ``record`` keeps every ``thin``-th state as ``samples (steps // thin, B, n)`` and its
        log f; ``callback(step, state)`` is called after each step (e.g. to accumulate
        histograms without storing samples); ``progress`` shows a tqdm bar on stderr (a string
        is used as its label).
        """
        rng = np.random.default_rng(rng)
        thin = max(1, int(thin))
        m = n_steps // thin if record else 0
        samples = np.empty((m, state.B, state.n)) if record else None
        logfs = np.empty((m, state.B)) if record else None
        label = progress if isinstance(progress, str) else "h2mc"
        bar = _progress_bar(n_steps, label) if progress else None
        t0 = time.perf_counter()
        e0 = self.evaluations()
        for t in range(n_steps):
            self.step(state, rng)
            if record and (t + 1) % thin == 0 and (t + 1) // thin <= m:
                samples[(t + 1) // thin - 1] = state.x
                logfs[(t + 1) // thin - 1] = state.logf
            if callback is not None:
                callback(t, state)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return RunResult(samples, logfs, state, self.stats, self.evaluations() - e0,
                         time.perf_counter() - t0, n_steps)

    def acceptance(self) -> dict:
        """``{kernel name: fraction accepted}`` so far."""
        return {nm: st.acceptance for nm, st in self.stats.items()}

    def report(self) -> str:
        """A small text table of proposals, acceptance and evaluations per kernel."""
        lines = [f"{'kernel':<12}{'proposed':>10}{'accepted':>10}{'acc.rate':>10}"
                 f"{'mean a':>9}{'evals':>12}"]
        for nm, st in self.stats.items():
            lines.append(f"{nm:<12}{st.proposed:>10}{st.accepted:>10}{st.acceptance:>10.4f}"
                         f"{st.mean_accept_prob:>9.4f}{st.evals:>12}")
        lines.append(f"target evaluations: {self.evaluations()} (derivative refreshes at"
                     f" current states: {self.refresh_evals}); raw counts {self.target.counts}")
        return "\n".join(lines)


def _progress_bar(n_steps: int, label: str):
    """A tqdm bar over the steps (each step advances every chain)."""
    from tqdm.auto import tqdm

    return tqdm(total=n_steps, desc=label, unit="step", file=sys.stderr, dynamic_ncols=True)
