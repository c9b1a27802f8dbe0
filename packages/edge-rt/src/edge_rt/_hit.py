"""Surface interactions without derivatives (the forward render): one compiled kernel per
batch that gathers each hit triangle's vertices and uvs from the scene tables by triangle id
and returns everything ``Geometry.interact`` builds, instead of ~25 torch operations (table
gathers, the intersection kernel's column copies, barycentric interpolation, the side
flips); those were a quarter of a forward render."""

from __future__ import annotations

import numpy as np

from core_ad import sym

from ._compiled import columns, run_kernel

_KERNELS: dict = {}


def _hit_expressions(dtype):
    """(o, d, tri, triangle vertex table (T * 9), triangle uv table (T * 6)) -> (p, t, ng
    toward the viewer, b1, b2, area, uv, 1 where the ray hit the front side)."""
    from .geometry import _ray_triangle_expressions

    corners, (px, py, pz, t, nx, ny, nz, b1, b2, area) = _ray_triangle_expressions(dtype)
    tri = sym.var("tri", "int64")
    verts, uvs = sym.buffer("tri_verts", dtype), sym.buffer("tri_uvs", dtype)
    row = {c: sym.gather(verts, tri * 9 + k) for k, c in enumerate(corners[:9])}
    p, t, ng, b1, b2, area = (sym.substitute(x, row) for x in ([px, py, pz], t, [nx, ny, nz],
                                                                   b1, b2, area))
    d = corners[12:15]
    front = (ng[0] * d[0] + ng[1] * d[1] + ng[2] * d[2]) < 0.0
    sign = sym.where(front, sym.const(1.0, dtype), sym.const(-1.0, dtype))
    b0 = 1.0 - b1 - b2
    uv = [b0 * sym.gather(uvs, tri * 6 + j) + b1 * sym.gather(uvs, tri * 6 + 2 + j)
          + b2 * sym.gather(uvs, tri * 6 + 4 + j) for j in range(2)]
    outputs = (p + [t] + [x * sign for x in ng] + [b1, b2, area] + uv
               + [sym.where(front, sym.const(1.0, dtype), sym.const(0.0, dtype))])
    return corners[9:15] + [tri, verts, uvs], outputs


def hit_values(tri, o, d, tri_verts, tri_uvs):
    """(p, t, ng toward the viewer, barycentrics (b1, b2) (N, 2), area, uv, front (bool)) of
    rays ``o``, ``d`` (N, 3) hitting triangles ``tri`` of the tables ``tri_verts`` (T, 3, 3)
    and ``tri_uvs`` (T, 3, 2); detached."""
    dtype = str(o.dtype).removeprefix("torch.")
    if dtype not in _KERNELS:
        inputs, outputs = _hit_expressions(dtype)
        _KERNELS[dtype] = sym.compile(outputs, inputs)
    n = o.shape[0]
    if n == 0:
        out = o.new_zeros(0, 13)
    else:
        tables = [x.detach().reshape(-1).numpy() for x in (tri_verts, tri_uvs)]
        out = run_kernel(_KERNELS[dtype], [*columns([o, d]), tri.numpy().astype(np.int64),
                                           *tables], n)
    return (out[:, 0:3], out[:, 3], out[:, 4:7], out[:, 7:9], out[:, 9], out[:, 10:12],
            out[:, 12] > 0)
