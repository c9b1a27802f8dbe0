"""Derivative checks for edge_rt scenes (used by its tests; public so users can check their own
scenes): float64 reference paths, central differences with common random numbers (same seed),
rel-L1 over all components (spec section 9)."""

from __future__ import annotations

import numpy as np
import torch

import edge_rt
from edge_rt import Camera, Material, Mesh, Scene, look_at


def camera(resolution=(32, 32), fov=45.0, position=(0.0, 0.0, 0.0), target=(0.0, 0.0, 1.0),
           **kw):
    return Camera(look_at(position, target), fov=fov, resolution=resolution, **kw)


def emitter(vertices, radiance=(1.0, 1.0, 1.0), name="tri"):
    """Triangles emitting ``radiance`` toward a camera on the -z side (winding chosen so)."""
    v = torch.as_tensor(np.asarray(vertices, dtype=np.float64)).reshape(-1, 3)
    faces = np.arange(len(v)).reshape(-1, 3)
    n = np.cross(v[faces[:, 1]] - v[faces[:, 0]], v[faces[:, 2]] - v[faces[:, 0]])
    faces = np.where((n[:, 2] > 0)[:, None], faces[:, ::-1], faces).copy()
    return Mesh(v, faces, Material(diffuse=(0.0, 0.0, 0.0)), emission=radiance, name=name)


def rel_l1(g, ref):
    g, ref = np.asarray(g, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(g - ref).sum() / np.abs(ref).sum())


def with_param(scene, getter, setter, value):
    """A copy of ``scene`` whose parameter (found by ``getter``) is replaced by ``value``."""
    tensors = scene.tensors()
    target = getter(scene)
    idx = next(i for i, t in enumerate(tensors) if t is target)
    tensors = list(tensors)
    tensors[idx] = value
    return scene.with_tensors(tensors), idx


def loss_gradient(scene, getter, adjoint, **kw):
    """d<adjoint, render(scene)>/d(parameter) through edge_rt.gradients (float64)."""
    kw.setdefault("dtype", torch.float64)
    kw.setdefault("progress", False)
    grads = edge_rt.gradients(scene, adjoint, **kw)
    idx = next(i for i, t in enumerate(scene.tensors()) if t is getter(scene))
    return grads[idx].detach().numpy()


def fd_gradient(scene, getter, adjoint, h, components=None, **kw):
    """Central differences of <adjoint, render> with common random numbers (same seed)."""
    kw.setdefault("dtype", torch.float64)
    kw.setdefault("progress", False)
    base = getter(scene).detach().clone()
    flat = base.reshape(-1)
    comps = range(flat.numel()) if components is None else components
    out = np.zeros(flat.numel())
    adj = torch.as_tensor(adjoint, dtype=kw["dtype"])
    for c in comps:
        vals = []
        for sign in (1.0, -1.0):
            p = flat.clone()
            p[c] += sign * h
            sc, _ = with_param(scene, getter, None, p.reshape(base.shape))
            vals.append(float((edge_rt.render_image(sc, **kw) * adj).sum()))
        out[c] = (vals[0] - vals[1]) / (2.0 * h)
    return out.reshape(base.shape)


def single_scene(meshes, cam=None, envmap=None):
    return Scene(cam or camera(), list(meshes), envmap)


def fd_directional(scene, getter, adjoint, direction, h, **kw):
    """Central difference of <adjoint, render> along ``direction`` in the parameter's space
    (common random numbers): compare with ``(gradient * direction).sum()``."""
    kw.setdefault("dtype", torch.float64)
    kw.setdefault("progress", False)
    base = getter(scene).detach().clone()
    step = torch.as_tensor(direction, dtype=base.dtype).reshape(base.shape) * h
    adj = torch.as_tensor(adjoint, dtype=kw["dtype"])
    vals = []
    for sign in (1.0, -1.0):
        sc, _ = with_param(scene, getter, None, base + sign * step)
        vals.append(float((edge_rt.render_image(sc, **kw) * adj).sum()))
    return (vals[0] - vals[1]) / (2.0 * h)
