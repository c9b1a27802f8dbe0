"""Constant or mip-mapped textures with trilinear lookup, differentiable in torch (spec 2.4)."""

from __future__ import annotations

import math

import torch


class Texture:
    """A constant (C,) value or an (H, W, C) texel grid with a mip pyramid built by 2x2 box
    averaging. UVs wrap around (repeat). Gradients reach the texels through the bilinear
    weights of both mip levels."""

    def __init__(self, values):
        values = torch.as_tensor(values) if not torch.is_tensor(values) else values
        if values.dim() == 0:
            values = values.reshape(1)
        if values.dim() not in (1, 3):
            raise ValueError(f"Texture: values must be (C,) or (H, W, C), got shape "
                             f"{tuple(values.shape)}")
        if not torch.isfinite(values.detach()).all():
            raise ValueError("Texture: values contain NaN or infinity")
        self._set(values)

    @classmethod
    def _unchecked(cls, values):
        """A Texture of values already validated (a scene rebuilt with substituted tensors)."""
        t = cls.__new__(cls)
        t._set(values)
        return t

    def _set(self, values):
        self.values = values
        self._pyramid_cache = None  # ((data pointer, version), levels) of an untracked build

    @property
    def is_constant(self) -> bool:
        return self.values.dim() == 1

    @property
    def channels(self) -> int:
        return self.values.shape[-1]

    def pyramid(self):
        """Mip levels, finest first, each (H, W, C). Outside autograd (forward renders) the
        pyramid is built once and reused until the texels change (an optimiser's in-place
        step bumps their version); a build autograd tracks is never cached, since its graph
        is freed by the first backward pass through it."""
        if torch.is_grad_enabled() and self.values.requires_grad:
            return self._build_pyramid()
        key = (self.values.data_ptr(), self.values._version)
        if self._pyramid_cache is None or self._pyramid_cache[0] != key:
            self._pyramid_cache = (key, self._build_pyramid())
        return self._pyramid_cache[1]

    def _build_pyramid(self):
        levels = [self.values]
        while min(levels[-1].shape[:2]) > 1:
            t = levels[-1]
            h, w = t.shape[0] // 2 * 2, t.shape[1] // 2 * 2
            t = t[:h, :w]
            levels.append(0.25 * (t[0::2, 0::2] + t[1::2, 0::2] + t[0::2, 1::2] + t[1::2, 1::2]))
        return levels

    def lookup(self, uv, level=None, dtype=None):
        """Values at ``uv`` (N, 2); ``level`` (N,) is the fractional mip level (0 = finest;
        None = finest, i.e. bilinear)."""
        dtype = dtype or uv.dtype
        n = uv.shape[0]
        if self.is_constant:
            return self.values.to(dtype).expand(n, self.channels)
        levels = self.pyramid()
        if level is None:
            return _bilinear(levels[0].to(dtype), uv)
        level = torch.clamp(level.detach(), 0.0, len(levels) - 1.0)
        lo = torch.floor(level).long()
        frac = (level - lo.to(level.dtype)).to(dtype)[:, None]
        out = torch.zeros((n, self.channels), dtype=dtype)
        for k in range(len(levels)):
            on_lo, on_hi = lo == k, (lo + 1) == k
            if not (on_lo.any() or on_hi.any()):
                continue
            value = _bilinear(levels[k].to(dtype), uv)
            out = out + torch.where(on_lo[:, None], (1.0 - frac) * value, 0.0)
            out = out + torch.where(on_hi[:, None], frac * value, 0.0)
        return out

    def mip_level(self, texels_per_unit_footprint):
        """Fractional mip level for a footprint given in finest-level texels."""
        return torch.log2(torch.clamp(texels_per_unit_footprint, min=1.0))


def _bilinear(tex, uv):
    h, w = tex.shape[0], tex.shape[1]
    x = uv[:, 0] * w - 0.5
    y = (1.0 - uv[:, 1]) * h - 0.5  # v points up, rows go down
    x0, y0 = torch.floor(x.detach()), torch.floor(y.detach())
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]
    x0, y0 = x0.long(), y0.long()
    x1, y1 = (x0 + 1) % w, (y0 + 1) % h
    x0, y0 = x0 % w, y0 % h
    return ((1 - fx) * (1 - fy) * tex[y0, x0] + fx * (1 - fy) * tex[y0, x1]
            + (1 - fx) * fy * tex[y1, x0] + fx * fy * tex[y1, x1])


def direction_to_latlong(d):
    """Equirectangular UV of unit directions (y up): u from azimuth, v from elevation."""
    u = torch.atan2(d[:, 0], -d[:, 2]) / (2.0 * math.pi) + 0.5
    v = 1.0 - torch.acos(torch.clamp(d[:, 1], -1.0, 1.0)) / math.pi
    return torch.stack([u, v], 1)
