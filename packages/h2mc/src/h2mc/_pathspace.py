"""Light paths of an edge_rt scene as functions of primary samples (spec 1.2, 1.4, 5.5, 6.3).

A state ``u`` in ``[0, 1)^dim`` (one row per chain) maps to light paths of lengths
``min_length..max_length`` (length = number of segments, camera -> ... -> light) by
unidirectional path tracing: the camera ray from the screen coordinates and a BSDF-sampled
direction at each bounce. A path of length ``k`` is closed by two *techniques* (the
unidirectional subset of BDPT, spec 1.4; ``s`` = number of light-subpath vertices):

* ``s = 1`` (:data:`NEE`): at vertex ``k - 1`` an area-light sample (next-event estimation);
* ``s = 0`` (:data:`HIT`): the BSDF-sampled direction at vertex ``k - 1`` hits an emitter.

``bidirectional=True`` adds the techniques with light subpaths (``s = 2 .. k - 1``) and weights
every technique against all of its length's (:mod:`._bidirectional`).

Each technique ``(k, s)`` has its own contribution ``C_ks(u)``: the path throughput divided by
its sampling pdf (the PSS contribution) times its power-heuristic MIS weight (exponent 2; the
light pdf in solid angle against the BSDF pdf of the same direction), computed inside the
expression so derivatives include the weight. The two weights of one geometric path sum to 1,
so ``sum_s C_ks`` estimates the same light as one unweighted technique. The Kelemen state's
contribution is the sum over all techniques; an MMLT state holds one technique.

Layout of ``u``: ``[time]`` (only when the scene has moving meshes), ``[screen x, screen y]``,
then three numbers per bounce ``1..max_length-1``
(lobe selector and two direction numbers, edge_rt.bsdf.sample; the last bounce only feeds the
``s = 0`` technique of ``max_length``), then three per light connection at vertices
``min_length-1..max_length-1`` (light-triangle selector and two barycentric numbers, edge_rt
Geometry.sample_light). :meth:`PathSpace.dims` gives the coordinates one technique uses.

Two halves, as the thesis' renderer (spec 5.5):

* the *discrete structure* (hit triangles, sides, materials, the light triangle, visibility)
  comes from tracing with edge_rt's Embree caster, BSDF sampling and light sampling;
* the *contribution* of each technique is a core_ad expression of ``u`` with that structure
  frozen: each vertex (the emitter hit included) is the analytic intersection of the ray with
  its triangle's plane, and the BSDF, its sampling and its pdf are edge_rt's own expressions
  (edge_rt.bsdf). Compiled once per technique into a value kernel and a value + gradient +
  Hessian kernel of ``log f*``, ``f* = luminance(C)``. Values and derivatives therefore come
  from one expression; derivatives are those of the smooth piece (visibility, lobe and
  triangle choices held), which keeps MH exact.

Rough dielectrics (edge_rt ``Material.eta``, GGX with Walter et al.'s transmission) reflect
or refract: their vertices carry the relative index of refraction (``eta``, 0 on opaque
vertices) and take edge_rt's dielectric sampling, pdf and BSDF expressions (a per-vertex
``where`` on ``eta > 0``, compiled only for scenes that have a dielectric); paths leave them on
either side, where the shading and geometric normals agree (edge_rt's light-leak rule). The
reflect / refract choice is ``u0 < F`` on the vertex's lobe coordinate, as the opaque lobe
choice: a branch of the smooth piece, so ``u0`` has zero gradient and Hessian (its H2MC step
is the prior's symmetric kick, spec 5.1) while ``F`` / ``1 - F`` stay in the pdfs and MIS
weights. Perfectly specular dielectrics (roughness 0) are refused: their contribution is a
delta, not differentiable.

The modified parameterisation (spec 5.1 (i), 5.2; ``roughness_threshold`` given): on the
vertices a state's technique uses whose roughness exceeds the threshold, the two direction
numbers are absolute spherical coordinates of the outgoing direction in world space
(``theta_az = 2 pi w1``, ``phi = pi w2``, ``|d omega / dw| = 2 pi^2 sin phi``) instead of
BSDF-sampling inputs; the lobe number is unused there. ``trace(w, coords=t)`` reads lane ``i`` in
the coordinates of technique ``t[i]`` (:meth:`PathSpace.to_modified` converts a PSS state). The
contribution stays the PSS one ``f/p`` (BSDF pdfs are mixture pdfs, lobe and reflect / refract
probabilities included, so ``f*_PSS`` is a function of the path alone); its target in ``w`` is
``f*_w = f*_PSS * prod p_bsdf(omega) |d omega/dw|`` (:attr:`Paths.jacobian`), and the
derivative kernels differentiate ``log f*_w`` in one expression. Directions on the wrong side of
a vertex (or of zero pdf) end the path: zero contribution, never NaN.

Light coordinates (spec 5.1 (ii), ``light_coordinates=True`` with a threshold): on a lane in
the coordinates of a technique whose BSDF sample hits the light (``s = 0``), the last bounce's
three numbers are a light sample instead (edge_rt's Geometry.sample_light: triangle pick and
two area coordinates, flag ``lightcoord``); the direction aims at that point, and the ray
must reach it. Its factor of ``|det du/dw|`` is ``p_bsdf |cos theta_light| / d^2 / p_shape``
with ``p_shape = pmf / area`` (the pick number is a branch: no derivative).

The lens perturbation (spec 5.3; :meth:`PathSpace.lens_vertex`, :meth:`lens_derivatives`,
:meth:`lens_move`): kernels per ``(length, s, j)`` evaluate the path whose vertex ``j`` aims
at a fixed point of vertex ``j + 1``'s triangle, with ``log lensScore`` and its gradient and
Hessian in the screen position.

Textured materials are looked up at the traced hit and held constant in the derivatives (the
texture's variation over the surface is not differentiated).

Linear motion (spec 5.1 "Time"; edge_rt ``Mesh.velocity``): a scene with moving meshes puts the
shutter time ``u[:, 0]`` first (:attr:`PathSpace.time_dim`); every ray is cast at it and every
vertex on a moving mesh is its triangle's plane translated by ``time * velocity`` inside the
expressions, so the derivatives include time and its correlation with the other coordinates.
A path with no vertex on a moving mesh is *static* (:attr:`Paths.moving` false): its time has
no gradient or Hessian entry (returned as exact zeros), so an H2MC step perturbs it by the
prior's isotropic kick alone, as the spec's lower-dimensional Gaussian plus the missing
coordinate's 1D density. Lights and the camera do not move.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from core_ad import sym
from edge_rt import bsdf, torch_single_thread
from edge_rt.geometry import Geometry
from tqdm import tqdm

from . import _bidirectional
from ._kernel_build import build_in_workers, default_workers
from ._surface import by_material as _by_material
from ._surface import relative_eta as _relative_eta
from ._surface import sides_ok as _sides_ok
from ._vector import cross as _cross
from ._vector import dot as _dot
from ._vector import normalize as _normalize
from ._vector import sub as _sub

# compile_kernels' kinds whose kernels are derivatives (sym.compile_derived): minutes to build
_DERIVED = ("hessian", "lens_hessian")

LUMINANCE = (0.2126, 0.7152, 0.0722)  # Rec. 709 weights: f* = luminance of the RGB contribution

# Per-lane inputs of one surface vertex / the light vertex of a path kernel.
_VERTEX = ("v0x", "v0y", "v0z", "v1x", "v1y", "v1z", "v2x", "v2y", "v2z", "side",
           "n0x", "n0y", "n0z", "n1x", "n1y", "n1z", "n2x", "n2y", "n2z",
           "kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough", "eta")
_VELOCITY = ("velx", "vely", "velz")  # the vertex's triangle's translation over the shutter
_LIGHT = ("v0x", "v0y", "v0z", "v1x", "v1y", "v1z", "v2x", "v2y", "v2z", "ler", "leg", "leb",
          "pmf")


# The predicates that pick the smooth piece of each piecewise primitive.
_PIECEWISE = {
    "select": lambda a: [a[0]],
    "maximum": lambda a: [a[0] > a[1]],
    "minimum": lambda a: [a[0] < a[1]],
    "abs": lambda a: [a[0] > 0.0],
    "sign": lambda a: [a[0] > 0.0],
    "clamp": lambda a: [a[0] > a[1], a[0] < a[2]],
}


class PathSpaceError(ValueError):
    """A scene or state the path space cannot handle (the message names the problem)."""


def luminance(rgb):
    rgb = np.asarray(rgb, dtype=np.float64)
    return rgb @ np.asarray(LUMINANCE)


# A lens proposal's traced fixed vertex may differ from the aimed-at point by the rounding of
# the direction through spherical coordinates (~1e-15 / sin phi relative), far below this.
LENS_REACH_TOL = 1e-8

HIT, NEE = 0, 1  # techniques by their number of light-subpath vertices s (spec 1.4)

# A call's lanes of one material sequence take its specialised Hessian kernel from this many
# on (fewer: the generic one, PathSpace ``specialize``)
SPECIALIZE_MIN_LANES = 128


@dataclass
class Paths:
    """Paths of a batch of states: ``xy`` (B, 2) image position in pixels, ``contrib``
    (B, T, 3) MIS-weighted RGB contribution per technique ``techniques[t]`` (``(length, s)``
    keys, :attr:`PathSpace.techniques`), ``valid`` (B, T) whether the technique's path exists
    (hit every surface, light visible / emitter hit), ``nonfinite`` (B,) lanes whose
    contribution was NaN / inf (set to zero and counted, never splatted)."""

    xy: np.ndarray
    pixel: np.ndarray
    contrib: np.ndarray
    valid: np.ndarray
    nonfinite: np.ndarray
    structure: dict  # (length, s) -> (lanes, frozen per-lane parameters of its kernel)
    techniques: list
    # (B, T): prod over the technique's absolute-coordinate vertices of p_bsdf |d omega/dw|
    # (1 where the lane is in PSS coordinates); f*_w = f*_PSS * jacobian (spec 5.2)
    jacobian: np.ndarray = None
    # per bounce vertex i = 1..: (lanes there, direction leaving it (n, 3), roughness (n,))
    directions: list = None
    # (B, T): the technique's path has a vertex on a moving mesh (its time is an H2MC
    # dimension); False on static paths and in scenes without motion
    moving: np.ndarray = None
    # (B, T): the pixel each technique's contribution lands in: ``pixel`` but for light
    # tracing (bidirectional t = 1), where the path meets the camera; None: ``pixel`` for all
    pixels: np.ndarray = None

    @property
    def scores_w(self):
        """Luminance of each technique's contribution in the modified coordinates, (B, T)."""
        return self.scores * self.jacobian

    @property
    def rgb(self):
        """Kelemen contribution: the sum over techniques, (B, 3)."""
        return self.contrib.sum(axis=1)

    @property
    def f_star(self):
        """Scalar target luminance(rgb), (B,)."""
        return luminance(self.rgb)

    @property
    def scores(self):
        """Luminance of each technique's contribution (the MMLT targets f*_t), (B, T)."""
        return luminance(self.contrib)

    def lane_range(self, start, stop):
        """The paths of lanes ``start:stop``, renumbered from 0 (one :meth:`PathSpace.trace`
        of several batches side by side, split again)."""

        def rows(lanes):
            sel = np.flatnonzero((lanes >= start) & (lanes < stop))
            return sel, lanes[sel] - start

        structure = {}
        for key, (lanes, params) in self.structure.items():
            sel, local = rows(lanes)
            if len(sel):
                structure[key] = (local, params.take(sel, axis=1))  # C order: kernel rows
        directions = None
        if self.directions is not None:
            directions = []
            for lanes, wo, rough in self.directions:
                sel, local = rows(lanes)
                directions.append((local, wo[sel], rough[sel]))
        part = np.s_[start:stop]
        return Paths(self.xy[part], self.pixel[part], self.contrib[part], self.valid[part],
                     self.nonfinite[part], structure, self.techniques,
                     None if self.jacobian is None else self.jacobian[part], directions,
                     None if self.moving is None else self.moving[part],
                     None if self.pixels is None else self.pixels[part])

    def _columns_of(self, length, technique):
        cols = [t for t, (k, s) in enumerate(self.techniques)
                if k == length and technique in (None, s)]
        if not cols:
            raise PathSpaceError(f"Paths: no technique ({length}, {technique}) among "
                                 f"{self.techniques}")
        return cols

    def f_star_of(self, length, technique=None):
        """Luminance of the contribution of one technique, or of the sum over the
        techniques of ``length`` (``technique=None``), (B,)."""
        return self.scores[:, self._columns_of(length, technique)].sum(1)

    def same_structure(self, other, length, technique=None):
        """Lanes whose path of technique ``(length, technique)`` exists in both and has the
        same discrete structure (triangles, sides, materials, light triangle), (B,) bool.
        ``technique=None``: every technique of ``length`` exists in both with the same
        structure or in neither, and at least one exists."""
        if technique is None:
            same, some = np.ones(len(self.xy), bool), np.zeros(len(self.xy), bool)
            for t in self._columns_of(length, None):
                s = self.techniques[t][1]
                both = self.same_structure(other, length, s)
                same &= both | ~(self.valid[:, t] | other.valid[:, t])
                some |= both
            return same & some
        out = np.zeros(len(self.xy), bool)
        key = (length, technique)
        if key not in self.structure or key not in other.structure:
            return out
        (la, pa), (lb, pb) = self.structure[key], other.structure[key]
        common, ia, ib = np.intersect1d(la, lb, assume_unique=True, return_indices=True)
        same = np.ones(len(common), bool)
        for a, b in zip(pa, pb):
            same &= a[ia] == b[ib]
        out[common[same]] = True
        return out


def _in_sorted(a, b):
    """``np.isin(a, b)`` for a sorted ``b``: one binary search per entry of ``a`` (isin sorts
    both arrays, tens of microseconds a call on a few hundred lanes)."""
    if not len(b):
        return np.zeros(len(a), bool)
    return b[np.minimum(np.searchsorted(b, a), len(b) - 1)] == a


@functools.cache
def _lower_index(n):
    """For each entry ``(i, j)`` of an ``n x n`` symmetric matrix, row-major, the position of
    ``(max(i, j), min(i, j))`` among the lower-triangle outputs ``(i, j), j <= i``."""
    i, j = np.maximum.outer(np.arange(n), np.arange(n)), np.minimum.outer(np.arange(n),
                                                                          np.arange(n))
    return (i * (i + 1) // 2 + j).ravel()


def _batch_rows(B, lanes, rows):
    """``(logf, grad, hess)`` rows of ``lanes`` as arrays of the whole batch of ``B`` lanes
    (-inf and zero derivatives elsewhere)."""
    out = (np.full(B, -np.inf), np.zeros((B,) + rows[1].shape[1:]),
           np.zeros((B,) + rows[2].shape[1:]))
    for full, part in zip(out, rows):
        full[lanes] = part
    return out


def _log_f_kernel(rgb, wrt, inputs, backend, cached_only=False):
    """The compiled ``log f`` (f the luminance of ``rgb``), its gradient and its lower-triangle
    Hessian (row by row, ``(i, j), j <= i``) with respect to ``wrt`` (some of ``inputs``).
    Through ``sym.compile_derived``: a later process finds the kernel in the disk cache
    without deriving the Hessian again (most of a long path's load time); ``cached_only``:
    None where it is not there."""
    n = len(wrt)
    first = next(k for k, v in enumerate(inputs) if v is wrt[0])

    def derive(values):
        (logf,) = values
        hess = sym.hessian(logf, wrt)
        return [logf, *sym.grad(logf, wrt), *(hess[i][j] for i in range(n) for j in range(i + 1))]

    logf = sym.log(sum(w * c for w, c in zip(LUMINANCE, rgb)))
    return sym.compile_derived([logf], inputs, derive, backend=backend, cached_only=cached_only,
                               tag=f"log f, gradient, lower Hessian in inputs [{first}, "
                                   f"{first + n}): h2mc v1")


def spherical_direction(w):
    """World-space unit directions of spherical coordinates ``w`` (N, 2) in [0, 1)^2:
    ``theta_az = 2 pi w[:, 0]``, ``phi = pi w[:, 1]`` (spec 5.1 [R])."""
    theta, phi = 2.0 * np.pi * w[:, 0], np.pi * w[:, 1]
    return np.stack([np.sin(phi) * np.cos(theta), np.sin(phi) * np.sin(theta), np.cos(phi)], 1)


def spherical_coordinates(omega):
    """Inverse of :func:`spherical_direction`: (N, 2) in [0, 1)^2 of unit directions."""
    theta = np.mod(np.arctan2(omega[:, 1], omega[:, 0]) / (2.0 * np.pi), 1.0)
    return np.stack([np.where(theta < 1.0, theta, 0.0),
                     np.arccos(np.clip(omega[:, 2], -1.0, 1.0)) / np.pi], 1)


class PathSpace:
    """Primary-sample-space paths of ``scene`` (an edge_rt Scene with area lights).

    ``max_length`` / ``min_length``: path lengths in segments (2 = direct lighting, 3 = one
    indirect bounce, ...); the default ``min_length=3`` leaves direct lighting to edge_rt's path
    tracer (spec 1.5). ``backend``: core_ad's ``sym.compile`` backend for the path kernels
    (default LLVM; ``"numpy"`` builds in a fraction of a second but runs slower).
    ``techniques``: the ``(length, s)`` keys, ``s`` in (:data:`HIT`, :data:`NEE`), in the
    order of :attr:`Paths.contrib`'s technique axis. ``roughness_threshold``: enables the
    modified parameterisation (module docstring) for vertices rougher than it (None: PSS only;
    its kernels then carry no absolute-direction branch). ``specialize`` (scenes with a
    dielectric): Hessian kernels per *material sequence* (which surface vertices of the path
    are dielectric), each vertex differentiating its own BSDF, next to the generic one whose
    vertices hold both BSDFs picked per lane: a call gives the lanes of each sequence with at
    least :attr:`specialize_min_lanes` of them its kernel (built on first use, so only for
    sequences the chains visit often; render_mlt does not charge the build to its time
    budget) and the rest the generic one. Values and the other kernels stay one per
    technique (cheap: a call per sequence would cost more than the branch it saves).
    Off by default: at 1024 chains a step's lanes split over the sequences and a large
    kernel's call costs ~100 lanes of work, so the step costs what it did, while the
    first-use builds add tens of seconds to a render's wall clock; it pays with a few
    hundred lanes of one sequence per call (many more chains). ``bidirectional``: every BDPT
    technique ``s = 0 .. k`` of each length (light subpaths, :mod:`._bidirectional`;
    :attr:`light_point_dims`, :attr:`emission_dims` and :attr:`light_bsdf_dims` follow the
    unidirectional coordinates in ``u``; rough dielectrics included; light coordinates on the
    ``s = 0`` techniques, which hit the light as the unidirectional HIT does); its kernels
    hold both BSDFs at every vertex (``specialize`` does not apply).
    """

    def __init__(self, scene, max_length=3, min_length=3, backend=None,
                 roughness_threshold=None, light_coordinates=False, specialize=False,
                 bidirectional=False):
        if not 2 <= int(min_length) <= int(max_length):
            raise PathSpaceError(f"PathSpace: need 2 <= min_length <= max_length, got "
                                 f"{min_length}, {max_length}")
        self.min_length, self.max_length = int(min_length), int(max_length)
        if roughness_threshold is not None and not roughness_threshold >= 0.0:
            raise PathSpaceError(f"PathSpace: roughness_threshold must be >= 0 (or None for "
                                 f"PSS coordinates only), got {roughness_threshold!r}")
        self.roughness_threshold = roughness_threshold
        if light_coordinates and roughness_threshold is None:
            raise PathSpaceError("PathSpace: light_coordinates are part of the modified "
                                 "parameterisation: give a roughness_threshold too")
        self.light_coordinates = bool(light_coordinates)
        # time, the first coordinate, exists only where meshes move (spec 5.1)
        self.time_dim = 0 if scene.moving_meshes else None
        self._screen = 0 if self.time_dim is None else 1  # index of screen x in u
        self._vertex_names = (_VERTEX + (("absolute",) if roughness_threshold is not None
                                         else ())
                              + (("lightcoord",) if self.light_coordinates else ())
                              + (_VELOCITY if self.time_dim is not None else ()))
        if scene.camera.kind != "pinhole":
            raise PathSpaceError(f"PathSpace: only pinhole cameras, got {scene.camera.kind!r}")
        if scene.camera.thin_lens:
            raise PathSpaceError("PathSpace: thin-lens cameras are not supported yet (paths "
                                 "start at one camera point); set aperture_radius=0")
        if scene.envmap is not None:
            raise PathSpaceError("PathSpace: environment maps are not supported yet (paths end "
                                 "on area lights only; remove the envmap)")
        with torch.no_grad():
            self.geometry = Geometry(scene, torch.float64)
        for m in scene.meshes:
            if m.material.is_dielectric and float(m.material.roughness.values.min()) <= 0.0:
                raise PathSpaceError(f"PathSpace: mesh {m.name!r} is a perfectly specular "
                                     "dielectric (roughness 0): its contribution is a delta, "
                                     "not differentiable; give it a roughness > 0")
        self._dielectric = self.geometry.has_dielectric
        self.bidirectional = bool(bidirectional)
        rotation = scene.camera.cam_to_world.detach().double().numpy()[:3, :3]
        if self.bidirectional and not np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-9):
            raise PathSpaceError("PathSpace: light tracing (bidirectional t = 1) needs a camera "
                                 "pose without scale or shear (cam_to_world's rotation part "
                                 "is not orthonormal)")
        # the bidirectional techniques hold both BSDFs per vertex (no per-sequence kernels)
        self._specialize = bool(specialize) and self._dielectric and not self.bidirectional
        self.specialize_min_lanes = SPECIALIZE_MIN_LANES
        if len(self.geometry.light_tris) == 0:
            raise PathSpaceError("PathSpace: the scene has no light (no mesh with a non-zero "
                                 "emission); every path contribution would be zero")
        self.scene = scene
        self.width, self.height = scene.camera.width, scene.camera.height
        self._winding_normals, self._tri_normals = self._vertex_normals()
        self._emission = np.zeros((len(scene.meshes), 3))
        for mi, m in enumerate(scene.meshes):
            if m.emission is not None:
                self._emission[mi] = m.emission.detach().double().numpy()
        n_bounce = self.max_length - 1
        lead = self._screen + 2  # [time], screen x, screen y
        self.bsdf_dims = [lead + 3 * b + np.arange(3) for b in range(n_bounce)]
        first = lead + 3 * n_bounce
        self.light_dims = {k: first + 3 * (k - self.min_length) + np.arange(3)
                           for k in range(self.min_length, self.max_length + 1)}
        self.dim = first + 3 * (self.max_length - self.min_length + 1)
        self.techniques = [(k, s) for k in self.light_dims for s in (HIT, NEE)]
        if self.bidirectional:
            (self.light_point_dims, self.emission_dims, self.light_bsdf_dims,
             self.dim) = _bidirectional.layout(self.dim, self.max_length)
            self.techniques = _bidirectional.techniques(self.light_dims)
        self.backend = backend
        # the constructor's arguments: a worker process rebuilds this path space from them
        self._recipe = dict(scene=scene, max_length=max_length, min_length=min_length,
                            backend=backend, roughness_threshold=roughness_threshold,
                            light_coordinates=light_coordinates, specialize=specialize,
                            bidirectional=bidirectional)
        self._kernels = {}  # (kind, length, s, j | material sequence) -> compiled kernel
        # time spent building kernels, by ``clock`` (render_mlt sets its own and does not
        # charge the builds on first use to its budget)
        self.clock, self.build_seconds = time.perf_counter, 0.0

    def _vertex_normals(self):
        """(T, 3) unit winding normals and (T, 3, 3) shading normals at each triangle's
        corners (the geometric normal three times where the mesh has none, which
        interpolates back to it)."""
        g = self.geometry
        v = g.tri_verts.detach().numpy()
        ng = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
        ng /= np.linalg.norm(ng, axis=1, keepdims=True)
        out = np.repeat(ng[:, None], 3, axis=1)
        mesh_of = g.mesh_of.numpy()
        for mi, m in enumerate(self.scene.meshes):
            if m.normals is not None:
                sel = mesh_of == mi
                out[sel] = m.normals.detach().double().numpy()[
                    g.faces.numpy()[sel] - g.vertex_offset[mi]]
        return ng, out

    def dims(self, length, technique=None):
        """Indices into ``u`` of the coordinates technique ``(length, technique)`` depends
        on; ``technique=None``: those of any technique of ``length`` (sorted)."""
        self._check_technique(length, HIT if technique is None else technique)
        if technique is None:
            return functools.reduce(np.union1d, [self.dims(length, s)
                                                 for s in self.techniques_of(length)])
        if technique >= 2:
            return _bidirectional.dims(self, length, technique)
        lead = np.arange(self._screen + 2)
        if technique == HIT:
            return np.concatenate([lead] + self.bsdf_dims[:length - 1])
        return np.concatenate([lead] + self.bsdf_dims[:length - 2] + [self.light_dims[length]])

    def techniques_of(self, length):
        """The techniques ``s`` of paths of ``length`` segments, in :attr:`techniques`'
        order."""
        return [s for k, s in self.techniques if k == length]

    def _check_technique(self, length, technique):
        if length not in self.light_dims:
            raise PathSpaceError(f"PathSpace: length {length} outside "
                                 f"[{self.min_length}, {self.max_length}]")
        if (length, technique) not in self.techniques:
            if self.bidirectional:
                raise PathSpaceError(f"PathSpace: technique s must be an integer in [0, "
                                     f"{length}] (light-subpath vertices) for length "
                                     f"{length}, got {technique!r}")
            raise PathSpaceError(f"PathSpace: technique must be {HIT} (BSDF sample hits an "
                                 f"emitter) or {NEE} (light sample), got {technique!r}")
        return int(length), int(technique)

    def _check_u(self, u):
        u = np.asarray(u, dtype=np.float64)
        if u.ndim != 2 or u.shape[1] != self.dim:
            raise PathSpaceError(f"PathSpace: u must have shape (B, {self.dim}), got {u.shape}")
        if not np.isfinite(u).all():
            raise PathSpaceError("PathSpace: u has non-finite entries (states lie in [0, 1))")
        return u

    # ------------------------------------------------------------------ discrete structure
    def modified_vertices(self, technique_index):
        """Number of leading (camera-subpath) bounce vertices whose directions technique
        ``techniques[t]`` uses (``k - 1`` for HIT, ``k - 2`` for NEE, ``t - 2 = k - 1 - s``
        with a light subpath), per entry of ``technique_index``; -1 (a lane in PSS
        coordinates) gives 0."""
        t = self._check_technique_index(technique_index)
        # t - 2 when s >= 2 (none for light tracing, t = 1)
        used = np.array([max(k - 1 - s, 0) for k, s in self.techniques] + [0])
        return used[t]

    def _check_technique_index(self, technique_index):
        """``technique_index`` as int64, each in [-1, len(techniques)) (-1: a PSS lane), else a
        named error."""
        t = np.asarray(technique_index, np.int64)
        if ((t < -1) | (t >= len(self.techniques))).any():
            raise PathSpaceError(f"PathSpace: technique indices must lie in [-1, "
                                 f"{len(self.techniques)}), got {t.min()}..{t.max()}")
        return t

    def light_coordinate_vertex(self, technique_index):
        """The vertex whose direction numbers are light coordinates (spec 5.1 (ii): the last
        bounce of a technique whose BSDF sample hits the light, ``k - 1``) per entry of
        ``technique_index``; 0 where none (NEE techniques, PSS lanes, no light
        coordinates)."""
        t = np.asarray(technique_index, np.int64)
        if not self.light_coordinates:
            return np.zeros(t.shape, np.int64)
        vertex = np.array([k - 1 if s == HIT else 0 for k, s in self.techniques] + [0])
        return vertex[t]

    def swap_partner(self, technique_index):
        """Per entry of ``technique_index``, the technique :meth:`swap_technique` moves a state
        of it to: with light coordinates, HIT <-> NEE (``s = 0 <-> 1``) of the same length;
        -1 where none (a light subpath's technique, a PSS lane, no light coordinates)."""
        t = self._check_technique_index(technique_index)
        partner = np.full(len(self.techniques) + 1, -1)
        if self.light_coordinates:
            for i, (k, s) in enumerate(self.techniques):
                if s in (HIT, NEE):
                    partner[i] = self.techniques.index((k, NEE if s == HIT else HIT))
        return partner[t]

    def swap_technique(self, w, technique_index):
        """A state's path priced by the other way of reaching the light (light coordinates):
        ``w`` of HIT (k), whose last bounce numbers are the light sample it aims at, and the
        NEE (k) state whose light sample numbers are those same numbers trace the same path,
        with the same density in ``w`` (the light point's ``pmf / area`` either way). So the
        swap exchanges the two triples, ``bsdf_dims[k - 2]`` and ``light_dims[k]`` (each
        unused by the other technique): an involution of unit Jacobian, and ``f*_w`` of the
        two states differ by their MIS weights only. ``(w', partner techniques)``; a named
        error for a technique without a partner (:meth:`swap_partner`)."""
        t = self._check_technique_index(technique_index)
        partner = self.swap_partner(t)
        if (partner < 0).any():
            raise PathSpaceError("PathSpace.swap_technique: only the HIT and NEE techniques "
                                 "(s = 0, 1) of a path space with light coordinates swap, got "
                                 f"technique index {int(t[partner < 0][0])}")
        out = np.array(w, dtype=np.float64)
        lengths = np.array([self.techniques[i][0] for i in t], np.int64)
        for k in np.unique(lengths):
            lanes = np.flatnonzero(lengths == k)
            a, b = self.bsdf_dims[k - 2], self.light_dims[k]
            out[np.ix_(lanes, a)], out[np.ix_(lanes, b)] = out[np.ix_(lanes, b)], out[
                np.ix_(lanes, a)]
        return out, partner

    def to_modified(self, u, paths, technique_index, rng):
        """The modified coordinates ``w`` of PSS states ``u`` traced as ``paths``
        (``trace(u)``), lane ``i`` for technique ``techniques[technique_index[i]]``: on the
        technique's vertices rougher than the threshold, the direction numbers become the
        spherical coordinates of the traced direction and the (then unused) lobe number a fresh
        uniform, so the large step's proposal density in ``w`` is ``p_bsdf |d omega/dw|`` of
        the mixture pdf (spec 5.2)."""
        self._need_modified()
        u = self._check_u(u)
        w = u.copy()
        tech = np.asarray(technique_index, np.int64)
        n_abs = self.modified_vertices(tech)
        # The directions of the path as its kernel evaluates it (rays from the exact
        # vertices; the traced ones leave from offset origins and differ by ~1e-7), so that
        # w's path is u's to rounding; the traced ones where the technique has no path.
        exact, kernel_directions = {}, {}
        for t in np.unique(tech[tech >= 0]):
            n_camera = int(self.modified_vertices(t))  # the light subpath's follow
            if n_camera == 0 and not (self.bidirectional
                                      and _bidirectional.light_bounces(self, t)):
                continue  # no sampled direction (e.g. a light subpath connected to x_1)
            lanes, res = self._run("directions", u, *self.techniques[t], paths,
                                   np.flatnonzero(tech == t))
            kernel_directions[t] = (lanes, res)
            for i in range(n_camera if len(lanes) else 0):
                exact[i + 1, t] = (lanes, res[3 * i:3 * i + 3].T)
            if self.bidirectional and len(lanes):
                self._light_bounces_to_modified(w, t, lanes, res[3 * n_camera:], paths, rng)
        for i, (lanes, wo, rough) in enumerate(paths.directions, start=1):
            wo = wo.copy()
            for t in np.unique(tech[tech >= 0]):
                if (i, t) in exact:
                    lanes_k, wo_k = exact[i, t]
                    wo[np.searchsorted(lanes, lanes_k)] = wo_k
            sel = (n_abs[lanes] >= i) & (rough > self.roughness_threshold)
            lanes = lanes[sel]
            w[lanes, self.bsdf_dims[i - 1][0]] = rng.random(len(lanes))
            w[np.ix_(lanes, self.bsdf_dims[i - 1][1:])] = spherical_coordinates(wo[sel])
        if self.light_coordinates:
            self._to_light_coordinates(u, w, paths, tech, kernel_directions, rng)
        return w

    def _light_bounces_to_modified(self, w, t, lanes, directions, paths, rng):
        """:meth:`to_modified` on the light subpath of technique ``techniques[t]``: on its
        lanes ``lanes`` (those with a path), the sampled bounces ``y_1 .. y_{s-2}`` rougher than
        the threshold take a fresh lobe number and the spherical coordinates of their kernel
        directions ``directions`` (3 rows per bounce)."""
        k, s = self.techniques[t]
        nv, col = len(self._vertex_names), self._vertex_names.index("rough")
        lanes_k, params = paths.structure[k, s]
        rows = np.searchsorted(lanes_k, lanes)
        for j in range(1, s - 1):  # y_j is path vertex x_{k-j}: parameter block k - j - 1
            sel = params[(k - j - 1) * nv + col, rows] > self.roughness_threshold
            dims = self.light_bsdf_dims[j - 1]
            w[lanes[sel], dims[0]] = rng.random(int(sel.sum()))
            w[np.ix_(lanes[sel], dims[1:])] = spherical_coordinates(
                directions[3 * (j - 1):3 * j, sel].T)

    def _to_light_coordinates(self, u, w, paths, tech, kernel_directions, rng):
        """On lanes of techniques that hit the light, the last bounce's numbers become the
        light sample of the point it hits (spec 5.1 (ii)): a fresh uniform within the hit
        triangle's share of edge_rt's light-pick cdf, and the inverse of its triangle
        sampling (so the proposal density in ``w`` is the Jacobian ``p_bsdf |cos| / d^2 /
        p_shape``, spec 5.2)."""
        g, nv = self.geometry, len(self._vertex_names)
        light_tris = g.light_tris.numpy()
        corners = g.tri_verts.detach().numpy()[light_tris].reshape(-1, 9)
        cdf_hi, pmf = g.light_cdf.numpy(), g.light_pmf.numpy()[light_tris]
        params = self.lane_params(paths, tech)
        for t in np.unique(tech[tech >= 0]):
            k, s = self.techniques[t]
            if s != HIT:
                continue
            lanes, pos = self._run("positions", u, k, s, paths, np.flatnonzero(tech == t))
            if not len(lanes):
                continue
            out = kernel_directions[t][1]  # to_modified's, on the same lanes
            p = pos[3 * (k - 2):].T  # the last bounce and its direction
            d = out[3 * (k - 2):].T
            v = params[lanes, (k - 1) * nv:(k - 1) * nv + 9].reshape(-1, 3, 3)
            e1, e2 = v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]  # Moller-Trumbore barycentrics
            pvec, tvec = np.cross(d, e2), p - v[:, 0]
            inv_det = 1.0 / (e1 * pvec).sum(1)
            b1 = (tvec * pvec).sum(1) * inv_det
            b2 = (d * np.cross(tvec, e1)).sum(1) * inv_det
            su = b1 + b2  # edge_rt: b0 = 1 - sqrt(u1), b1 = u2 sqrt(u1)
            k_light = np.argmax((corners[None] == v.reshape(-1, 1, 9)).all(2), 1)
            top = np.nextafter(1.0, 0.0)
            w[np.ix_(lanes, self.bsdf_dims[k - 2])] = np.clip(np.stack(
                [cdf_hi[k_light] - pmf[k_light] * rng.random(len(lanes)), su * su, b1 / su],
                1), 0.0, top)

    def _need_modified(self):
        if self.roughness_threshold is None:
            raise PathSpaceError("PathSpace: modified coordinates need a roughness_threshold "
                                 "(built with None: PSS coordinates only)")

    def trace(self, u, coords=None):
        """Trace states ``u`` (B, dim) with edge_rt (Embree, BSDF and light sampling) and
        evaluate each technique's contribution with its compiled kernel: :class:`Paths`.
        ``coords`` (B,) technique indices: lane ``i`` is in the modified coordinates of
        technique ``techniques[coords[i]]`` (-1: PSS; light coordinates included where the
        path space has them); None: all lanes in PSS."""
        u = self._check_u(u)
        B = u.shape[0]
        light_vertex = np.zeros(B, np.int64)  # the vertex in light coordinates (0: none)
        n_light_abs = np.zeros(B, np.int64)  # light-subpath bounces in modified coordinates
        if coords is None:
            n_abs = np.zeros(B, np.int64)
        else:
            self._need_modified()
            if np.shape(coords) != (B,):
                raise PathSpaceError(f"PathSpace.trace: coords must have shape ({B},), got "
                                     f"{np.shape(coords)}")
            n_abs = self.modified_vertices(coords)
            light_vertex = self.light_coordinate_vertex(coords)
            if self.bidirectional:
                n_light_abs = _bidirectional.light_bounces(self, coords)
        directions = []
        g, cam, dt = self.geometry, self.scene.camera, torch.float64
        ut = torch.as_tensor(u)
        xy = u[:, self._screen:self._screen + 2] * np.array([self.width, self.height])
        times = None if self.time_dim is None else ut[:, self.time_dim]
        pixel = (np.minimum(np.floor(xy[:, 1]).astype(np.int64), self.height - 1) * self.width
                 + np.minimum(np.floor(xy[:, 0]).astype(np.int64), self.width - 1))
        contrib = np.zeros((B, len(self.techniques), 3))
        jacobian = np.ones((B, len(self.techniques)))
        valid = np.zeros((B, len(self.techniques)), bool)
        moving = np.zeros((B, len(self.techniques)), bool)
        verts = []  # per surface vertex: (lanes alive there, their vertex parameters)
        camera = []  # the same with interactions and dielectric flags (bidirectional only)
        ends = {}  # (length, s) -> (lanes, light parameters)
        with torch.no_grad(), torch_single_thread():
            o, d, _ = cam.rays(torch.as_tensor(xy), dt)
            lanes = torch.arange(B)
            # the light triangle and point a light-coordinate ray aims at (-1: none)
            aimed, aimed_y = torch.full((B,), -1), torch.zeros((B, 3), dtype=dt)
            for i in range(1, self.max_length + 1):
                time = None if times is None else times[lanes]
                tri = g.intersect(o, d, time=time)
                keep = torch.nonzero(tri >= 0).flatten()
                lanes, o, d, tri = lanes[keep], o[keep], d[keep], tri[keep]
                aimed, aimed_y = aimed[keep], aimed_y[keep]
                if len(lanes) == 0:
                    break
                if i >= max(2, self.min_length):  # the BSDF sample at vertex i - 1 hit x_i
                    ends[i, HIT] = self._emitter_hits(tri, o, d, lanes, aimed, aimed_y)
                if i == self.max_length:
                    break
                time = None if times is None else times[lanes]
                si = g.interact(tri, o, d, time)
                kd, ks, rough = g.material(si)
                eta = _relative_eta(g, si)
                glass = eta > 0
                lightc = torch.as_tensor(light_vertex[lanes.numpy()] == i)
                absolute = (torch.as_tensor(n_abs[lanes.numpy()] >= i)
                            & (rough > (self.roughness_threshold or 0.0)) & ~lightc)
                verts.append((lanes.numpy(), self._vertex_params(si, kd, ks, rough, eta,
                                                                 absolute, lightc)))
                if self.bidirectional:  # for the connections to light subpaths
                    camera.append((verts[-1][0], si, glass, verts[-1][1]))
                if i + 1 >= self.min_length:
                    ends[i + 1, NEE] = self._connect(si, glass,
                                                     ut[lanes][:, self.light_dims[i + 1]],
                                                     lanes, time)
                u_b = ut[lanes][:, self.bsdf_dims[i - 1]]
                wo, pdf = self._sample(si, -d, kd, ks, rough, eta, u_b, absolute)
                aimed, aimed_y = torch.full((len(lanes),), -1), torch.zeros((len(lanes), 3),
                                                                            dtype=dt)
                sel = torch.nonzero(lightc).flatten()
                if len(sel):  # spec 5.1 (ii): towards a point on a light
                    aimed_tri, y, _, _, _ = g.sample_light(u_b[sel])
                    to_light = y - si.p[sel]
                    wo_l = to_light / to_light.norm(dim=1, keepdim=True)
                    wo = wo.index_copy(0, sel, wo_l)
                    pdf = pdf.index_copy(0, sel, self._pdf_given(si, -d, kd, ks, rough, eta,
                                                                 sel, wo_l))
                    aimed = aimed.index_copy(0, sel, aimed_tri)
                    aimed_y = aimed_y.index_copy(0, sel, y)
                directions.append((lanes.numpy(), wo.numpy(), rough.numpy()))
                ok = torch.nonzero((pdf > 0) & _sides_ok(si, wo, glass)).flatten()
                o, d, lanes = g.spawn(si, wo)[ok], wo[ok], lanes[ok]
                aimed, aimed_y = aimed[ok], aimed_y[ok]
            connected = {}  # (k, s >= 2) -> (lanes, kernel parameters)
            pixels = None
            if self.bidirectional:
                light, light_vertices = _bidirectional.light_subpaths(self, ut, times,
                                                                      n_light_abs)
                connected, traced_pixels = _bidirectional.connections(
                    self, camera, light, light_vertices, times)
                pixels = np.repeat(pixel[:, None], len(self.techniques), 1)
                for key, pixel_k in traced_pixels.items():
                    pixels[connected[key][0], self.techniques.index(key)] = pixel_k
        structure = {}
        for t, key in enumerate(self.techniques):
            if key in connected:
                lanes_k, params = connected[key]
            else:
                lanes_k, light_params = ends.get(key, (np.zeros(0, np.int64), None))
                if len(lanes_k) == 0:
                    continue
                params = self._params(key, verts, lanes_k, light_params)
            with np.errstate(all="ignore"):
                out = self._value_kernel(*key).call_stacked(
                    self._kernel_inputs(u, key, lanes_k, params)).T
            if out.shape[1] == 4:  # the kernel's contribution is in w: back to PSS
                jacobian[lanes_k, t] = out[:, 3]
                # |det du/dw| = 0 (a direction of zero pdf as the kernel rounds it, at a
                # grazing angle): no density in w, so f*_w = 0, not 0 / 0
                with np.errstate(all="ignore"):
                    out = np.where(out[:, 3:] != 0.0, out[:, :3] / out[:, 3:], 0.0)
            contrib[lanes_k, t] = out
            valid[lanes_k, t] = True
            structure[key] = (lanes_k, params)
            if self.time_dim is not None:
                moving[lanes_k, t] = self._on_moving_mesh(structure[key][1], key[0])
        # A non-finite contribution (rounding at grazing angles) voids the whole state: its
        # lanes get f = 0, so a chain rejects it instead of splatting NaN.
        nonfinite = ~(np.isfinite(contrib).all(axis=(1, 2)) & np.isfinite(jacobian).all(1))
        contrib[nonfinite] = 0.0
        jacobian[nonfinite] = 1.0
        valid[nonfinite] = False
        moving[nonfinite] = False
        if nonfinite.any():
            for key, (lanes_k, params) in structure.items():
                keep = ~nonfinite[lanes_k]
                structure[key] = (lanes_k[keep], np.compress(keep, params, axis=1))
        return Paths(xy, pixel, contrib, valid, nonfinite, structure, list(self.techniques),
                     jacobian, directions, moving, pixels)

    def _on_moving_mesh(self, params, length):
        """Whether any surface vertex of the paths (kernel parameters ``params`` of a
        technique of ``length``) has a non-zero velocity, (n,) bool."""
        nv, first = len(self._vertex_names), self._vertex_names.index(_VELOCITY[0])
        out = np.zeros(len(params[0]), bool)
        for i in range(length - 1):
            for a in range(3):
                out |= params[i * nv + first + a] != 0.0
        return out

    @staticmethod
    def _sample(si, wi, kd, ks, rough, eta, u, absolute=None):
        """edge_rt's BSDF sampling (the dielectric's on lanes with ``eta > 0``); on
        ``absolute`` lanes the direction is ``u``'s spherical coordinates and the pdf
        edge_rt's pdf of it."""
        wo, pdf = bsdf.sample(si.ns, wi, kd, ks, rough, u)
        glass = torch.nonzero(eta > 0).flatten()
        if len(glass):
            wo_d, pdf_d = bsdf.sample_dielectric(si.ns[glass], wi[glass], eta[glass],
                                                 rough[glass], u[glass])
            wo, pdf = wo.index_copy(0, glass, wo_d), pdf.index_copy(0, glass, pdf_d)
        fixed = torch.nonzero(absolute).flatten() if absolute is not None else []
        if len(fixed):
            wo_a = torch.as_tensor(spherical_direction(u[fixed, 1:].numpy()))
            pdf_a = PathSpace._pdf_given(si, wi, kd, ks, rough, eta, fixed, wo_a)
            wo, pdf = wo.index_copy(0, fixed, wo_a), pdf.index_copy(0, fixed, pdf_a)
        return wo, pdf

    @staticmethod
    def _pdf_given(si, wi, kd, ks, rough, eta, lanes, wo):
        """edge_rt's (mixture; the dielectric's on lanes with ``eta > 0``) pdf of the given
        directions ``wo`` at the interactions ``lanes``."""
        pdf = bsdf.pdf(si.ns[lanes], wi[lanes], wo, kd[lanes], ks[lanes], rough[lanes])
        g = torch.nonzero(eta[lanes] > 0).flatten()
        if len(g):
            f = lanes[g]
            pdf = pdf.index_copy(0, g, bsdf.pdf_dielectric(si.ns[f], wi[f], wo[g], eta[f],
                                                           rough[f]))
        return pdf

    def _vertex_params(self, si, kd, ks, rough, eta, absolute, lightc):
        tri = si.tri.numpy()
        v = self.geometry.tri_verts.detach().numpy()[tri].reshape(-1, 9)
        side = np.where(si.front.numpy(), 1.0, -1.0)[:, None]
        n = self._tri_normals[tri].reshape(-1, 9)
        cols = [v, side, n, kd.numpy(), ks.numpy(), rough.numpy()[:, None],
                eta.numpy()[:, None]]
        if self.roughness_threshold is not None:
            cols.append(absolute.numpy().astype(np.float64)[:, None])
        if self.light_coordinates:  # lightc None: a light subpath's vertex (never flagged)
            cols.append(np.zeros((len(tri), 1)) if lightc is None
                        else lightc.numpy().astype(np.float64)[:, None])
        if self.time_dim is not None:
            cols.append(self.geometry.tri_velocity[si.tri].numpy())
        return np.concatenate(cols, 1)

    def _light_params(self, tri, pmf):
        g = self.geometry
        return np.concatenate([g.tri_verts.detach().numpy()[tri].reshape(-1, 9),
                               self._emission[g.mesh_of.numpy()[tri]], pmf[:, None]], 1)

    def _emitter_hits(self, tri, o, d, lanes, aimed, aimed_y):
        """Lanes whose ray hit the front (emitting) side of a light triangle, and their light
        parameters (as a light sample's, so both techniques price the same point). A ray in
        light coordinates must reach the point ``aimed_y`` of the triangle it ``aimed`` at: a
        neighbouring light triangle hit there counts as it (the ray leaves from the spawn
        offset, so it passes up to ~1e-4 beside the point and may cross a shared edge; the
        tolerance is the one of edge_rt's shadow rays, 1e-3 of the distance)."""
        other = torch.nonzero((aimed >= 0) & (aimed != tri)).flatten()
        if len(other):
            p = self.geometry.interact(tri[other], o[other], d[other]).p
            reach = (aimed_y[other] - o[other]).norm(dim=1)
            there = (p - aimed_y[other]).norm(dim=1) <= 1e-3 * reach
            tri = tri.index_copy(0, other[there], aimed[other[there]])
        t = tri.numpy()
        pmf = self.geometry.light_pmf.numpy()[t]
        front = np.einsum("ij,ij->i", self._winding_normals[t], d.numpy()) < 0
        aimed = aimed.numpy()
        sel = np.flatnonzero(front & (pmf > 0) & ((aimed < 0) | (aimed == t)))
        return lanes.numpy()[sel], self._light_params(t[sel], pmf[sel])

    def _connect(self, si, glass, u_light, lanes, time):
        """Next-event connection: lanes whose light sample is visible, lit from the front and
        on a side the vertex may send light to (``_sides_ok``), and their light parameters."""
        g = self.geometry
        tri, y, nl, area, pmf = g.sample_light(u_light)
        to_light = y - si.p
        wo = to_light / to_light.norm(dim=1, keepdim=True)
        origin = g.spawn(si, wo)
        tmax = (y - origin).norm(dim=1) * (1.0 - 1e-3)
        blocked = g.intersect(origin, wo, tmax=tmax, time=time) >= 0
        ok = (~blocked) & (-(nl * wo).sum(1) > 0) & (pmf > 0) & _sides_ok(si, wo, glass)
        sel = torch.nonzero(ok).flatten()
        return lanes[sel].numpy(), self._light_params(tri[sel].numpy(), pmf[sel].numpy())

    def _kernel_inputs(self, u, key, lanes, *rows):
        """The inputs of a kernel of technique ``key`` as the rows of one array (core_ad's
        ``call_stacked``: one pointer table instead of a checked array per input): its
        coordinates :meth:`dims` of ``lanes`` from ``u``, then ``rows`` (arrays of
        ``(m, len(lanes))``)."""
        return np.concatenate([u[np.ix_(lanes, self.dims(*key))].T, *rows])

    @staticmethod
    def _params(key, verts, lanes_k, light_params):
        """The frozen kernel parameters of the lanes ``lanes_k`` of technique ``key``, one row
        per parameter (each vertex's, then the light's): (P, len(lanes_k))."""
        rows = [verts[i][1][np.searchsorted(verts[i][0], lanes_k)]  # lanes stay sorted
                for i in range(key[0] - 1)]
        return np.ascontiguousarray(np.concatenate(rows + [light_params], 1).T)

    # ------------------------------------------------------------------ the smooth piece
    def expressions(self, length, technique=NEE):
        """``(u_vars, param_vars, rgb)``: the MIS-weighted contribution of technique
        ``(length, technique)`` as core_ad expressions of its primary samples
        (``dims(length, technique)``) and per-lane parameters; with a ``roughness_threshold``,
        in the modified coordinates (times ``|det du/dw|``, the vertex flags ``absolute``)."""
        u, params, rgb = self._expressions(length, technique)[:3]
        return u, params, rgb

    def _expressions(self, length, technique, lens=None, materials=None):
        """:meth:`expressions`, the technique's MIS weight, ``|det du/dw|``, the sampled
        directions and the surface vertices (expressions). ``lens`` (a vertex index ``j``):
        the lens perturbation's path (spec 5.3), whose vertex ``j`` sends its direction to
        the fixed point ``anchor`` (three more parameters, last) on vertex ``j + 1``'s
        triangle; vertex ``j``'s factor of the Jacobian is then ``p_bsdf(omega_j) |cos
        theta_{j+1}| / d^2`` (:meth:`lens_derivatives`). ``materials``: None (each vertex
        of a scene with a dielectric holds both BSDFs, picked per lane by its ``eta``) or
        the bit mask of :meth:`_material_sequences` (vertex ``i + 1`` is a dielectric
        where bit ``i`` is set, opaque elsewhere: one BSDF per vertex)."""
        k, s = self._check_technique(length, technique)
        u = [sym.var(f"pss{j}") for j in range(len(self.dims(k, s)))]
        verts = [{nm: sym.var(f"x{i}_{nm}") for nm in self._vertex_names} for i in range(1, k)]
        light = {nm: sym.var(f"l_{nm}") for nm in _LIGHT}
        time = None if self.time_dim is None else u[self.time_dim]
        params = [vp[nm] for vp in verts for nm in self._vertex_names] + [light[nm]
                                                                            for nm in _LIGHT]
        anchor = tuple(sym.var(f"anchor{a}") for a in "xyz") if lens else None
        params += list(anchor or ())
        if self.bidirectional:  # every technique weighted against all of its length's
            at = {int(j): var for j, var in zip(self.dims(k, s), u)}
            rgb, mis, jacobian, directions, positions = _bidirectional.contribution(
                self, k, s, at, verts, light, time, lens, anchor)
            if self.roughness_threshold is not None:  # the contribution in w (spec 5.2)
                rgb = [x * jacobian for x in rgb]
            return u, params, rgb, mis, jacobian, directions, positions
        o, d = self._camera_ray(u[self._screen], u[self._screen + 1])
        (s_out, s_in), ((p_out,), p_in) = bsdf.sampling_expressions("float64")
        e_vars, e_out = bsdf.bsdf_expressions("float64")
        if self._dielectric:
            (sd_out, sd_in), ((pd_out,), pd_in) = bsdf.dielectric_sampling_expressions(
                "float64")
            d_vars, d_out = bsdf.dielectric_expressions("float64")
        throughput = (1.0, 1.0, 1.0)
        jacobian = 1.0
        directions = []  # the direction leaving each vertex whose direction is sampled
        positions = []
        for i, vp in enumerate(verts):
            p, ng, ns = self._hit(o, d, vp, time)
            positions.extend(p)
            if lens is not None and i == lens:  # the area measure at the fixed vertex
                jacobian = jacobian * sym.abs(_dot(ng, d))
            wi = tuple(-x for x in d)
            mat = {nm: vp[nm] for nm in ("kdr", "kdg", "kdb", "ksr", "ksg", "ksb", "rough")}
            if not self._dielectric:
                glass = False
            elif materials is None:
                glass = vp["eta"] > 0.0
            else:
                glass = bool(materials >> i & 1)
            # a glass index on opaque vertices keeps the unused dielectric branch regular (at
            # eta = 1 refraction degenerates to wo = -wi, whose branches flip on rounding)
            glass_mat = {"eta": vp["eta"] if isinstance(glass, bool)
                         else sym.where(glass, vp["eta"], 1.5), "rough": vp["rough"]}
            last = i == k - 2
            if lens is not None and i + 1 == lens:  # reconnect to the fixed vertex j + 1
                to_anchor = _sub(anchor, p)
                dist2 = _dot(to_anchor, to_anchor)
                wo = tuple(x * sym.rsqrt(dist2) for x in to_anchor)
                pdf = self._pdf_of(wo, ns, wi, mat, glass, glass_mat, (p_out, p_in),
                                   (pd_out, pd_in) if self._dielectric else None)
                jacobian = jacobian * pdf / dist2
                directions.extend(wo)
            elif not last or s == HIT:
                du = u[self._screen + 2 + 3 * i: self._screen + 5 + 3 * i]
                env = dict(zip(("nx", "ny", "nz", "ix", "iy", "iz", "u0", "u1", "u2"),
                               (*ns, *wi, *du)))
                wo = _by_material(
                    glass, lambda: sym.substitute(sd_out, {v: env.get(v.name, glass_mat.get(
                        v.name)) for v in sd_in}),
                    lambda: sym.substitute(s_out, {v: env.get(v.name, mat.get(v.name))
                                                   for v in s_in}))
                wo, pdf = tuple(wo[:3]), wo[3]
                if self.roughness_threshold is not None:
                    pdfs = ((p_out, p_in), (pd_out, pd_in) if self._dielectric else None)
                    wo, pdf, jac = self._absolute(vp, du, wo, pdf, ns, wi, mat, glass,
                                                  glass_mat, *pdfs)
                    if last and self.light_coordinates:  # s = HIT
                        wo, pdf, jac = self._light_coordinates(vp, du, p, wo, pdf, jac, light,
                                                               ns, wi, mat, glass, glass_mat,
                                                               *pdfs)
                    jacobian = jacobian * jac
                directions.extend(wo)
            if last and s == NEE:
                y, nl, area = self._light_point(light, u[-2], u[-1])
                to_light = _sub(y, p)
                dist2 = _dot(to_light, to_light)
                wo = tuple(x * sym.rsqrt(dist2) for x in to_light)
            elif last:  # s = HIT: where the sampled ray meets the emitter's plane
                y = self._plane_point(p, wo, *self._light_corners(light))
                nl, area = self._light_frame(light)
                to_light = _sub(y, p)
                dist2 = _dot(to_light, to_light)
            if last:
                cos_l = -_dot(nl, wo)
                p_light = light["pmf"] * dist2 / (area * sym.maximum(cos_l, 1e-300))
                if s == NEE:  # the light sample's pdf against the BSDF's for its direction
                    # (a dielectric's reflect / refract probabilities included)
                    p_bsdf = self._pdf_of(wo, ns, wi, mat, glass, glass_mat, (p_out, p_in),
                                          (pd_out, pd_in) if self._dielectric else None)
                    a, b, pdf = p_light, p_bsdf, p_light
                else:  # the BSDF sample's pdf against the light's for the hit point
                    a, b = pdf, p_light
                mis = a * a / (a * a + b * b)  # power heuristic (a > 0 on the smooth piece)
            # the dielectric's is grey; reflection or transmission by the side of wo
            f = _by_material(glass, lambda: self._bsdf(d_vars, [d_out], ns, ng, wi, wo,
                                                       glass_mat) * 3,
                             lambda: self._bsdf(e_vars, e_out, ns, ng, wi, wo, mat))
            weight = [f[c] / pdf for c in range(3)]
            if last:
                le = (light["ler"], light["leg"], light["leb"])
                weight = [sym.where(cos_l > 0.0, weight[c] * le[c] * mis, 0.0)
                          for c in range(3)]
            throughput = tuple(throughput[c] * weight[c] for c in range(3))
            o, d = p, wo
        if self.roughness_threshold is not None:  # the contribution in w (spec 5.2)
            throughput = tuple(x * jacobian for x in throughput)
        return u, params, list(throughput), mis, jacobian, directions, positions

    def _pinhole(self):
        """The pinhole's rotation (camera to world, (3, 3)), position (3,) and ``tan(fov /
        2)``, as floats for the expressions."""
        cam = self.scene.camera
        m = cam.cam_to_world.detach().double().numpy()
        return m[:3, :3], m[:3, 3], float(np.tan(float(cam.fov) * np.pi / 360.0))

    def _camera_ray(self, sx, sy):
        """The pinhole camera's ray through screen position ``(sx, sy)`` in [0, 1)^2
        (expressions): origin and unit direction, as edge_rt's ``Camera.rays``."""
        rotation, eye, tan = self._pinhole()
        local = (tan * (2.0 * sx - 1.0),
                 -tan * (2.0 * sy - 1.0) * (self.height / self.width), sym.const(1.0))
        d = _normalize(tuple(sum(float(rotation[r, c]) * local[c] for c in range(3))
                             for r in range(3)))
        return tuple(sym.const(float(c)) for c in eye), d

    @staticmethod
    def _pdf_of(omega, ns, wi, mat, glass, glass_mat, opaque_pdf, glass_pdf):
        """edge_rt's (mixture) pdf of the direction ``omega`` (the dielectric's on glass)."""
        env = dict(zip(("nx", "ny", "nz", "ix", "iy", "iz", "ox", "oy", "oz"),
                       (*ns, *wi, *omega)))
        p_out, p_in = opaque_pdf
        pd_out, pd_in = glass_pdf or (None, None)
        return _by_material(
            glass, lambda: sym.substitute([pd_out], {v: env.get(v.name, glass_mat.get(v.name))
                                                     for v in pd_in}),
            lambda: sym.substitute([p_out], {v: env.get(v.name, mat.get(v.name))
                                             for v in p_in}))[0]

    @classmethod
    def _absolute(cls, vp, du, wo, pdf, ns, wi, mat, glass, glass_mat, opaque_pdf, glass_pdf):
        """The direction, its pdf and the vertex's factor of ``|det du/dw|`` (spec 5.2): on
        vertices flagged ``absolute``, ``omega`` from spherical coordinates ``du[1:]``, edge_rt's
        (mixture) pdf of it and ``p_bsdf |d omega/dw| = p_bsdf 2 pi^2 sin phi``; elsewhere the
        sampled ``wo``, ``pdf`` and 1."""
        theta, phi = 2.0 * np.pi * du[1], np.pi * du[2]
        sin_phi = sym.sin(phi)
        omega = (sin_phi * sym.cos(theta), sin_phi * sym.sin(theta), sym.cos(phi))
        p_abs = cls._pdf_of(omega, ns, wi, mat, glass, glass_mat, opaque_pdf, glass_pdf)
        absolute = vp["absolute"] > 0.5
        return (tuple(sym.where(absolute, a, b) for a, b in zip(omega, wo)),
                sym.where(absolute, p_abs, pdf),
                sym.where(absolute, p_abs * (2.0 * np.pi ** 2) * sin_phi, 1.0))

    @classmethod
    def _light_coordinates(cls, vp, du, p, wo, pdf, jac, light, ns, wi, mat, glass, glass_mat,
                           opaque_pdf, glass_pdf):
        """Spec 5.1 (ii): on vertices flagged ``lightcoord`` (the last bounce of a path that
        hits the light), the direction towards the point of the hit light triangle at area
        coordinates ``du[1:]`` (edge_rt's triangle sampling; ``du[0]`` picked the triangle),
        its pdf and the vertex's factor of ``|det du/dw|``, ``p_bsdf |cos theta_light| / d^2 /
        p_shape`` with ``p_shape = pmf / area``; elsewhere ``wo``, ``pdf`` and ``jac``."""
        y, nl, area = cls._light_point(light, du[1], du[2])
        to_light = _sub(y, p)
        dist2 = _dot(to_light, to_light)
        omega = tuple(x * sym.rsqrt(dist2) for x in to_light)
        p_l = cls._pdf_of(omega, ns, wi, mat, glass, glass_mat, opaque_pdf, glass_pdf)
        jac_l = p_l * sym.abs(_dot(nl, omega)) * area / (dist2 * light["pmf"])
        lightc = vp["lightcoord"] > 0.5
        return (tuple(sym.where(lightc, a, b) for a, b in zip(omega, wo)),
                sym.where(lightc, p_l, pdf), sym.where(lightc, jac_l, jac))

    @staticmethod
    def _plane_point(o, d, v0, v1, v2):
        """Moller-Trumbore (as edge_rt's Geometry.interact): the point where the ray meets
        the triangle's plane."""
        e1, e2 = _sub(v1, v0), _sub(v2, v0)
        pvec = _cross(d, e2)
        inv_det = 1.0 / _dot(e1, pvec)
        tvec = _sub(o, v0)
        qvec = _cross(tvec, e1)
        t = _dot(e2, qvec) * inv_det
        return tuple(o[c] + t * d[c] for c in range(3))

    @classmethod
    def _hit(cls, o, d, vp, time=None):
        """Analytic intersection with the vertex's triangle plane (translated by ``time`` times
        its velocity where meshes move): point, geometric and shading normals (facing the
        viewer by the traced side)."""
        v = [(vp[f"v{j}x"], vp[f"v{j}y"], vp[f"v{j}z"]) for j in range(3)]
        if time is not None:
            v = [tuple(c + time * vp[f"vel{a}"] for c, a in zip(corner, "xyz")) for corner in v]
        e1, e2 = _sub(v[1], v[0]), _sub(v[2], v[0])
        pvec = _cross(d, e2)
        inv_det = 1.0 / _dot(e1, pvec)
        tvec = _sub(o, v[0])
        b1 = _dot(tvec, pvec) * inv_det
        qvec = _cross(tvec, e1)
        b2 = _dot(d, qvec) * inv_det
        t = _dot(e2, qvec) * inv_det
        p = tuple(o[c] + t * d[c] for c in range(3))
        side = vp["side"]
        ng = tuple(side * x for x in _normalize(_cross(e1, e2)))
        b0 = 1.0 - b1 - b2
        ns = _normalize(tuple(b0 * vp[f"n0{a}"] + b1 * vp[f"n1{a}"] + b2 * vp[f"n2{a}"]
                              for a in "xyz"))
        return p, ng, tuple(side * x for x in ns)

    @staticmethod
    def _light_corners(light):
        return [tuple(light[f"v{j}{a}"] for a in "xyz") for j in range(3)]

    @classmethod
    def _light_frame(cls, light):
        """The light triangle's unit winding normal (its emitting side) and area."""
        v0, v1, v2 = cls._light_corners(light)
        cross = _cross(_sub(v1, v0), _sub(v2, v0))
        norm = sym.sqrt(_dot(cross, cross))
        return tuple(x / norm for x in cross), 0.5 * norm

    @classmethod
    def _light_point(cls, light, u1, u2):
        """edge_rt's uniform triangle sampling (Geometry.sample_light) as an expression: the
        point, the light's normal and area."""
        v0, v1, v2 = cls._light_corners(light)
        su = sym.sqrt(u1)
        b0, b1 = 1.0 - su, u2 * su
        y = tuple(b0 * v0[c] + b1 * v1[c] + (1.0 - b0 - b1) * v2[c] for c in range(3))
        return (y, *cls._light_frame(light))

    @staticmethod
    def _bsdf(e_vars, e_out, ns, ng, wi, wo, mat):
        env = dict(zip(("nx", "ny", "nz", "gx", "gy", "gz", "ix", "iy", "iz", "ox", "oy", "oz"),
                       (*ns, *ng, *wi, *wo)))
        env.update(mat)
        return sym.substitute(e_out, {v: env[name] for name, v in e_vars.items()})

    def _kernel(self, kind, length, technique, materials=None, cached_only=False):
        """The compiled kernel ``kind`` of technique ``(length, technique)``, for the lanes
        of material sequence ``materials`` (:meth:`_material_sequences`; None: any).
        ``cached_only`` ("hessian"): None where it is neither built nor in the disk cache."""
        key = (kind, *self._check_technique(length, technique), materials)
        if key not in self._kernels:
            start = self.clock()
            u, params, rgb, mis, jacobian, directions, positions = self._expressions(
                length, technique, materials=materials)
            if kind == "hessian":  # log f*, its gradient and its lower-triangle Hessian
                kernel = _log_f_kernel(rgb, u, u + params, self.backend, cached_only)
                self.build_seconds += self.clock() - start
                if kernel is not None:
                    self._kernels[key] = kernel
                return kernel
            if kind == "value":  # with the modified parameterisation, also |det du/dw|
                outs = rgb + ([jacobian] if self.roughness_threshold is not None else [])
            elif kind == "mis":
                outs = [mis]
            elif kind == "directions":
                outs = directions
            elif kind == "positions":
                outs = positions
            else:  # "branch"
                preds = {}
                for node in sym.toposort(rgb):
                    rule = _PIECEWISE.get(getattr(getattr(node, "prim", None), "name", None))
                    if rule is not None:
                        for pred in rule(node.args):
                            preds.setdefault(id(pred), pred)
                outs = [sym.where(pred, 1.0, 0.0) for pred in preds.values()]
            self._kernels[key] = sym.compile(outs, u + params, backend=self.backend)
            self.build_seconds += self.clock() - start
        return self._kernels[key]

    def _value_kernel(self, length, technique):
        return self._kernel("value", length, technique)

    def _material_sequences(self, length, params):
        """Per lane (column of the kernel parameters ``params`` of a technique of
        ``length``), the bit mask of its dielectric surface vertices (bit ``i``: vertex
        ``i + 1``), which names its specialised kernels; None where kernels are not
        specialised (no dielectric in the scene, or ``specialize=False``)."""
        if not self._specialize:
            return None
        nv, col = len(self._vertex_names), self._vertex_names.index("eta")
        out = np.zeros(params.shape[1], np.int64)
        for i in range(length - 1):
            out |= (params[i * nv + col] > 0.0).astype(np.int64) << i
        return out

    def _run(self, kind, u, length, technique, paths, lanes=None):
        """``(lanes, outputs (n_out, len(lanes)))`` of one kernel on the lanes (of ``lanes``,
        if given) that have a path of technique ``(length, technique)``. Hessian kernels of a
        specialised path space run per material sequence: their lanes come back grouped by
        sequence, not sorted."""
        key = self._check_technique(length, technique)
        if key not in paths.structure:
            return np.zeros(0, np.int64), None
        lanes_k, params = paths.structure[key]
        keep = np.arange(len(lanes_k)) if lanes is None else np.flatnonzero(
            _in_sorted(lanes_k, lanes))
        groups = [(None, 0, len(keep))]  # (material sequence or None: generic, lane range)
        materials = self._material_sequences(key[0], params) if kind == "hessian" else None
        if materials is not None and len(keep):
            # a call of a large kernel costs ~100 lanes' work whatever its lane count (its
            # code streams in): sequences with few lanes here share the generic kernel (-1)
            seqs, counts = np.unique(materials[keep], return_counts=True)
            seq = np.where(_in_sorted(materials[keep], seqs[counts < self.specialize_min_lanes]),
                           -1, materials[keep])
            order = np.argsort(seq, kind="stable")  # each sequence's lanes side by side
            keep, seq = keep[order], seq[order]
            first = np.flatnonzero(np.diff(seq, prepend=-2))
            groups = [(None if seq[a] < 0 else int(seq[a]), a, b)
                      for a, b in zip(first, [*first[1:], len(keep)])]
        if len(keep) < len(lanes_k) or len(groups) > 1:
            lanes_k, params = lanes_k[keep], params.take(keep, axis=1)
        inputs = self._kernel_inputs(u, key, lanes_k, params)
        with np.errstate(all="ignore"):
            if len(groups) == 1:
                return lanes_k, self._kernel(kind, *key, groups[0][0]).call_stacked(inputs)
            return lanes_k, np.concatenate([
                self._kernel(kind, *key, m).call_stacked(inputs[:, a:b]) for m, a, b in groups],
                axis=1)

    def mis_weights(self, u, length, technique, paths=None):
        """Power-heuristic MIS weight of technique ``(length, technique)`` per lane, (B,);
        0 for lanes without that path."""
        u = self._check_u(u)
        paths = self.trace(u) if paths is None else paths
        out = np.zeros(len(u))
        lanes, res = self._run("mis", u, length, technique, paths)
        if len(lanes):
            out[lanes] = res[0]
        return out

    # ------------------------------------------------------------------ lens perturbation
    def lane_params(self, paths, coords, lanes=None):
        """Each lane's kernel parameters for technique ``techniques[coords[i]]``, (B, P)
        padded with NaN (and all NaN where the lane has no such path); ``lanes`` (sorted):
        the rows of those lanes only, (len(lanes), P)."""
        nv = len(self._vertex_names)
        B = len(paths.xy) if lanes is None else len(lanes)
        out = np.full((B, (self.max_length - 1) * nv + len(_LIGHT)), np.nan)
        coords = np.asarray(coords, np.int64)
        asked = coords if lanes is None else coords[lanes]
        for t in np.unique(asked[asked >= 0]):
            key = self.techniques[t]
            if key not in paths.structure:
                continue
            lanes_k, params = paths.structure[key]
            sel = coords[lanes_k] == t
            rows = lanes_k[sel]
            if lanes is not None:  # the rows of the lanes asked for
                hit = _in_sorted(rows, lanes)
                rows, sel = np.searchsorted(lanes, rows[hit]), np.flatnonzero(sel)[hit]
            out[rows, :len(params)] = params[:, sel].T
        return out

    def structure_of(self, params, coords):
        """A :class:`Paths` holding only the discrete structure given by per-lane kernel
        parameters ``params`` (rows of :meth:`lane_params`, NaN rows: no path) for techniques
        ``coords``, for the kernels (its contributions are zeros): a chain keeps its state's
        structure so that a lens step need not trace the state again."""
        n, nv = len(params), len(self._vertex_names)
        structure = {}
        for t, key in enumerate(self.techniques):
            lanes = np.flatnonzero((coords == t) & np.isfinite(params[:, 0]))
            if len(lanes):
                width = (key[0] - 1) * nv + len(_LIGHT)
                structure[key] = (lanes, np.ascontiguousarray(params[lanes, :width].T))
        T = len(self.techniques)
        return Paths(np.zeros((n, 2)), np.zeros(n, np.int64), np.zeros((n, T, 3)),
                     np.zeros((n, T), bool), np.zeros(n, bool), structure,
                     list(self.techniques))

    @staticmethod
    def lens_vertex_range(length, technique):
        """The reconnection vertices ``j`` a lens perturbation of technique ``(length,
        technique)`` can have: ``range(1, last + 1)``, ``last`` the camera subpath's last
        sampled bounce before a surface vertex (``length - 2``; with ``s >= 2`` light-subpath
        vertices ``t - 2 = length - 1 - s``, as the vertex after it joins the light
        subpath)."""
        return range(1, length - max(technique, NEE))

    def lens_vertex(self, paths, coords):
        """The lens perturbation's reconnection vertex (spec 5.3) per lane of ``paths``
        (traced in the modified coordinates of techniques ``coords``), (B,) int64: the first
        camera-subpath vertex ``j`` in absolute coordinates (rougher than the threshold; the
        near-specular vertices before it are followed with their primary samples, as Veach's
        lens perturbation follows specular bounces; :meth:`lens_vertex_range`), provided
        vertex ``j + 1`` is a surface vertex whose own outgoing direction is fixed in world
        space (absolute coordinates, the next-event vertex or a bidirectional technique's
        connection vertex, whose neighbour is a point, or light coordinates: its light
        sample is a point). 0 where the structure allows no lens perturbation (the reference
        renderer's lensScore = 0)."""
        self._need_modified()
        nv, col = len(self._vertex_names), self._vertex_names.index("absolute")
        out = np.zeros(len(paths.xy), np.int64)
        coords = np.asarray(coords, np.int64)
        for t, (k, s) in enumerate(self.techniques):
            last = len(self.lens_vertex_range(k, s))
            if not last or (k, s) not in paths.structure:
                continue
            lanes_k, params = paths.structure[k, s]
            sel = np.flatnonzero(coords[lanes_k] == t)
            if not len(sel):
                continue
            absolute = params[np.ix_(col + nv * np.arange(k - 1), sel)].T > 0.5
            first = np.argmax(absolute[:, :last], 1)  # 0-based; vertex first + 2 exists
            fixed_next = absolute[np.arange(len(sel)), first + 1] | (
                (s >= NEE) & (first + 1 == last))
            if self.light_coordinates:  # aimed at a point of the light
                lc = self._vertex_names.index("lightcoord")
                fixed_next |= params[lc + nv * (first + 1), sel] > 0.5
            ok = absolute[:, :last].any(1) & fixed_next
            out[lanes_k[sel[ok]]] = first[ok] + 1
        return out

    def _lens_kernel(self, kind, length, technique, j, cached_only=False):
        key = (kind, length, technique, j)
        if key not in self._kernels:
            self._need_modified()
            start = self.clock()
            u, params, rgb, _, _, directions, _ = self._expressions(length, technique, lens=j)
            if kind == "lens_direction":
                kernel = sym.compile(directions[3 * (j - 1):3 * j], u + params,
                                     backend=self.backend)
            else:  # "lens_hessian": log lensScore and its derivatives in the screen position
                kernel = _log_f_kernel(rgb, u[self._screen:self._screen + 2], u + params,
                                       self.backend, cached_only)
            self.build_seconds += self.clock() - start
            if kernel is None:
                return None
            self._kernels[key] = kernel
        return self._kernels[key]

    def compile_kernels(self, derivatives=False, lens=False, workers=None, progress=False):
        """Compile (or load from the disk cache) now, for every technique, the kernels a
        render uses: values (and, in the modified coordinates, directions and positions),
        with ``derivatives`` the Hessians of ``log f*``, with ``lens`` the lens
        perturbation's of every reconnection vertex (modified coordinates). They are
        otherwise built on first use: a technique rare in the first samples (a BSDF sample
        that hits a small light) would compile inside a timed render. A specialised path
        space's Hessians of single material sequences are built on first use: only for
        sequences the chains visit often, not all ``2^(length-1)``.

        Where two or more derivative kernels are missing from core_ad's disk cache (LLVM
        backend, cache on), they are built side by side in ``workers`` processes (default
        :func:`~._kernel_build.default_workers`: one per core, memory permitting; 1: here,
        one after the other) and then loaded here: see :mod:`._kernel_build`.
        ``progress``: a tqdm bar of the kernels built."""
        tasks = []
        # directions and positions: to_modified, light coordinates and the lens's anchor
        kinds = (["value"] + (["directions", "positions"] if self.roughness_threshold is not None
                              else []) + (["hessian"] if derivatives else []))
        if lens:
            self._need_modified()
        for k, s in self.techniques:
            tasks += [(kind, k, s) for kind in kinds]
            for j in self.lens_vertex_range(k, s) if lens else ():
                tasks += [(kind, k, s, j) for kind in ("lens_direction", "lens_hessian")]
        # derivative kernels first, the longest paths' first: they take the longest to build
        tasks.sort(key=lambda t: (t[0] not in _DERIVED, -t[1]))
        counted = set()
        with tqdm(total=len(tasks), unit="kernel", desc="kernels", disable=not progress) as bar:

            def built(task):
                if task not in counted:
                    counted.add(task)
                    bar.update()

            workers = default_workers() if workers is None else int(workers)
            # workers pay only where this process then finds their kernels in the disk cache
            if (workers > 1 and sym.derived_cache_enabled(self.backend)
                    and self._missing_derived(tasks, 2) >= 2):
                build_in_workers(self._recipe, [t for t in tasks if self._key(t) not in
                                                self._kernels], workers, on_built=built)
            for task in tasks:
                self._build_kernel(task)
                built(task)

    def _missing_derived(self, tasks, enough):
        """How many of ``tasks``' derivative kernels are neither built nor in the disk cache
        (counting stops at ``enough``)."""
        missing = 0
        for task in tasks:
            if task[0] in _DERIVED and self._build_kernel(task, cached_only=True) is None:
                missing += 1
                if missing == enough:
                    break
        return missing

    @staticmethod
    def _key(task):
        return task if task[0].startswith("lens_") else (*task, None)

    def _build_kernel(self, task, cached_only=False):
        """The kernel of a :meth:`compile_kernels` task: ``(kind, length, technique)`` or,
        for the lens kernels, ``(kind, length, technique, j)``."""
        if task[0].startswith("lens_"):
            return self._lens_kernel(*task, cached_only=cached_only)
        return self._kernel(*task, cached_only=cached_only)

    def _run_lens(self, kind, u, paths, coords, j, anchor, lanes):
        """``[(lanes, outputs (n_out, len(lanes)))]`` of a lens kernel per (technique, j)
        group of ``lanes`` (with ``j > 0``), on ``paths``' structure and ``u``'s coordinates."""
        out = []
        lanes = np.asarray(lanes, np.int64)
        lanes = np.sort(lanes[j[lanes] > 0])
        groups = coords[lanes] * (self.max_length + 1) + j[lanes]  # (technique, j) pairs
        for g in np.unique(groups):
            t, jj = divmod(int(g), self.max_length + 1)
            key = self.techniques[t]
            lanes_k, params = paths.structure[key]
            keep = _in_sorted(lanes_k, lanes[groups == g])
            lanes_k = lanes_k[keep]
            with np.errstate(all="ignore"):
                res = self._lens_kernel(kind, *key, jj).call_stacked(self._kernel_inputs(
                    u, key, lanes_k, np.compress(keep, params, axis=1), anchor[lanes_k].T))
            out.append((lanes_k, res))
        return out

    def lens_anchor(self, u, paths, coords, j):
        """Position of each lane's vertex ``j + 1`` (the lens perturbation's fixed vertex), as
        its path kernel evaluates it, (B, 3); NaN where ``j == 0``."""
        out = np.full((len(u), 3), np.nan)
        coords = np.asarray(coords, np.int64)
        for t in np.unique(coords[j > 0]):
            lanes, res = self._run("positions", u, *self.techniques[t], paths,
                                   np.flatnonzero((coords == t) & (j > 0)))
            if not len(lanes):  # no lane has a path of that technique
                continue
            pos = res.T.reshape(len(lanes), -1, 3)
            out[lanes] = pos[np.arange(len(lanes)), j[lanes]]
        return out

    def lens_reached(self, u, paths, coords, j, anchor):
        """Lanes whose traced vertex ``j + 1`` is the fixed vertex ``anchor`` (to rounding: a
        lens proposal ``u`` traced as ``paths`` that reached it, not an occluder, and kept the
        structure before vertex ``j``, on which its aim was computed), (B,) bool."""
        x = self.lens_anchor(u, paths, coords, j)
        with np.errstate(invalid="ignore"):
            return (np.linalg.norm(x - anchor, axis=1)
                    <= LENS_REACH_TOL * (1.0 + np.linalg.norm(anchor, axis=1)))

    def lens_move(self, w, paths, coords, j, anchor, lanes, screen):
        """The lens perturbation's proposal (spec 5.3): states ``w`` with lanes ``lanes``
        moved to screen positions ``screen`` (len(lanes), 2) and their vertex ``j``'s
        spherical coordinates aimed from its new position (``paths``' structure held) at the
        fixed vertex ``anchor``; every other coordinate kept, so the path after vertex
        ``j + 1`` stays where it was. A copy of ``w``."""
        y = np.array(w, dtype=np.float64)
        y[lanes, self._screen:self._screen + 2] = screen
        for lanes_k, res in self._run_lens("lens_direction", y, paths, coords, j, anchor,
                                           lanes):
            for jj in np.unique(j[lanes_k]):
                sel = j[lanes_k] == jj
                omega = res.T[sel]
                y[np.ix_(lanes_k[sel], self.bsdf_dims[jj - 1][1:])] = spherical_coordinates(
                    omega / np.linalg.norm(omega, axis=1, keepdims=True))
        return y

    def lens_derivatives(self, u, paths, coords, j, anchor, lanes=None):
        """Value, gradient and Hessian of ``log lensScore`` in the screen position (spec 5.3)
        per lane: ``(log (B,), grad (B, 2), hess (B, 2, 2))``; -inf and zeros where ``j == 0``
        (or outside ``lanes``). lensScore is the target of the lens perturbation's variables
        (screen position, vertex ``j + 1`` by area, the other coordinates of ``u``):
        ``f*_w |d omega_j / d A_{j+1}| = f*_w |cos theta_{j+1}| / (d^2 2 pi^2 sin phi_j)``,
        i.e. ``f*_PSS`` with vertex ``j``'s factor ``p_bsdf(omega_j) |cos theta_{j+1}| / d^2``.
        It is the whole path's luminance, the fixed part's factors included (the luminance
        of an RGB product does not factor)."""
        coords = np.asarray(coords, np.int64)
        B = len(u)
        logf, grad, hess = np.full(B, -np.inf), np.zeros((B, 2)), np.zeros((B, 2, 2))
        lanes = np.arange(B) if lanes is None else lanes
        for lanes_k, res in self._run_lens("lens_hessian", u, paths, coords, j, anchor, lanes):
            ok = np.isfinite(res[0])
            lanes_k = lanes_k[ok]
            logf[lanes_k] = res[0][ok]
            grad[lanes_k] = res[1:3, ok].T
            hess[lanes_k, 0, 0], hess[lanes_k, 1, 1] = res[3][ok], res[5][ok]
            hess[lanes_k, 0, 1] = hess[lanes_k, 1, 0] = res[4][ok]
        return logf, grad, hess

    # ------------------------------------------------------------------ derivatives
    def log_f_derivatives(self, u, length, technique=None, *, paths=None, lanes=None):
        """Value, gradient and Hessian of ``log f*`` of technique ``(length, technique)``
        with respect to its primary samples ``u[:, dims(length, technique)]``, per lane:
        ``(logf (B,), grad (B, n), hess (B, n, n))``. ``technique=None``: of the sum over the
        techniques of ``length``, on ``dims(length)``. Lanes without a path get ``-inf`` and
        zero derivatives. ``paths``: the result of :meth:`trace` on the same ``u``
        (re-traced when omitted); ``lanes``: compute only these lanes (the others are left
        at -inf)."""
        if isinstance(technique, Paths) or not isinstance(paths, (Paths, type(None))):
            raise PathSpaceError("log_f_derivatives: paths must be a Paths from trace, "
                                 "passed as paths= (the third argument is the technique)")
        u = self._check_u(u)
        paths = self.trace(u) if paths is None else paths
        if technique is None:
            keys = [(length, s) for s in self.techniques_of(length)]
            return self._log_sum_derivatives(u, keys, self.dims(length), paths, lanes)
        if lanes is None:  # every lane: the rows are the whole batch
            return self.log_f_rows(u, length, technique, paths)
        lanes = np.unique(np.asarray(lanes, np.int64))
        return _batch_rows(u.shape[0], lanes, self.log_f_rows(u, length, technique, paths, lanes))

    def log_f_rows(self, u, length, technique, paths, lanes=None):
        """:meth:`log_f_derivatives` of one technique on the lanes ``lanes`` only (sorted; None:
        all), row ``i`` for lane ``lanes[i]``: ``(logf (m,), grad (m, n), hess (m, n, n))``
        (what a group of chains needs, without arrays of the whole batch)."""
        u = self._check_u(u)
        if lanes is not None:
            lanes = np.asarray(lanes, np.int64)
            if lanes.ndim != 1 or (len(lanes) and (
                    lanes[0] < 0 or lanes[-1] >= len(u) or (np.diff(lanes) <= 0).any())):
                raise PathSpaceError(f"log_f_rows: lanes must be sorted, unique lane indices "
                                     f"in [0, {len(u)})")
        n = len(self.dims(length, technique))
        m = len(u) if lanes is None else len(lanes)
        logf, grad, hess = np.full(m, -np.inf), np.zeros((m, n)), np.zeros((m, n, n))
        found, res = self._run("hessian", u, length, technique, paths, lanes)
        if not len(found):
            return logf, grad, hess
        # f* = 0 on an existing path (a BSDF gate): log f = -inf and no derivatives, as for
        # a missing path.
        ok = np.isfinite(res[0])
        found, res = found[ok], res[:, ok]
        at = found if lanes is None else np.searchsorted(lanes, found)
        logf[at] = res[0]
        grad[at] = res[1:n + 1].T
        hess[at] = res[n + 1:][_lower_index(n)].T.reshape(-1, n, n)
        if self.time_dim is not None:  # static paths: time is no H2MC dimension (spec 5.1)
            static = at[~paths.moving[found, self.techniques.index((length, technique))]]
            grad[static, self.time_dim] = 0.0
            hess[static, self.time_dim, :] = 0.0
            hess[static, :, self.time_dim] = 0.0
        return logf, grad, hess

    def branches(self, u, length, technique=None, paths=None):
        """The smooth piece each path of technique ``(length, technique)`` lies on: every
        branch decision of its contribution expression (``where`` conditions, which side of
        ``maximum`` / ``minimum`` / ``clamp`` / ``abs`` is taken), (B, m) bool, False for
        lanes without a path; ``technique=None``: both techniques' columns side by side. Two
        states whose structure (:meth:`Paths.same_structure`) and branches agree lie on the
        same smooth piece, where finite differences may be compared with the derivatives."""
        u = self._check_u(u)
        paths = self.trace(u) if paths is None else paths
        if technique is None:
            return np.concatenate([self.branches(u, length, s, paths)
                                   for s in self.techniques_of(length)], 1)
        lanes, res = self._run("branch", u, length, technique, paths)
        if res is None:
            return np.zeros((len(u), 0), bool)
        out = np.zeros((len(u), len(res)), bool)
        out[lanes] = res.T > 0.5
        return out

    def log_f_star_derivatives(self, u, paths=None, lanes=None):
        """Value, gradient and Hessian of ``log f*`` of the Kelemen state (the sum over all
        techniques) with respect to all of ``u``: ``(logf (B,), grad (B, dim), hess (B, dim,
        dim))``."""
        u = self._check_u(u)
        paths = self.trace(u) if paths is None else paths
        return self._log_sum_derivatives(u, self.techniques, np.arange(self.dim), paths, lanes)

    def log_sum_rows(self, u, keys, dims, paths, lanes=None):
        """Value, gradient and Hessian of ``log sum_t f*_t`` over the techniques ``keys`` on
        ``u[:, dims]`` (sorted), from the per-technique ones with ``w_t = f*_t / f*``:
        ``grad = sum_t w_t g_t`` and ``hess = sum_t w_t (H_t + g_t g_t^T) - grad grad^T``;
        rows as :meth:`log_f_rows`' (``lanes`` sorted; None: all)."""
        rows = slice(None) if lanes is None else lanes
        scores = [paths.f_star_of(*key)[rows] for key in keys]
        total = sum(scores)
        n = len(dims)
        grad, second = np.zeros((len(total), n)), np.zeros((len(total), n, n))
        with np.errstate(divide="ignore", invalid="ignore"):
            logf = np.log(total)
            for key, f in zip(keys, scores):
                lf, g, H = self.log_f_rows(u, *key, paths, lanes)
                w = np.where(np.isfinite(lf), f / total, 0.0)
                d = np.searchsorted(dims, self.dims(*key))
                grad[:, d] += w[:, None] * g
                second[:, d[:, None], d] += w[:, None, None] * (H + g[:, :, None] * g[:, None, :])
        return logf, grad, second - grad[:, :, None] * grad[:, None, :]

    def _log_sum_derivatives(self, u, keys, dims, paths, lanes):
        """:meth:`log_sum_rows` as whole-batch arrays (lanes outside ``lanes`` at -inf)."""
        if lanes is None:
            return self.log_sum_rows(u, keys, dims, paths)
        lanes = np.unique(np.asarray(lanes, np.int64))
        return _batch_rows(len(u), lanes, self.log_sum_rows(u, keys, dims, paths, lanes))
