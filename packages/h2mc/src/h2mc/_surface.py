"""What a traced surface interaction allows (the side a direction may leave to, the relative
index of refraction) and the per-vertex choice between the opaque and the dielectric BSDF's
expressions: shared by the unidirectional and the bidirectional techniques."""

from __future__ import annotations

import dataclasses

import torch

from core_ad import sym
from edge_rt import bsdf


def sides_ok(si, wo, glass):
    """Whether ``wo`` may leave the interactions: on the viewer's side of opaque surfaces;
    on either side of a dielectric where the geometric and shading normals agree (edge_rt's
    dielectric bounce rejects light leaks)."""
    cos_g = (si.ng * wo).sum(1)
    return torch.where(glass, cos_g * (si.ns * wo).sum(1) > 0, cos_g > 0)


def relative_eta(geometry, si):
    """(N,) relative index of refraction at the interactions (edge_rt.bsdf.relative_eta), 0 on
    opaque ones."""
    eta = geometry.eta(si)
    glass = eta > 0
    return torch.where(glass, bsdf.relative_eta(torch.where(glass, eta, 1.0), si.front), 0.0)


def subset(si, rows):
    """The interactions ``rows`` of ``si``."""
    return dataclasses.replace(si, **{f.name: getattr(si, f.name)[rows]
                                      for f in dataclasses.fields(si)})


def by_material(glass, dielectric, opaque):
    """The expressions ``dielectric()`` on glass vertices, ``opaque()`` elsewhere (lists, one
    per component): a per-lane ``where`` when ``glass`` is an expression (a kernel holding both
    BSDFs), only the one it names when it is a bool (a kernel specialised to the vertex's
    material, which then differentiates one BSDF)."""
    if isinstance(glass, bool):
        return list(dielectric() if glass else opaque())
    return [sym.where(glass, a, b) for a, b in zip(dielectric(), opaque())]
