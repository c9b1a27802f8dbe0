"""h2mc: Hessian-Hamiltonian Monte Carlo (thesis ch. 6), many chains at once.

* :class:`Target`: a user log-target over ``[0, 1]^n`` with derivatives from core_ad.
* :func:`h2mc_proposal`: the H2MC Gaussian (closed-form Hamiltonian dynamics on the local
  quadratic model of log f, times the isotropic prior); :func:`dynamics_coefficients`.
* :class:`Sampler`: a mixture of kernels (:class:`LargeStep`, :class:`IsotropicStep`,
  :class:`H2MCStep`, and the baselines :func:`RandomWalk`, :class:`MALA`, :class:`HMC`) run on
  many chains as arrays.
* :class:`PathSpace`: light paths of an edge_rt scene as functions of primary samples, their
  contributions and the value / gradient / Hessian of log f* per path length.
* :func:`render_mlt`: primary-sample-space MLT on an edge_rt scene (PSSMLT with Kelemen small
  steps, or H2MC small steps), bootstrap normalisation, direct lighting from edge_rt.
* diagnostics: :func:`ess` (Geyer), histograms, :func:`write_png`.
"""

from ._ablation import (AE10_VARIANTS, AE11_VARIANTS, ae10_parameterization,
                        ae11_moving_caustics, plain_monte_carlo)
from ._consistency import AE8_KERNELS, ae8_consistency, mean_with_error, reference_with_error
from ._diagnostics import (
    HistogramAccumulator,
    autocovariance,
    chain_means_se,
    ess,
    histogram2d,
    integrated_autocorrelation_time,
    min_ess,
    rel_mse,
    total_variation,
)
from ._dynamics import OFFSET_VARIANTS, T_DEFAULT, dynamics_coefficients, dynamics_position
from ._kernels import HMC, MALA, H2MCStep, IsotropicStep, Kernel, LargeStep, RandomWalk
from ._mlt import (
    LARGE_STEPS,
    METHODS,
    BOOTSTRAP_SAMPLES,
    MIXING_STEPS,
    PARAMETERIZATIONS,
    SMALL_STEPS,
    Bootstrap,
    MLTError,
    MLTResult,
    MutationStats,
    bootstrap,
    kelemen_perturb,
    render_mlt,
)
from ._pathspace import HIT, LUMINANCE, NEE, Paths, PathSpace, PathSpaceError, luminance
from ._png import histogram_png, read_png_size, write_png
from ._proposal import (
    GaussianProposal,
    ImproperProposalError,
    h2mc_log_acceptance,
    h2mc_proposal,
    isotropic_proposal,
)
from ._sampler import ChainState, InvalidStateError, KernelStats, RunResult, Sampler
from ._target import NonSymmetricHessianError, Target, TargetShapeError
from . import toy  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "AE8_KERNELS",
    "ae8_consistency",
    "mean_with_error",
    "reference_with_error",
    "AE10_VARIANTS",
    "ae10_parameterization",
    "AE11_VARIANTS",
    "ae11_moving_caustics",
    "plain_monte_carlo",
    "Bootstrap",
    "MLTError",
    "MLTResult",
    "MutationStats",
    "LARGE_STEPS",
    "METHODS",
    "BOOTSTRAP_SAMPLES",
    "MIXING_STEPS",
    "SMALL_STEPS",
    "PARAMETERIZATIONS",
    "bootstrap",
    "kelemen_perturb",
    "rel_mse",
    "render_mlt",
    "ChainState",
    "GaussianProposal",
    "H2MCStep",
    "HMC",
    "HistogramAccumulator",
    "ImproperProposalError",
    "InvalidStateError",
    "IsotropicStep",
    "Kernel",
    "KernelStats",
    "HIT",
    "LUMINANCE",
    "LargeStep",
    "MALA",
    "NEE",
    "NonSymmetricHessianError",
    "OFFSET_VARIANTS",
    "PathSpace",
    "PathSpaceError",
    "Paths",
    "RandomWalk",
    "RunResult",
    "Sampler",
    "T_DEFAULT",
    "Target",
    "TargetShapeError",
    "autocovariance",
    "chain_means_se",
    "dynamics_coefficients",
    "dynamics_position",
    "ess",
    "h2mc_log_acceptance",
    "h2mc_proposal",
    "histogram2d",
    "histogram_png",
    "integrated_autocorrelation_time",
    "isotropic_proposal",
    "luminance",
    "min_ess",
    "read_png_size",
    "total_variation",
    "toy",
    "write_png",
]
