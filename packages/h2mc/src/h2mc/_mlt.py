"""Primary-sample-space Metropolis light transport on an edge_rt scene (spec 1.1-1.6).

Two chain states over the techniques ``t = (length, s)`` of :class:`~h2mc.PathSpace`:

* *Kelemen* (PSSMLT): the state is ``u``; its target is ``S(u) = sum_t f*_t(u)``, the
  luminance of the sum of all (MIS-weighted) techniques; large steps are fresh uniform ``u``
  with acceptance ``min(1, S_y / S_x)``.
* *multiplexed* (MMLT, Hachisuka et al. 2014; spec 1.4): the state is ``(u, t)``; its target
  is ``f*_t(u)``, the luminance of technique ``t``'s MIS-weighted contribution. Small steps
  keep ``t`` fixed. Large steps (fresh uniform ``u``):

  - ``"mmlt"``: the path length ``L`` from the pmf ``P_len`` of the bootstrap's per-length
    score sums, then ``s`` uniformly among ``L``'s ``n_tech(L)`` techniques; an independence
    proposal of probability ``P_len(L) / n_tech(L)``, so the acceptance is
    ``min(1, (n_tech(L_y) s_y / P_len(L_y)) / (n_tech(L_x) s_x / P_len(L_x)))``.
  - ``"resample"`` (the thesis' large step): all techniques of ``y`` are evaluated, ``t`` is
    picked with probability ``s_t / S_y`` (importance resampling), an independence proposal
    of density ``s_t(y) / S_y``, so the exact MH acceptance is ``min(1, S_y / S_x)``. The
    reference renderer cannot evaluate ``S_x`` after small steps and uses
    ``min(1, s_y (s_last / S_last) / (s_x (s_y / S_y)))`` with the last accepted large-step
    state's ``(s_last, S_last)``; that equals ``S_y / S_x`` while the chain sits on that state
    but is not detailed-balanced once small steps moved it (an exact stationary computation on
    a 4-state example is 11% off the target; tests/test_mlt.py). ``PathSpace.trace``
    evaluates every technique of every state, so ``S_x`` is known here and the exact ratio
    costs nothing.

Small steps: ``"kelemen"``, Kelemen et al.'s symmetric exponential perturbation of every
coordinate, offsets in ``[s1, s2]`` with density ~ 1/offset, wrapped; ``"isotropic"``, the
reference renderer's isotropic Gaussian ``N(0, sigma2 I)`` on every coordinate, wrapped (both
symmetric, spec 1.6 perturbStdDev); ``"h2mc"``, the H2MC
Gaussian from the gradient and Hessian of log f* at the state (h2mc_proposal; on a
multiplexed state of ``log f*_t`` over the technique's coordinates, the others held), with
probability ``uniform_mixing`` replaced by the ``mixing_step`` (spec 4.7 rule 4: the isotropic
Gaussian, of variance ``mixing_sigma2``; ``"kelemen"``: Kelemen's); the Gaussian is
cached with the state, so an H2MC step costs one value + gradient + Hessian evaluation, at the
proposal. Methods: ``"pssmlt"`` = Kelemen state, Kelemen small steps; ``"mmlt"`` = multiplexed
state, Kelemen small steps, MMLT large step; ``"h2mc"`` = multiplexed state, H2MC small steps,
resampling large step (``small_step`` / ``large_step`` override a method's choice).

Normalisation ``b = E[S(u)]`` over uniform ``u`` from a bootstrap of independent samples;
the multiplexed target ``f*_t`` integrates (summed over ``t``) to the same ``b``. The bootstrap
also seeds the chains by systematic resampling in proportion to ``S`` (Kelemen) or to the
per-technique scores (multiplexed) (spec 1.5; Veach's start-up bias fix). Splatting by
expected values: every step adds the current state with weight ``1 - a`` and the proposal with
weight ``a``, each as ``rgb_t * b / f*_t`` into its pixel; a resampling large step's proposal
is splatted as the expectation over its technique choice, ``sum_k (s_k / S_y) rgb_k b / s_k =
rgb(y) b / S_y`` (all its techniques, spec 1.4 step 4; ``a`` does not depend on the choice).
The image is scaled by ``pixels / (steps * chains)``. Paths shorter than ``min_length``
(direct lighting, and emitters seen directly) come from edge_rt's path tracer (spec 1.5).

The technique's Gibbs step (``technique_gibbs``; not in the spec, whose small steps keep the
technique): the state's point ``u`` keeps its place and ``t`` is drawn with probability
``f*_t(u) / S(u)``, the target's conditional of ``t`` given ``u``, from the scores
``PathSpace.trace`` has already evaluated: an exact move that costs no trace and lets a chain
change technique without a large step. Kelemen's coordinates only: in the modified ones a
chain's ``w`` holds directions for its technique's vertices, and a technique that uses fewer
of them would need the BSDF sampling inverted to rebuild its numbers. It pays with MMLT's
large step only: the resampling large step already draws ``t`` from the scores, and with it
the Gibbs step was measured to change nothing (h2mc README), so H2MC does without it.

The technique swap (``technique_swap``; not in the spec) is that move where the modified
coordinates allow it: with light coordinates, a HIT state's last bounce numbers are the light
sample it aims at, and the NEE state of the same length whose light sample numbers are those
traces the same path at the same density in ``w`` (``PathSpace.swap_technique``: the two
triples exchanged, an involution of unit Jacobian). Taken in place of a small step, the
swapped state is traced with the other proposals and accepted with ``f*_w`` ratios, which are
the ratio of the two techniques' MIS weights at the path; the H2MC Gaussian of an accepted
swap is computed at its new technique with the other moved chains'.

Coordinates (``parameterization``, spec 5.1-5.2): ``"kelemen"``, every step in primary sample
space; ``"modified"`` (multiplexed states only), the chain state is in the modified coordinates
``w`` of its technique (PathSpace's absolute spherical directions on vertices rougher than
``roughness_threshold``). Small steps (H2MC and Kelemen's isotropic perturbation alike) move
``w`` with MH ratios of ``f*_w = f*_PSS |det du/dw|`` and H2MC derivatives of ``log f*_w``; a
large step samples ``u`` as before, picks its technique, converts it to ``w``
(``PathSpace.to_modified``, whose proposal density in ``w`` is the Jacobian, so the MH ratio is
the PSS one) and is accepted with the ``f*_PSS`` ratios above; splat weights use ``f*_PSS``.

Time (``time_mode``, spec 5.1; scenes with moving meshes, PathSpace's first coordinate):
``"hessian"`` (the thesis) keeps time in the H2MC Gaussian with its correlations to the other
coordinates (static paths have no time derivatives, so their time takes the prior's kick);
``"independent"`` (AE-11's ablation) drops time from every H2MC Gaussian, so it is perturbed
by the prior's isotropic kick alone; PSSMLT / MMLT treat it as one more primary sample. Direct
lighting in a moving scene needs ``min_length=2`` (edge_rt's path tracer renders no motion
blur): the emitters seen directly are then traced here at random shutter times.

The H2 lens perturbation (spec 1.3, 5.3; H2MC small steps in the modified coordinates, with
probability ``lens_perturb_prob`` within the H2MC step): Veach's lens perturbation with the
2D screen position as the H2MC variable. The chain's reconnection vertex ``j`` is its first
vertex in absolute coordinates (``PathSpace.lens_vertex``; 0, lensScore = 0, where vertex
``j + 1``'s own direction is not fixed in world space: the step then is the ordinary small
step, counted as ``skipped``). The step keeps vertex ``j + 1`` (by area) and every other
coordinate fixed and moves the screen position by the H2MC Gaussian of ``log lensScore``
(prior variance ``lens_sigma2``), aiming vertex ``j`` at the fixed vertex; lensScore is the
target in those variables, ``f*_w |d omega_j / dA_{j+1}|`` (``PathSpace.lens_derivatives``:
the reconnection BSDF, its pdf and the ``cos / d^2`` geometry term change with the screen
position), so the acceptance is ``min(1, lensScore_y Phi_y(-z) / (lensScore_x Phi_x(z)))``;
a proposal whose traced path misses the fixed vertex (an occluder, another structure before
``j``) or loses its reconnection vertex is rejected. Because the small step
is picked with probability ``1 - p [lensScore > 0]``, its acceptance carries that
probability's ratio between ``y`` and ``x`` (the reference renderer leaves it out).

A non-finite contribution is a counted rejection (PathSpace voids the state; ``nonfinite``
counts it), never a NaN pixel.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import edge_rt

from ._kernels import _wrap
from ._pathspace import PathSpace, luminance
from ._proposal import GaussianProposal, h2mc_proposal, isotropic_proposal

SMALL_STEPS = ("kelemen", "isotropic", "h2mc")
MIXING_STEPS = ("isotropic", "kelemen")  # H2MC's uniform-mixing step (spec 1.6: isotropic)
TIME_MODES = ("hessian", "independent")
PARAMETERIZATIONS = ("kelemen", "modified")
LARGE_STEPS = ("uniform", "mmlt", "resample")
METHODS = {"pssmlt": ("kelemen", "uniform"), "mmlt": ("kelemen", "mmlt"),
           "h2mc": ("h2mc", "resample")}  # method -> (small step, large step)
# Share of the MMLT length pmf spread evenly over the lengths: a length whose bootstrap
# scores are all zero would otherwise never be proposed (its light lost).
LENGTH_FLOOR = 0.01
# The bootstrap's independent samples (b and the chains' seeds) by default: as many as the
# run's mutations within [BOOTSTRAP_MIN, BOOTSTRAP_SAMPLES]; a time budget draws up to
# BOOTSTRAP_SAMPLES while they take less than BOOTSTRAP_SHARE of it. At 2^16 a seed on a
# rare bright path (one state with ~2% of b) seeds a dozen chains that stay there for the
# whole run; 2^20 cut AE-9's median relMSE 1.2-2.3x for every method (h2mc README).
BOOTSTRAP_MIN, BOOTSTRAP_SAMPLES, BOOTSTRAP_SHARE = 1 << 16, 1 << 20, 0.05
# The Kelemen state's H2MC Gaussian is of log S, S = sum_t f*_t: a technique carrying less than
# this share of S at the state is left out of its derivatives (a deterministic function of the
# state, so the proposal stays exact). At most states one or two techniques carry S; leaving
# the rest out spares their Hessian kernels and shrinks the eigen-decomposition to those
# techniques' dimensions (h2mc README: 1.9-3.2x the mutations per second on the ring).
KELEMEN_MIN_SHARE = 1e-2
# sigma2="auto": the H2MC prior variances tried by pilot runs (1e-5 .. 1e-2 by sqrt(10)),
# smallest first; the largest whose small steps are accepted at least AUTO_SIGMA2_ACCEPTANCE
# of the time is kept (hand-tuned values: ring 1e-3 at 0.52, torus 1e-4 at 0.49; 2x / 10x
# those values fall to 0.43 / 0.26); AUTO_SIGMA2_PILOT: chains, steps and bootstrap samples
# of each pilot run
AUTO_SIGMA2 = (1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2)
AUTO_SIGMA2_ACCEPTANCE = 0.45
AUTO_SIGMA2_PILOT = (256, 4, 1 << 12)


class MLTError(ValueError):
    """Bad arguments, or a scene whose paths carry no light (b = 0)."""


def kelemen_perturb(u, rng, s1=1.0 / 1024, s2=1.0 / 64):
    """Kelemen's small step on every coordinate: ``u +- s2 exp(-log(s2 / s1) r)``, wrapped
    into ``[0, 1)``. Symmetric, so it adds nothing to the acceptance ratio."""
    r = rng.random(u.shape)
    dv = s2 * np.exp(-np.log(s2 / s1) * r)
    return _wrap(u + np.where(rng.random(u.shape) < 0.5, dv, -dv))


def _systematic(weights, n, rng):
    """``n`` indices by systematic (equal-spaced) resampling in proportion to ``weights``
    (Veach, p. 340)."""
    cdf = np.cumsum(weights)
    picks = (np.arange(n) + rng.random()) / n * cdf[-1]
    return np.minimum(np.searchsorted(cdf, picks, side="right"), len(cdf) - 1)


@dataclass
class Bootstrap:
    """The bootstrap's ``n`` independent uniform states (spec 1.5): ``b``, the mean of
    ``S = sum_t f*_t`` over them, and its standard error ``b_error``; the (state, technique)
    pairs that carry light, ``pairs`` (flat indices ``state * T + t``, ascending) with their
    scores ``scores``; the techniques' ``(length, s)`` keys; ``states(i)``, the states of
    indices ``i`` as an ``(m, dim)`` array. :func:`bootstrap` regenerates them from their
    batch's random generator, as the reference renderer replays a seed's RNG checkpoint: no
    ``(n, dim)`` array is kept, so millions of states cost memory for their lit pairs only."""

    b: float
    b_error: float
    n: int
    pairs: np.ndarray
    scores: np.ndarray
    techniques: list
    states: Callable[[np.ndarray], np.ndarray]

    @classmethod
    def of(cls, u, scores, techniques):
        """The bootstrap of the states ``u`` (n, dim) with per-technique scores (n, T)."""
        u, scores = np.asarray(u), np.asarray(scores, np.float64)
        S = scores.sum(1)
        pairs = np.flatnonzero(scores > 0)
        if not len(pairs):
            raise MLTError(f"Bootstrap.of: none of {len(S)} states carries light")
        return cls(float(S.mean()), float(S.std() / np.sqrt(len(S))), len(S), pairs,
                   scores.ravel()[pairs], list(techniques), lambda i: u[i])

    def seeds(self, n, rng):
        """``n`` Kelemen states by systematic resampling in proportion to S. A state's pairs
        are adjacent, so resampling the pairs picks each state as resampling S would."""
        return self.states(self.pairs[_systematic(self.scores, n, rng)] // len(self.techniques))

    def technique_seeds(self, n, rng):
        """``n`` multiplexed states ``(u (n, dim), t (n,))`` by systematic resampling in
        proportion to each (state, technique) score."""
        pairs = self.pairs[_systematic(self.scores, n, rng)]
        T = len(self.techniques)
        return self.states(pairs // T), pairs % T

    def technique_pmf(self):
        """Probability of each technique under the MMLT large step, (T,): ``P_len(L) /
        n_tech(L)``, ``P_len`` the bootstrap's per-length score sums (normalised), with
        ``LENGTH_FLOOR`` of the mass spread evenly over the lengths."""
        T = len(self.techniques)
        lengths = np.array([k for k, _ in self.techniques])
        sums = np.bincount(self.pairs % T, self.scores, minlength=T)
        per_length = {k: sums[lengths == k].sum() for k in np.unique(lengths)}
        total = sum(per_length.values())
        p_len = {k: (1 - LENGTH_FLOOR) * v / total + LENGTH_FLOOR / len(per_length)
                 for k, v in per_length.items()}
        return np.array([p_len[k] / (lengths == k).sum() for k in lengths])


def bootstrap(path_space, n, rng, batch=8192, enough=None):
    """The :class:`Bootstrap` of ``n`` independent uniform states, traced ``batch`` at a time,
    each batch from its own generator (raises :class:`MLTError` when none carries light);
    ``enough(drawn)``, called after each batch, stops it early when true (``n`` is then the
    states drawn)."""
    n, batch = int(n), int(batch)
    if n < 1:
        raise MLTError(f"bootstrap: need at least one sample, got {n}")
    T, dim = len(path_space.techniques), path_space.dim
    keys = rng.integers(0, 2**63, size=-(-n // batch))

    def batch_states(k):
        return np.random.default_rng(keys[k]).random((min(batch, n - k * batch), dim))

    def states(i):
        i = np.asarray(i, np.int64)
        out = np.empty((len(i), dim))
        for k in np.unique(i // batch):
            sel = np.flatnonzero(i // batch == k)
            out[sel] = batch_states(k)[i[sel] - k * batch]
        return out

    pairs, scores, s1, s2, drawn = [], [], 0.0, 0.0, 0
    for k in range(len(keys)):
        if drawn and enough is not None and enough(drawn):
            break
        sc = path_space.trace(batch_states(k)).scores
        drawn += len(sc)
        S = sc.sum(1)
        s1, s2 = s1 + S.sum(), s2 + S @ S
        lit = np.flatnonzero(sc > 0)
        pairs.append(k * batch * T + lit)
        scores.append(sc.ravel()[lit])
    pairs, scores = np.concatenate(pairs), np.concatenate(scores)
    if not len(pairs):
        raise MLTError(f"bootstrap: none of {drawn} paths of lengths {path_space.min_length}.."
                       f"{path_space.max_length} carries light (b = 0); raise the sample "
                       "count or check the scene's lights")
    b = s1 / drawn
    b_error = float(np.sqrt(max(s2 / drawn - b * b, 0.0) / drawn))
    return Bootstrap(b, b_error, drawn, pairs, scores, list(path_space.techniques), states)


@dataclass
class MutationStats:
    """``skipped``: steps that picked this mutation but could not attempt it (the lens
    perturbation on a state whose lensScore is 0; they took the H2MC small step)."""

    proposed: int = 0
    accepted: int = 0
    skipped: int = 0

    @property
    def acceptance(self):
        return self.accepted / self.proposed if self.proposed else float("nan")


@dataclass
class MLTResult:
    """``image`` = ``indirect`` (the chains) + ``direct`` (edge_rt, or zeros), (H, W, 3)
    float64; ``snapshots``: mutations per pixel -> indirect image at that point; ``seconds``:
    wall time of the bootstrap and the chains (not of the direct lighting, nor of
    ``build_seconds``, the kernels built on first use during the render); ``nonfinite``:
    proposals rejected because their contribution was NaN / inf; ``stats``: per mutation type
    ("large", "small" and, with H2MC small steps, "isotropic" for the uniform mixing and, with
    the lens perturbation, "lens")."""

    image: np.ndarray
    indirect: np.ndarray
    direct: np.ndarray
    b: float
    mutations: int
    seconds: float
    stats: dict
    nonfinite: int
    snapshots: dict = field(default_factory=dict)
    build_seconds: float = 0.0
    sigma2: float = None  # the prior variance used ("auto": the pilot's choice)
    pilot: dict = None  # sigma2="auto": small-step acceptance per sigma2 tried

    @property
    def mutations_per_second(self):
        return self.mutations / self.seconds if self.seconds > 0 else float("nan")


def render_mlt(scene, mutations_per_pixel=64, *, method="pssmlt", small_step=None,
               large_step=None, max_length=3, min_length=3, chains=256, large_step_prob=0.3,
               s1=1.0 / 1024, s2=1.0 / 64, sigma2=1e-4, uniform_mixing=0.2,
               mixing_step="isotropic", mixing_sigma2=None,
               bootstrap_samples=None, direct_spp=16, seed=0, checkpoints=(),
               path_space=None, progress=None, parameterization="kelemen",
               roughness_threshold=0.03, time_mode="hessian", lens_perturb_prob=0.3,
               lens_sigma2=1e-4, light_coordinates=None, technique_gibbs=0.0, technique_swap=0.0,
               seconds=None, clock=time.perf_counter, bidirectional=None):
    """Render ``scene`` (an edge_rt Scene) by ``method`` (``"pssmlt"``, ``"mmlt"`` or
    ``"h2mc"``, module docstring); ``small_step`` (``"kelemen"`` / ``"h2mc"``) and
    ``large_step`` (``"uniform"`` = Kelemen state, ``"mmlt"`` / ``"resample"`` = multiplexed
    state) override the method's; ``"isotropic"`` small steps use ``sigma2`` too. H2MC small
    steps use the prior *variance* ``sigma2``: the default is the reference renderer's sigma =
    0.01; tune it for 50-70% small-step acceptance, 1e-3 on the Cornell box, or give
    ``"auto"``: short pilot runs pick it (:func:`_pilot_sigma2`, charged to the budget;
    ``MLTResult.sigma2`` and ``.pilot`` report it). Within H2MC small
    steps, with probability ``uniform_mixing``, the ``mixing_step``: ``"isotropic"`` (spec 1.6,
    the reference renderer's Gaussian of variance ``mixing_sigma2``, None: ``sigma2``, as the
    reference renderer's one std-dev) or ``"kelemen"``.

    ``mutations_per_pixel``: total mutations = this x pixels, split over ``chains``;
    ``checkpoints``: mutations-per-pixel values at which to keep a copy of the indirect image;
    ``bootstrap_samples``: the bootstrap's independent samples (b and the chains' seeds);
    None: as many as the mutations within [BOOTSTRAP_MIN, BOOTSTRAP_SAMPLES] (2^16, 2^20),
    under a ``seconds`` budget up to BOOTSTRAP_SAMPLES while they take less than
    BOOTSTRAP_SHARE (5%) of it;
    ``direct_spp``: samples per pixel of edge_rt's path tracer for paths shorter than
    ``min_length`` (0: leave them out); ``path_space``: a prebuilt :class:`PathSpace` of the
    scene (its kernels are compiled once; its lengths replace ``max_length`` / ``min_length``);
    ``progress``: called with the number of mutations done so far after every step;
    ``parameterization``: ``"kelemen"`` or ``"modified"`` (module docstring; the thesis' H2MC
    uses the modified one, the default stays PSS), with ``roughness_threshold`` (spec 1.6:
    0.03, 0.01 on the torus scene; a given ``path_space`` must have been built with it);
    ``time_mode``: ``"hessian"`` or ``"independent"`` (module docstring; scenes with moving
    meshes only); ``lens_perturb_prob``: within an H2MC small step in the modified
    coordinates, the probability of the H2 lens perturbation (module docstring; spec 1.6:
    0.3, 0 disables; ignored with Kelemen coordinates, which have no absolute vertex) with
    prior variance ``lens_sigma2`` in screen units (spec: sigma 0.01);
    ``light_coordinates``: in the modified coordinates, the last direction of a path that hits
    the light as a point on it (spec 5.1 (ii), PathSpace's ``light_coordinates``); None: the
    given path_space's choice, or True (the spec's default) when render_mlt builds it;
    ``technique_gibbs``: after each step, the probability that a chain of a multiplexed state
    draws its technique anew given its point (module docstring; 0, the spec's: never), in
    Kelemen's coordinates and with Kelemen or isotropic small steps;
    ``technique_swap``: in the modified coordinates with light coordinates, the probability
    that a chain whose technique hits the light or samples it (HIT / NEE, ``s = 0, 1``) takes
    the technique swap (module docstring) instead of a small step (0: never);
    ``bidirectional``: when render_mlt builds the path space, every BDPT technique ``s = 0 ..
    k`` of a path of ``k`` segments (light subpaths, PathSpace's ``bidirectional``;
    rough glass included) instead of the two unidirectional ones; None:
    the given path_space's choice, or False;
    ``seconds``: a wall-clock budget (bootstrap included): the chains take steps until it is
    spent, ``mutations_per_pixel`` then being a cap (``np.inf``: none). One run of long
    chains, not several restarted ones: short chains are the start-up error on caustic scenes
    (a seed on a rare bright path stays there for its whole life). ``clock``: the clock of
    ``seconds`` and of ``MLTResult.seconds`` (``time.process_time``: CPU time, for equal-time
    comparisons on a machine shared with other work).
    """
    if method not in METHODS:
        raise MLTError(f"render_mlt: method must be one of {tuple(METHODS)}, got {method!r}")
    small_step = METHODS[method][0] if small_step is None else small_step
    large_step = METHODS[method][1] if large_step is None else large_step
    if small_step not in SMALL_STEPS:
        raise MLTError(f"render_mlt: small_step must be one of {SMALL_STEPS}, got "
                       f"{small_step!r}")
    if large_step not in LARGE_STEPS:
        raise MLTError(f"render_mlt: large_step must be one of {LARGE_STEPS}, got "
                       f"{large_step!r}")
    if not 0.0 <= large_step_prob <= 1.0 or not 0.0 <= uniform_mixing <= 1.0:
        raise MLTError("render_mlt: large_step_prob and uniform_mixing must be in [0, 1]")
    if not 0.0 <= technique_gibbs <= 1.0:
        raise MLTError(f"render_mlt: technique_gibbs must be in [0, 1], got {technique_gibbs!r}")
    if not 0.0 <= technique_swap <= 1.0:
        raise MLTError(f"render_mlt: technique_swap must be in [0, 1], got {technique_swap!r}")
    if mixing_step not in MIXING_STEPS:
        raise MLTError(f"render_mlt: mixing_step must be one of {MIXING_STEPS}, got "
                       f"{mixing_step!r}")
    auto = isinstance(sigma2, str)
    if auto and (sigma2 != "auto" or small_step != "h2mc"):
        raise MLTError(f"render_mlt: sigma2 must be a variance, or 'auto' with H2MC small "
                       f"steps, got {sigma2!r} with small_step {small_step!r}")
    if not auto and mixing_sigma2 is None:
        mixing_sigma2 = sigma2
    if mixing_sigma2 is not None and not 0.0 < mixing_sigma2 < np.inf:
        raise MLTError(f"render_mlt: mixing_sigma2 (a variance) must be positive and finite, "
                       f"got {mixing_sigma2!r}")
    if not 0.0 < s1 < s2 < 0.5:
        raise MLTError(f"render_mlt: need 0 < s1 < s2 < 0.5, got s1={s1}, s2={s2}")
    if int(chains) < 1 or not mutations_per_pixel > 0:
        raise MLTError("render_mlt: chains and mutations_per_pixel must be positive")
    if seconds is None and not np.isfinite(mutations_per_pixel):
        raise MLTError("render_mlt: an unbounded mutations_per_pixel needs a seconds budget")
    if seconds is not None and not 0.0 < seconds < np.inf:
        raise MLTError(f"render_mlt: seconds must be positive and finite, got {seconds!r}")
    if parameterization not in PARAMETERIZATIONS:
        raise MLTError(f"render_mlt: parameterization must be one of {PARAMETERIZATIONS}, "
                       f"got {parameterization!r}")
    if time_mode not in TIME_MODES:
        raise MLTError(f"render_mlt: time_mode must be one of {TIME_MODES}, got {time_mode!r}")
    if not 0.0 <= lens_perturb_prob <= 1.0:
        raise MLTError(f"render_mlt: lens_perturb_prob must be in [0, 1], got "
                       f"{lens_perturb_prob!r}")
    if not 0.0 < lens_sigma2 < np.inf:
        raise MLTError(f"render_mlt: lens_sigma2 (a variance) must be positive and finite, got "
                       f"{lens_sigma2!r}")
    if not roughness_threshold >= 0.0:
        raise MLTError(f"render_mlt: roughness_threshold must be >= 0, got "
                       f"{roughness_threshold!r}")
    modified = parameterization == "modified"
    if technique_gibbs > 0 and (large_step == "uniform" or modified or small_step == "h2mc"):
        raise MLTError("render_mlt: technique_gibbs needs a multiplexed state (large_step 'mmlt' "
                       "or 'resample') in Kelemen's coordinates with Kelemen or isotropic small "
                       "steps: a modified-coordinate state cannot be rebuilt for a technique "
                       "that uses fewer vertices, and an H2MC Gaussian belongs to its technique")
    if modified and large_step == "uniform":
        raise MLTError("render_mlt: the modified parameterization needs a multiplexed state "
                       "(large_step 'mmlt' or 'resample'): its coordinates are a technique's")
    if light_coordinates and not modified:
        raise MLTError("render_mlt: light_coordinates are part of the modified "
                       "parameterization (parameterization='modified')")
    ps = path_space or PathSpace(
        scene, max_length=max_length, min_length=min_length,
        roughness_threshold=roughness_threshold if modified else None,
        light_coordinates=modified and light_coordinates is not False,
        bidirectional=bool(bidirectional))
    if bidirectional is not None and ps.bidirectional != bool(bidirectional):
        raise MLTError(f"render_mlt: path_space has bidirectional {ps.bidirectional}, not "
                       f"{bool(bidirectional)}")
    if path_space is not None and path_space.scene is not scene:
        raise MLTError("render_mlt: path_space was built for another scene")
    if scene.moving_meshes and direct_spp and ps.min_length > 2:
        raise MLTError("render_mlt: edge_rt's path tracer renders no motion blur, so the direct "
                       "lighting of a scene with moving meshes needs min_length=2 (or "
                       "direct_spp=0)")
    if technique_swap > 0 and not (modified and ps.light_coordinates):
        raise MLTError("render_mlt: technique_swap needs the modified parameterization with "
                       "light coordinates (it exchanges a HIT state's light-coordinate numbers "
                       "with a NEE state's light sample)")
    if light_coordinates is not None and ps.light_coordinates != bool(light_coordinates):
        raise MLTError(f"render_mlt: path_space has light_coordinates "
                       f"{ps.light_coordinates}, not {light_coordinates}")
    if modified and ps.roughness_threshold != roughness_threshold:
        raise MLTError(f"render_mlt: path_space has roughness_threshold "
                       f"{ps.roughness_threshold!r}, not {roughness_threshold!r}")
    seed = tuple(np.atleast_1d(seed).tolist())
    rng = np.random.default_rng([*seed, 0x6D6C74])
    w, h = ps.width, ps.height
    npix = w * h
    # kernels built on first use (a specialised path space's Hessians, PathSpace) are not
    # charged to the budget, as those compile_kernels builds before it
    ps.clock, built = clock, ps.build_seconds
    t0 = clock()

    def spent():
        return clock() - t0 - (ps.build_seconds - built)

    enough = None
    if bootstrap_samples is None:
        total = mutations_per_pixel * npix  # inf: a time budget without a cap
        bootstrap_samples = int(np.clip(total, BOOTSTRAP_MIN, BOOTSTRAP_SAMPLES))
        if seconds is not None:
            def enough(drawn):
                return drawn >= BOOTSTRAP_MIN and spent() >= BOOTSTRAP_SHARE * seconds
    boot = bootstrap(ps, bootstrap_samples, rng, enough=enough)
    pilot = None
    if auto:  # after the bootstrap (whose share of a budget it would eat), charged to it
        sigma2, pilot = _pilot_sigma2(scene, ps, seed, dict(
            large_step=large_step, parameterization=parameterization,
            roughness_threshold=roughness_threshold, time_mode=time_mode, clock=clock))
        mixing_sigma2 = sigma2 if mixing_sigma2 is None else mixing_sigma2
    C = int(chains)
    steps = (int(np.ceil(mutations_per_pixel * npix / C)) if np.isfinite(mutations_per_pixel)
             else np.iinfo(np.int64).max)
    checkpoints = {int(np.ceil(m * npix / C)): m for m in checkpoints}

    multiplexed = large_step != "uniform"
    if multiplexed:
        x, t = boot.technique_seeds(C, rng)
    else:
        x, t = boot.seeds(C, rng), np.zeros(C, np.int64)  # t: the Gaussians' group below
    pmf = boot.technique_pmf() if large_step == "mmlt" else None
    if modified:
        x = ps.to_modified(x, ps.trace(x), t, rng)
    px = ps.trace(x, coords=t if modified else None)
    rgb, f, fw = _target(px, t if multiplexed else None)
    for _ in range(8 if modified else 0):
        # a seed whose path the modified coordinates do not reproduce (the ray to a
        # light-coordinate point misses it) has f = 0 there: a chain must start where f > 0
        bad = np.flatnonzero(~((f > 0) & (fw > 0)))
        if not len(bad):
            break
        xb, t[bad] = boot.technique_seeds(len(bad), rng)
        x[bad] = ps.to_modified(xb, ps.trace(xb), t[bad], rng)
        px = ps.trace(x, coords=t)
        rgb, f, fw = _target(px, t)
    if modified and not ((f > 0) & (fw > 0)).all():
        raise MLTError(f"render_mlt: {int((~((f > 0) & (fw > 0))).sum())} chain seeds have no "
                       "contribution in the modified coordinates after 8 draws")
    state = _Chains(x, t, rgb, f, fw, px.f_star, px.pixel, px.contrib.copy(),
                    None if px.pixels is None else px.pixels.copy())
    # light tracing's techniques (bidirectional t = 1) splat into the pixel their path
    # meets the camera in, not the state's screen position
    elsewhere = [i for i, (k, s) in enumerate(ps.techniques) if s == k]
    use_h2mc = small_step == "h2mc"
    if use_h2mc:
        gauss = _Gaussians(ps, multiplexed, sigma2, C,
                           time_in_hessian=time_mode == "hessian")
        gauss.update(x, px, np.arange(C), t)
    stats = {"large": MutationStats(), "small": MutationStats()}
    if use_h2mc:
        stats["isotropic"] = MutationStats()
    lens = _Lens(ps, px, t, lens_sigma2, lens_perturb_prob) if (
        use_h2mc and modified and lens_perturb_prob > 0) else None
    if lens is not None:
        stats["lens"] = MutationStats()
    if technique_gibbs > 0:
        stats["technique"] = MutationStats()  # "accepted": the draws that changed it
    swappable = ps.swap_partner(np.arange(len(ps.techniques))) >= 0
    if technique_swap > 0:
        stats["swap"] = MutationStats()
    accum = np.zeros((npix, 3))
    nonfinite = 0
    snapshots = {}
    lanes_all = np.arange(C)

    def draw_large():  # the chains taking a large step, and its uniform states
        large = rng.random(C) < large_step_prob
        return large, rng.random((int(large.sum()), ps.dim))

    # modified coordinates: a large step's u is traced (in PSS) before its technique's w. The
    # draws are independent of the chains, so the next step's are traced one step early,
    # beside this step's proposals: one trace call per step instead of two (a call of 1024
    # lanes costs little more than one of 300).
    next_large = None
    step = 0
    # at least one step, whatever the budget: the image needs a mutation
    while step < steps and (seconds is None or step == 0 or spent() < seconds):
        step += 1
        if next_large is None:
            large, u_large = draw_large()
            pu = ps.trace(u_large) if modified and len(u_large) else None
        else:
            large, u_large, pu = next_large
        swap = np.zeros(C, bool)
        if technique_swap > 0:  # in place of a small step, where the technique has a partner
            swap = ~large & swappable[state.t] & (rng.random(C) < technique_swap)
        iso = ~large & ~swap & (rng.random(C) < uniform_mixing) if use_h2mc else ~large & ~swap
        h2 = ~large & ~iso & ~swap
        on_lens = np.zeros(C, bool)
        if lens is not None:  # within the H2MC step: the lens perturbation if lensScore > 0
            chose = h2 & (rng.random(C) < lens.prob)
            on_lens = chose & (lens.j > 0)
            stats["lens"].skipped += int((chose & ~on_lens).sum())
            h2 &= ~on_lens
        y = state.x.copy()  # an H2MC step on a technique moves only that technique's dims
        y[large] = u_large
        if small_step == "isotropic" or (use_h2mc and mixing_step == "isotropic"):
            std = np.sqrt(mixing_sigma2 if use_h2mc else sigma2)
            y[iso] = _wrap(state.x[iso] + std * rng.standard_normal((int(iso.sum()), ps.dim)))
        else:
            y[iso] = kelemen_perturb(state.x[iso], rng, s1, s2)
        ty = state.t.copy()
        if swap.any():
            y[swap], ty[swap] = ps.swap_technique(state.x[swap], state.t[swap])
        if pmf is not None:
            ty[large] = rng.choice(len(pmf), size=int(large.sum()), p=pmf)
        pending = gauss.propose(state, h2, y, rng) if h2.any() else []
        lens_pending = lens.propose(state, on_lens, y, rng) if on_lens.any() else None
        resampled = large if large_step == "resample" else np.zeros(C, bool)
        lost = np.zeros(0, np.int64)
        if modified and large.any():  # large steps: sample u, pick t, go to t's coordinates
            lanes = lanes_all[large]
            if large_step == "resample":
                ty[lanes] = _pick(pu.scores, rng)
            y[lanes] = ps.to_modified(y[lanes], pu, ty[lanes], rng)
            # u without a path of t is rejected, as in PSS: its w (a light coordinate aims at
            # the light) may have one, of another proposal density
            lost = lanes[pu.scores[np.arange(len(lanes)), ty[lanes]] <= 0]
        if modified:
            next_draws = draw_large()
            n_next = len(next_draws[1])
            both = ps.trace(np.concatenate([y, next_draws[1]]),
                            coords=np.concatenate([ty, np.full(n_next, -1)]))
            py = both.lane_range(0, C)
            next_large = (*next_draws, both.lane_range(C, C + n_next))
        else:
            py = ps.trace(y)
        nonfinite += int(py.nonfinite.sum())
        if resampled.any() and not modified:
            ty[resampled] = _pick(py.scores[resampled], rng)
        rgb_y, fy, fwy = _target(py, ty if multiplexed else None)
        fy[lost], fwy[lost] = 0.0, 0.0
        S_y = py.f_star
        with np.errstate(divide="ignore", invalid="ignore"):
            # small steps: f*_w (= f*_PSS in PSS coordinates); large steps: f*_PSS
            log_a = np.where(large, np.log(fy) - np.log(state.f),
                             np.log(fwy) - np.log(state.fw))
            if pmf is not None:
                log_a[large] += np.log(pmf[state.t[large]] / pmf[ty[large]])
            log_a[resampled] = np.log(S_y[resampled]) - np.log(state.S[resampled])
        if lens is not None:
            j_y = ps.lens_vertex(py, ty)
            # the small step is picked with probability 1 - p [lensScore > 0]: its ratio
            # between y and x keeps the mixture detailed-balanced
            with np.errstate(divide="ignore"):
                log_a[h2] += (np.log1p(-lens.prob * (j_y[h2] > 0))
                              - np.log1p(-lens.prob * (lens.j[h2] > 0)))
            if lens_pending is not None:
                lens.at_proposal(y, py, ty, j_y, lens_pending, log_a)
        draw = rng.random(C)  # accepted where draw < a
        if use_h2mc:
            # a large / isotropic / lens move's acceptance is known before the H2MC ratios:
            # the chains it moves get their Gaussians at the new state in the same kernel
            # calls as the H2MC proposals' (the Gaussians are needed at accepted states only)
            moved = ~h2 & (draw < _acceptance(log_a, fy, fwy))
            gauss.at_proposals(y, py, ty, pending, lanes_all[moved], log_a)
        a = _acceptance(log_a, fy, fwy)
        _splat_paths(accum, (1.0 - a) / state.f, state.rgb, state.pixel, state.pixels,
                     state.contrib, state.t if multiplexed else None, elsewhere)
        # a resampling large step's proposal: the expectation over its technique choice
        prop_rgb = np.where(resampled[:, None], py.rgb, rgb_y)
        prop_f = np.where(resampled, S_y, fy)
        live = a > 0
        _splat_paths(accum, a[live] / prop_f[live], prop_rgb[live], py.pixel[live],
                     None if py.pixels is None else py.pixels[live], py.contrib[live],
                     np.where(resampled, -1, ty)[live] if multiplexed else None, elsewhere)
        accept = draw < a
        for name, sel in (("large", large), ("small", h2 if use_h2mc else iso),
                          ("isotropic", iso if use_h2mc else None),
                          ("lens", on_lens if lens is not None else None),
                          ("swap", swap if technique_swap > 0 else None)):
            if sel is not None:
                stats[name].proposed += int(sel.sum())
                stats[name].accepted += int((accept & sel).sum())
        state.x[accept], state.t[accept], state.rgb[accept] = y[accept], ty[accept], rgb_y[accept]
        state.f[accept], state.fw[accept], state.S[accept] = fy[accept], fwy[accept], S_y[accept]
        state.pixel[accept], state.contrib[accept] = py.pixel[accept], py.contrib[accept]
        if state.pixels is not None:
            state.pixels[accept] = py.pixels[accept]
        if technique_gibbs > 0:
            _technique_gibbs(state, rng.random(C) < technique_gibbs, rng, stats["technique"])
        if use_h2mc:
            gauss.accept(accept)
        if lens is not None:
            lens.accept(accept, py, ty, j_y, lens_pending)
        if progress is not None:
            progress(step * C)
        if step in checkpoints:
            snapshots[checkpoints[step]] = _image(accum, boot.b, npix, step * C, w, h)
    steps = step  # fewer than asked when the time budget ran out
    indirect = _image(accum, boot.b, npix, steps * C, w, h)
    seconds = spent()
    direct = np.zeros_like(indirect)
    if direct_spp and scene.moving_meshes:
        direct = _emitters_seen(ps, int(direct_spp), rng)
    elif direct_spp:
        direct = edge_rt.render_image(scene, spp=int(direct_spp), seed=seed,
                                      max_depth=ps.min_length - 2, dtype=torch.float64,
                                      progress=False).numpy()
    return MLTResult(indirect + direct, indirect, direct, boot.b, steps * C, seconds, stats,
                     nonfinite, snapshots, ps.build_seconds - built, sigma2, pilot)


def _pilot_sigma2(scene, ps, seed, settings):
    """``sigma2="auto"``: ``(sigma2, {sigma2: acceptance})`` from short H2MC runs of small
    steps only (no large, mixing or lens steps) at each of :data:`AUTO_SIGMA2`, smallest
    first, until one is accepted less than :data:`AUTO_SIGMA2_ACCEPTANCE` of the time: the
    largest above it (the smallest tried if none). The pilots draw their own random numbers
    (the render's seed and a tag of their own), so the choice is independent of the
    render's chains and the render stays exact. Chains start from the bootstrap's
    resampling, close to the target, so their first steps' acceptance is the stationary
    one. ``settings``: the render's own (its clock too: the path space keeps the clock of
    the last render_mlt call for the kernels it builds)."""
    chains, steps, boot = AUTO_SIGMA2_PILOT
    mpp = steps * chains / (ps.width * ps.height)
    chosen, acceptance = AUTO_SIGMA2[0], {}
    for s2 in AUTO_SIGMA2:
        r = render_mlt(scene, mpp, method="h2mc", sigma2=s2, chains=chains, seed=(*seed, 0x7069),
                       large_step_prob=0.0, uniform_mixing=0.0, lens_perturb_prob=0.0,
                       direct_spp=0, bootstrap_samples=boot, path_space=ps, **settings)
        acceptance[s2] = r.stats["small"].acceptance
        if not acceptance[s2] >= AUTO_SIGMA2_ACCEPTANCE:
            break
        chosen = s2
    return chosen, acceptance


@dataclass
class _Chains:
    x: np.ndarray
    t: np.ndarray  # technique index (multiplexed state)
    rgb: np.ndarray  # the state's contribution (its technique's, or the sum: Kelemen)
    f: np.ndarray  # its target f* (f*_PSS)
    fw: np.ndarray  # its target in the chain's coordinates f*_w (= f with PSS coordinates)
    S: np.ndarray  # the sum over all techniques' scores at x (the resampling large step's)
    pixel: np.ndarray
    contrib: np.ndarray  # every technique's contribution at x, (C, T, 3)
    pixels: np.ndarray = None  # the pixel of each technique's contribution, (C, T)


def _technique_gibbs(state, chosen, rng, stats):
    """The Gibbs step on the technique of the ``chosen`` chains (Kelemen coordinates): ``t``
    drawn with probability ``f*_t(x) / S(x)`` from every technique's score at the state."""
    lanes = np.flatnonzero(chosen)
    scores = luminance(state.contrib[lanes])
    t = _pick(scores, rng)
    stats.proposed += len(lanes)
    stats.accepted += int((t != state.t[lanes]).sum())
    state.t[lanes], state.rgb[lanes] = t, state.contrib[lanes, t]
    state.f[lanes] = state.fw[lanes] = scores[np.arange(len(lanes)), t]


def _target(paths, t):
    """``(rgb (B, 3), f*_PSS (B,), f*_w (B,))`` of the Kelemen state (``t`` None: the sum
    over techniques, PSS coordinates) or of technique ``t[i]`` on lane ``i``."""
    if t is None:
        return paths.rgb, paths.f_star, paths.f_star
    lanes = np.arange(len(t))
    return paths.contrib[lanes, t], paths.scores[lanes, t], paths.scores_w[lanes, t]


def _acceptance(log_a, fy, fwy):
    """``min(1, exp(log_a))``, 0 where the proposal has no contribution."""
    return np.where((fy > 0) & (fwy > 0), np.exp(np.minimum(log_a, 0.0)), 0.0)


def _pick(scores, rng):
    """Per row, an index drawn with probability ``scores / scores.sum()`` (zero-score
    entries never; rows summing to 0 get an arbitrary index, their proposal has f* = 0)."""
    cdf = np.cumsum(scores, axis=1)
    r = rng.random(len(scores)) * cdf[:, -1]
    return np.minimum((cdf <= r[:, None]).sum(1), scores.shape[1] - 1)


class _Gaussians:
    """The H2MC Gaussians at the chains' states, cached per group: one group on all of ``u``
    (Kelemen state, derivatives of log S) or one per technique on its coordinates
    (multiplexed state, derivatives of log f*_t)."""

    def __init__(self, ps, multiplexed, sigma2, chains, time_in_hessian=True,
                 min_share=KELEMEN_MIN_SHARE):
        self.ps, self.sigma2, self.chains = ps, sigma2, chains
        self.min_share = min_share  # the Kelemen state's (KELEMEN_MIN_SHARE)
        # time is every group's first coordinate where the scene moves
        self.drop_time = ps.time_dim is not None and not time_in_hessian
        keys = ps.techniques if multiplexed else [None]
        self.dims = [np.arange(ps.dim) if key is None else ps.dims(*key) for key in keys]
        self.keys = keys
        self.cache = {}

    def compute(self, groups, u, paths):
        """The Gaussians of the groups ``[(g, lanes)]`` at ``u[lanes]`` (one value + gradient
        + Hessian evaluation each), ``{g: GaussianProposal}``: one h2mc_proposal call per
        dimension (a length's techniques share theirs), not one per group."""
        by_n, out = {}, {}
        for g, lanes in groups:
            key = self.keys[g]
            if key is None:
                out[g] = self._kelemen_state(u, paths, lanes)
                continue
            # lanes are sorted (np.flatnonzero / a sorted selection of them)
            logf, grad, H = self.ps.log_f_rows(u, *key, paths, lanes)
            by_n.setdefault(len(self.dims[g]), []).append((g, logf, grad, H))
        for rows in by_n.values():
            logf, grad, H = (np.concatenate([r[i] for r in rows]) for i in (1, 2, 3))
            gp = self._proposal(logf, grad, H)
            start = 0
            for g, lf, *_ in rows:
                out[g] = gp.take(slice(start, start + len(lf)))
                start += len(lf)
        return out

    def _proposal(self, logf, grad, H):
        if self.drop_time:  # time perturbed by the prior's kick alone, not in the Hessian
            grad[:, 0], H[:, 0, :], H[:, :, 0] = 0.0, 0.0, 0.0
        return h2mc_proposal(grad, H, self.sigma2, log_f=logf)

    def _kelemen_state(self, u, paths, lanes):
        """The Kelemen state's Gaussians at ``u[lanes]``: of ``log sum_t f*_t`` over the
        techniques carrying at least ``min_share`` of ``S`` there (all with ``f*_t > 0`` at
        0). Lanes are grouped by that set; a group's Gaussian is over the union of its
        techniques' dimensions, and every other dimension, where those derivatives are zero,
        takes the prior's isotropic kick, as it would in the full eigen-decomposition."""
        ps = self.ps
        scores = paths.scores[lanes]
        active = (scores > 0) & (scores >= self.min_share * scores.sum(1, keepdims=True))
        out = isotropic_proposal(len(lanes), ps.dim, self.sigma2)
        sets, group = np.unique(active, axis=0, return_inverse=True)
        for k, techs in enumerate(sets):
            rows = np.flatnonzero(group.ravel() == k)
            keys = [ps.techniques[t] for t in np.flatnonzero(techs)]
            if not keys:
                continue  # no light at the state: the isotropic kick
            dims = functools.reduce(np.union1d, [ps.dims(*key) for key in keys])
            gp = self._proposal(*ps.log_sum_rows(u, keys, dims, paths, lanes[rows]))
            out.basis[np.ix_(rows, dims, dims)] = gp.basis
            out.precision[np.ix_(rows, dims)] = gp.precision
            out.mean[np.ix_(rows, dims)] = gp.mean
            out.isotropic[rows], out.nonfinite[rows] = gp.isotropic, gp.nonfinite
        return out

    def put(self, g, lanes, gp):
        if g not in self.cache:
            n, C = len(self.dims[g]), self.chains
            self.cache[g] = GaussianProposal(np.zeros((C, n, n)), np.ones((C, n)),
                                             np.zeros((C, n)), np.zeros(C, bool),
                                             np.zeros(C, bool))
        self.cache[g].put(lanes, gp)

    def update(self, u, paths, lanes, groups):
        """Recompute the Gaussians of chains ``lanes`` at their new states ``u``."""
        sels = {g: lanes[groups[lanes] == g] for g in np.unique(groups[lanes])}
        for g, gp in self.compute(list(sels.items()), u, paths).items():
            self.put(g, sels[g], gp)

    def propose(self, state, h2, y, rng):
        """Write H2MC proposals of the chains ``h2`` into ``y``; ``[(group, lanes, Gaussian
        at x, offset z)]``."""
        lanes = np.flatnonzero(h2)
        pending = []
        for g in np.unique(state.t[lanes]):
            sel, d = lanes[state.t[lanes] == g], self.dims[g]
            gx = self.cache[g].take(sel)
            z = gx.sample(xi=rng.standard_normal((len(sel), len(d))))
            y[np.ix_(sel, d)] = _wrap(state.x[np.ix_(sel, d)] + z)
            pending.append((g, sel, gx, z))
        return pending

    def at_proposals(self, y, py, ty, pending, moved, log_a):
        """The Gaussians at the H2MC proposals ``pending`` (from :meth:`propose`; adds their
        proposal-density ratio to ``log_a``) and at the new states ``y`` of the chains
        ``moved`` by accepted large / isotropic / lens steps: one evaluation per group (the
        technique ``ty``) for both, kept until :meth:`accept`."""
        lanes = np.sort(np.concatenate([moved] + [sel for _, sel, _, _ in pending]))
        sels = {g: lanes[ty[lanes] == g] for g in np.unique(ty[lanes])}
        self.pending = {g: (sels[g], gp)
                        for g, gp in self.compute(list(sels.items()), y, py).items()}
        for g, sel, gx, z in pending:
            at, gy = self.pending[g]
            gy = gy.take(np.searchsorted(at, sel))
            log_a[sel] += gy.log_density(-z) - gx.log_density(z)

    def accept(self, accept):
        """The chains that accepted a proposal of :meth:`at_proposals` keep its Gaussian."""
        for g, (sel, gy) in self.pending.items():
            keep = accept[sel]
            self.put(g, sel[keep], gy.take(keep))


class _Lens:
    """The H2 lens perturbation of the chains (spec 5.3; module docstring): per chain its
    reconnection vertex ``j`` (0: lensScore = 0), its state's discrete structure (kernel
    parameters) and, while the chain moves by lens steps only, the cached fixed vertex,
    ``log lensScore`` and Gaussian at its state."""

    def __init__(self, ps, paths, t, sigma2, prob):
        self.ps, self.sigma2, self.prob = ps, sigma2, prob
        C = len(t)
        self.j = ps.lens_vertex(paths, t)
        self.params = ps.lane_params(paths, t)
        self.anchor = np.full((C, 3), np.nan)
        self.log_f = np.full(C, -np.inf)
        self.gauss = isotropic_proposal(C, 2, sigma2)
        self.cached = np.zeros(C, bool)

    def _gaussian(self, log_f, grad, hess):
        return h2mc_proposal(grad, hess, self.sigma2, log_f=log_f)

    def propose(self, state, on_lens, y, rng):
        """Write lens proposals of chains ``on_lens`` into ``y``; ``(lanes, j, anchor, Gaussian
        at x, offset z)``, on the current states' structure (which aims vertex j)."""
        ps, lanes = self.ps, np.flatnonzero(on_lens)
        x, t, j = state.x[lanes], state.t[lanes], self.j[lanes]
        px = ps.structure_of(self.params[lanes], t)
        todo = ~self.cached[lanes]
        if todo.any():
            anchor = ps.lens_anchor(x, px, t, j)
            log_f, grad, hess = ps.lens_derivatives(x, px, t, j, anchor)
            sel = lanes[todo]
            self.anchor[sel], self.log_f[sel] = anchor[todo], log_f[todo]
            self.gauss.put(sel, self._gaussian(log_f, grad, hess).take(todo))
        anchor = self.anchor[lanes]
        gx = self.gauss.take(lanes)
        z = gx.sample(xi=rng.standard_normal((len(lanes), 2)))
        screen = _wrap(x[:, ps._screen:ps._screen + 2] + z)
        y[lanes] = ps.lens_move(x, px, t, j, anchor, np.arange(len(lanes)), screen)
        return lanes, j, anchor, gx, z

    def at_proposal(self, y, py, ty, j_y, pending, log_a):
        """``log_a`` of the lens proposals: ``log lensScore_y + log Phi_y(-z) - log
        lensScore_x - log Phi_x(z)``, -inf where the proposal did not reach the fixed vertex
        or lost its reconnection structure; keeps the Gaussians at the proposals."""
        lanes, j, anchor, gx, z = pending
        B = len(y)
        full_j, full_anchor = np.zeros(B, np.int64), np.full((B, 3), np.nan)
        full_j[lanes], full_anchor[lanes] = j, anchor
        reached = (j_y[lanes] == j) & self.ps.lens_reached(y, py, ty, full_j,
                                                             full_anchor)[lanes]
        full_j[lanes[~reached]] = 0
        log_f, grad, hess = self.ps.lens_derivatives(y, py, ty, full_j, full_anchor, lanes)
        gy = self._gaussian(log_f[lanes], grad[lanes], hess[lanes])
        with np.errstate(invalid="ignore"):
            log_a[lanes] = np.where(
                reached & np.isfinite(log_f[lanes]),
                log_f[lanes] - self.log_f[lanes] + gy.log_density(-z) - gx.log_density(z),
                -np.inf)
        self._proposed = (lanes, log_f[lanes], gy)

    def accept(self, accept, py, ty, j_y, pending):
        """Chains that accepted a lens step keep its fixed vertex and Gaussian at the new
        state; any other accepted move clears their cache."""
        self.j[accept] = j_y[accept]
        self.params[accept] = self.ps.lane_params(py, ty, np.flatnonzero(accept))
        self.cached[accept] = False
        if pending is not None:
            lanes, log_f, gy = self._proposed
            keep = accept[lanes]
            self.log_f[lanes[keep]] = log_f[keep]
            self.gauss.put(lanes[keep], gy.take(keep))
            self.cached[lanes[keep]] = True


def _emitters_seen(ps, spp, rng):
    """Emitters seen directly (paths of one segment), (H, W, 3), from ``spp`` camera rays per
    pixel at uniform shutter times (moving meshes may hide them)."""
    g, w, h = ps.geometry, ps.width, ps.height
    pixel = np.repeat(np.arange(w * h), spp)
    xy = np.stack([pixel % w, pixel // w], 1) + rng.random((len(pixel), 2))
    with torch.no_grad():
        o, d, _ = ps.scene.camera.rays(torch.as_tensor(xy), torch.float64)
        time = torch.as_tensor(rng.random(len(pixel)))
        tri = g.intersect(o, d, time=time)
        hit = torch.nonzero(tri >= 0).flatten()
        le = g.emission(g.interact(tri[hit], o[hit], d[hit], time[hit])).numpy()
    accum = np.zeros((w * h, 3))
    _splat(accum, pixel[hit.numpy()], np.full(len(hit), 1.0 / spp), le)
    return accum.reshape(h, w, 3)


def _splat_paths(accum, weight, rgb, pixel, pixels, contrib, technique, elsewhere):
    """Splat ``rgb`` (B, 3) times ``weight`` at ``pixel``, but the part of it that the
    techniques ``elsewhere`` contribute (``contrib`` (B, T, 3)) at their ``pixels`` (B, T).
    ``technique`` (B,): the technique ``rgb`` is, -1 where it is the sum over all (a
    resampling proposal's expectation); None: the sum on every lane (Kelemen)."""
    if elsewhere:
        rgb = rgb.copy()
        for c in elsewhere:
            share = contrib[:, c]
            if technique is not None:
                share = np.where(((technique == c) | (technique < 0))[:, None], share, 0.0)
            rgb -= share
            _splat(accum, pixels[:, c], weight, share)
    _splat(accum, pixel, weight, rgb)


def _splat(accum, pixel, weight, rgb):
    for c in range(3):
        accum[:, c] += np.bincount(pixel, weight * rgb[:, c], minlength=len(accum))


def _image(accum, b, npix, mutations, w, h):
    return (accum * (b * npix / mutations)).reshape(h, w, 3)
