"""Solver options: every default in one place.

The defaults are chosen to converge without tuning (as Ceres' do); the paper's fixed settings
(spec §4.3: 10 non-linear x 10 PCG iterations, Jacobi) are :meth:`SolverOptions.paper`.

=========================  ===============  ================================================
option                     default          meaning
=========================  ===============  ================================================
max_iterations             500              non-linear iterations (LM: rejected steps count);
                                            Ceres' max_num_iterations
function_tolerance         1e-6             stop when an accepted step changes the cost by
                                            <= ftol * cost (Ceres)
gradient_tolerance         1e-10            stop when max|J^T F| <= gtol * max|J^T F(x0)|
                                            (relative, as Ceres' gradient_tolerance on the
                                            projected gradient, which scales with the problem)
parameter_tolerance        1e-8             stop when ||delta|| <= ptol (||x|| + ptol) (Ceres)
pcg_tolerance              None (auto)      relative PCG residual ||r||/||b|| stop; None: an
                                            Eisenstat-Walker forcing sequence (choice 1,
                                            safeguarded) per non-linear iteration, see
                                            :func:`forcing_term`; LM: at most 0.1 after
                                            three accepted steps in a row with rho < 0.75 (a
                                            loose solve lowers rho, and Nielsen's rule then
                                            holds mu at rho ~1/2: a spring network crawled
                                            406 iterations at mu ~6, now 286; see
                                            :class:`.levenberg_marquardt.ForcingSequence`)
pcg_max_iterations         None (auto)      PCG iteration cap; None: 100. The forcing term
                                            normally stops PCG first; the cap bounds the work
                                            on ill-conditioned systems whose long solves LM
                                            then rejects (measured against Ceres' 500: ARAP
                                            image 1.35x, intrinsic and a spring network 1.1x
                                            faster, grid problems unchanged; 50 was 2.3x on
                                            the spring network but stopped a linear Jacobi
                                            smoothing at a 50x larger gradient). LM: 30
                                            after an accepted step whose rho was off 1 by
                                            more than 0.1 (the model missed; a 2048-vertex
                                            ARAP mesh 2.7x faster, see
                                            :class:`.levenberg_marquardt.ForcingSequence`)
q_tolerance                None (auto)      LM Q-based early exit (spec §4.3); None: off when
                                            pcg_tolerance is automatic (the forcing term
                                            already bounds the effort), 1e-4 otherwise
preconditioner             "auto"           "jacobi+multigrid" for energies on one grid
                                            with at least ``multigrid_min_unknowns``
                                            unknowns: Jacobi-PCG, and a multigrid V-cycle
                                            only for the systems where Jacobi is slow (its
                                            setup costs tens of Jacobi iterations; see
                                            :mod:`.adaptive`); "jacobi" elsewhere, and in
                                            the cuda backend's device loop (multigrid is
                                            host-only: asking for it there is an error).
                                            Graphs stay on Jacobi: a block diagonal and a
                                            graph multigrid did not cut their PCG work;
                                            "factorization" (opt-in, :mod:`.factorization`)
                                            made a 512-vertex ARAP mesh 1.6x faster and a
                                            spring network slower, and no rule found
                                            chooses it where it pays
multigrid_min_unknowns     4096
step_extension             True             LM, after an accepted step with rho > 1.1 (the
                                            cost fell more than J^T J's model said: the
                                            residuals' curvature along the step is
                                            negative): one more cost evaluation at the
                                            minimiser t in (1, 4] of the parabola through
                                            cost(x), its slope g.d and cost(x + d), kept if
                                            lower (see :func:`.levenberg_marquardt.
                                            extended_step_length`). Gauss-Newton converges
                                            linearly there, by the ratio rho - 1: an ARAP
                                            mesh 50 -> 43 iterations, intrinsic 60 -> 31-37,
                                            TV 15 -> 11, ARAP image 86 -> 72 (a spring
                                            network's count moves with rounding: 216-285
                                            against 275-300). False in ``paper()``
reject_to_step_curvature   True             LM, after a rejected step: mu falls at least to
                                            where the damping along that step equals the
                                            model's curvature along it (the next trial about
                                            half as long there); plain mu / nu repeats nearly
                                            the same undamped step at a large mu (an ARAP mesh:
                                            8 rejections x 65 PCG in a row). False in
                                            ``paper()`` (spec §4.3's rule only)
predicted_stop             True             LM, after an accepted step whose PCG reached
                                            its tolerance: stop ("function
                                            tolerance") when the next step could gain at
                                            most ftol / 10 of the cost: PCG's estimate of
                                            the model decrease its inexact solve left
                                            (r.M^-1 r over the smallest Ritz value of its
                                            Lanczos tridiagonal) plus this step's model
                                            error |dc - dm| plus what the damping held
                                            back, (D d).(diag + D)^-1 (D d) / 2. A linear
                                            problem stops
                                            after the step solved to the forcing floor
                                            instead of solving once more to learn that
                                            nothing is left (Poisson: 3 -> 2 iterations).
                                            With it, each host PCG solve also stops once
                                            the same estimate of the model decrease it has
                                            left is below ftol / 10 of the cost ("decrease
                                            tolerance"): the forcing floor asks for more
                                            than the function tolerance can see (Poisson's
                                            second solve 25 -> 12 iterations, the whole
                                            solve 67 -> 37 ms, 1.8x; cost within 2e-9).
                                            False in ``paper()``
slope_check                True             LM, after a rejected step whose cost rose: one
                                            cost evaluation on a short step along it; when
                                            the cost does not fall there either, stop ("no
                                            descent": the Jacobian is not the residuals'
                                            derivative, e.g. optical flow's precomputed
                                            image gradients, where 7 rejections down to the
                                            function tolerance were 7 of 12 iterations).
                                            False in ``paper()``
initial_trust_region_radius 1e8             LM mu_0 (lambda = 1/mu): start close to a
                                            Gauss-Newton step (Ceres and the paper: 1e4);
                                            rejected steps shrink it
device_loop                True             a cuda plan (``backend="cuda"``): GN / LM / PCG
                                            with every vector on the device, the host
                                            fetching only control scalars (see
                                            :mod:`lsq_opt._compiler.cuda`); False: the
                                            solvers on the plan's numpy protocol (an upload
                                            and a download per product). No effect on the
                                            host backends
pcg_check_every            4                the device loop: PCG checks its stopping tests on
                                            the device after every iteration, and the host
                                            fetches the outcome every that many iterations
                                            (one synchronisation); a PCG solve that stops
                                            launches up to pcg_check_every - 1 more
                                            iterations, which change nothing (the step, the
                                            PCG iteration count and the stop reason are
                                            unchanged). 1: check every iteration. No effect
                                            on host vectors
linear_system              "auto"           how PCG gets J^T J p: the generated product
                                            ("matrix_free"), J assembled per linearisation
                                            and two sparse products ("jacobian"), or J^T J
                                            formed per linearisation ("jtj": a plan's
                                            stencil assembly on grids, else SpGEMM); spec
                                            AE-9. The materialised forms are host-only.
                                            "auto": per linearisation, "jtj" when the
                                            matrix-free products of the previous one cost
                                            more than a build plus as many sparse products
                                            (measured prices, each the median of its last
                                            31 timings, robust to preemptions; the first
                                            build priced at 10 products, one probe; see
                                            :class:`.materialized.AutoLinearSystem`), else
                                            "matrix_free", switching part-way once the
                                            avoidable part of its products has cost a
                                            build (a ski rental); matrix-free on the device
=========================  ===============  ================================================

The two "auto" choices priced by timings (``linear_system`` and, on large grids,
``preconditioner``) move only rounding, yet can part the iterates of a crawling solve; fix
both for bitwise-repeatable solves (README "Repeatable solves").
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

__all__ = ["SolverOptions"]

# Eisenstat-Walker (1996) choice 1 constants: first forcing term, upper bound, and the
# safeguard exponent (1 + sqrt 5) / 2
FORCING_INITIAL = 0.1
FORCING_MAX = 0.5
FORCING_SAFEGUARD_EXPONENT = 1.618
# LM: after POOR_STEP_RUN accepted steps in a row with rho below POOR_STEP_RHO the next
# forcing term is at most POOR_STEP_FORCING (Ceres' eta); see
# :class:`.levenberg_marquardt.ForcingSequence`
POOR_STEP_RHO = 0.75
POOR_STEP_FORCING = 0.1
POOR_STEP_RUN = 3
# LM with the automatic cap: after an accepted step with |rho - 1| > MODEL_ERROR_RHO the next PCG
# solve stops at MODEL_ERROR_PCG_CAP iterations (:class:`.levenberg_marquardt.ForcingSequence`)
MODEL_ERROR_RHO = 0.1
MODEL_ERROR_PCG_CAP = 30
AUTO_PCG_MAX_ITERATIONS = 100
# device PCG: iterations between two host checks (a check is a synchronisation, ~10-20 us plus
# the launch queue draining; an iteration launched after the stop costs the product and four
# no-op launches)
PCG_CHECK_EVERY = 4


@dataclass
class SolverOptions:
    max_iterations: int = 500
    pcg_max_iterations: int | None = None  # None: automatic (see module docstring)
    pcg_tolerance: float | None = None  # None: Eisenstat-Walker forcing sequence
    q_tolerance: float | None = None  # None: automatic (off with the forcing sequence)
    residual_reset_period: int = 10  # LM PCG explicit residual reset period (spec §4.3); GN never resets.
    function_tolerance: float = 1e-6  # LM: stop on accept if dc <= ftol*cost; GN: |dc| <= ftol*cost
    gradient_tolerance: float = 1e-10  # relative to max|J^T F| at x0 (0: only an exactly zero gradient)
    parameter_tolerance: float = 1e-8  # stop if ||delta|| <= ptol*(||x|| + ptol) (Ceres form)
    forcing_min: float | None = None  # smallest automatic PCG tolerance; None: 1e-8 (f64), 1e-4 (f32)
    initial_trust_region_radius: float = 1e8  # mu_0 (lambda = 1/mu); see module docstring
    min_trust_region_radius: float = 1e-32
    max_trust_region_radius: float = 1e16
    radius_decrease_factor: float = 2.0  # initial nu
    min_lm_diagonal: float = 1e-6
    max_lm_diagonal: float = 1e32
    min_relative_decrease: float = 1e-3
    predicted_stop: bool = True  # LM: stop once the next step's predicted gain is below ftol / 10 (see above)
    step_extension: bool = True  # LM: an accepted step with rho > 1.1 goes on to its parabola's minimiser (see above)
    reject_to_step_curvature: bool = True  # LM: a rejection lowers mu at least to the step's curvature (see above)
    slope_check: bool = True  # LM: stop when the cost does not fall along a rejected step at first order (see above)
    jacobi_scaling: bool = True  # Ceres ONCE_PER_SOLVE scaling s_i = (1+sqrt(diag_i))^2 in the D clamp
    preconditioner: str = "auto"  # "auto" | "jacobi" | "none" | "ceres" | "modified_ceres" | "epsilon" | "multigrid" | "factorization"
    multigrid_min_unknowns: int = 4096  # "auto" picks multigrid on grid energies from this size
    verbose: bool = False  # print one flushed line per iteration and the reason the solve stopped
    progress: Callable[[str], Any] | None = None  # receives each formatted progress line
    callback: Callable[..., Any] | None = None  # callback(entry, x); a true result stops ("user callback")
    device_loop: bool = True  # a cuda plan: the whole solve on the device (False: host protocol)
    pcg_check_every: int = PCG_CHECK_EVERY  # device loop: PCG iterations between host checks (see module docstring)
    linear_system: str = "auto"  # "auto" | "matrix_free" | "jacobian" | "jtj" (see module docstring)

    @classmethod
    def paper(cls, **kw: Any) -> "SolverOptions":
        """The Opt paper's fixed settings (spec §4.3): 10 x 10 iterations, Jacobi PCG,
        relative PCG tolerance 1e-10, LM Q tolerance 1e-4, mu_0 = 1e4, no gradient/parameter
        tests, spec §4.3's rejection rule alone, no step extension."""
        base = dict(max_iterations=10, pcg_max_iterations=10, pcg_tolerance=1e-10, q_tolerance=1e-4,
                    gradient_tolerance=0.0, parameter_tolerance=0.0, preconditioner="jacobi",
                    initial_trust_region_radius=1e4, reject_to_step_curvature=False,
                    predicted_stop=False, step_extension=False, slope_check=False)
        base.update(kw)
        return cls.from_kwargs(**base)

    @classmethod
    def from_kwargs(cls, **kw: Any) -> "SolverOptions":
        names = {f.name for f in fields(cls)}
        # convenient aliases
        aliases = {"mu": "initial_trust_region_radius", "trust_region_radius": "initial_trust_region_radius",
                   "min_diagonal": "min_lm_diagonal", "max_diagonal": "max_lm_diagonal"}
        out = {}
        for k, v in kw.items():
            k = aliases.get(k, k)
            if k not in names:
                raise TypeError(f"unknown solver option {k!r}; expected one of {sorted(names)}")
            out[k] = v
        return cls(**out)

    # -- resolved automatic settings -------------------------------------------------------
    @property
    def auto_forcing(self) -> bool:
        return self.pcg_tolerance is None

    def pcg_cap(self) -> int:
        return AUTO_PCG_MAX_ITERATIONS if self.pcg_max_iterations is None else int(self.pcg_max_iterations)

    def lm_q_tolerance(self) -> float | None:
        if self.q_tolerance is not None:
            return self.q_tolerance
        return None if self.auto_forcing else 1e-4

    def min_forcing(self, dtype) -> float:
        if self.forcing_min is not None:
            return self.forcing_min
        return 1e-4 if dtype.itemsize == 4 else 1e-8


def forcing_term(previous: float, grad_norm: float, prev_grad_norm: float, prev_linear_residual: float,
                 minimum: float) -> float:
    """Eisenstat-Walker choice 1 for the next PCG tolerance:
    ``eta = | ||g_k|| - ||g_{k-1} + J^T J s_{k-1}|| | / ||g_{k-1}||``: how well the linear
    model of the gradient predicted the new one (GN: the previous PCG's final residual; LM: the
    undamped model, since the damping is no part of the gradient's model, and measuring it
    kept eta near its cap on damped steps: a spring network crawled through 500 iterations);
    safeguard ``eta >= previous**1.618`` when that exceeds 0.1 (keeps eta from dropping too
    fast while the model is poor); clamped to
    ``[minimum, FORCING_MAX]``. For a linear problem the model is exact and eta falls to the
    minimum after one step, so the second step solves to full accuracy."""
    if not (prev_grad_norm > 0):
        return FORCING_INITIAL
    eta = abs(grad_norm - prev_linear_residual) / prev_grad_norm
    safeguard = previous ** FORCING_SAFEGUARD_EXPONENT
    if safeguard > 0.1:
        eta = max(eta, safeguard)
    return min(max(eta, minimum), FORCING_MAX)
