"""PNG output (through Pillow) and a heat-map colour ramp for histograms."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pillow_image():
    try:
        import PIL.Image
    except ImportError as e:  # Pillow is the `examples` extra: the sampler does not need it
        raise ImportError("h2mc writes PNGs with Pillow: pip install 'difvis-h2mc[examples]'") from e
    return PIL.Image


def write_png(path, image) -> Path:
    """Write ``image`` (``(H, W)`` grey or ``(H, W, 3)`` RGB; uint8, or floats in [0, 1])."""
    a = np.asarray(image)
    if a.dtype != np.uint8:
        a = (np.clip(np.nan_to_num(a.astype(np.float64)), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)):
        raise ValueError(f"write_png: need (H, W) or (H, W, 3), got {a.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _pillow_image().fromarray(np.ascontiguousarray(a), "L" if a.ndim == 2 else "RGB").save(path, "PNG")
    return path


def write_comparison_png(path, reference, images, floor=1e-2) -> Path:
    """The reference and ``images`` (linear RGB, (H, W, 3)) side by side, tone-mapped alike
    (the reference's 99th percentile to white, gamma 2.2), above their per-pixel relMSE maps
    against the reference (``(I - R)^2 / (R^2 + floor)``, one colour scale: the 99th
    percentile of the images' maps)."""
    images = [reference, *images]
    scale = np.percentile(reference, 99) or 1.0
    top = np.concatenate([np.clip(x / scale, 0.0, 1.0) ** (1 / 2.2) for x in images], 1)
    errs = [((x - reference) ** 2 / (reference ** 2 + floor)).mean(2) for x in images]
    vmax = max(float(np.percentile(e, 99)) for e in errs[1:]) or 1.0
    bottom = np.concatenate([heatmap(e, vmax) for e in errs], 1)
    return write_png(path, np.concatenate([top, bottom], 0))


def read_png_size(path) -> tuple[int, int]:
    """``(width, height)`` of a PNG (for tests)."""
    with _pillow_image().open(path) as im:
        if im.format != "PNG":
            raise ValueError(f"{path}: not a PNG")
        return im.size


def heatmap(values, vmax=None) -> np.ndarray:
    """Map non-negative values to RGB in [0, 1] (black -> red -> yellow -> white)."""
    v = np.asarray(values, dtype=np.float64)
    vmax = float(v.max()) if vmax is None else float(vmax)
    t = np.clip(v / vmax, 0, 1) if vmax > 0 else np.zeros_like(v)
    return np.stack([np.clip(3 * t, 0, 1), np.clip(3 * t - 1, 0, 1), np.clip(3 * t - 2, 0, 1)],
                    axis=-1)


def histogram_png(path, hists, scale: int = 4, gap: int = 4) -> Path:
    """Write 2D histograms ``[i_x, i_y]`` side by side (shared colour scale), y pointing up."""
    hists = [np.asarray(h, dtype=np.float64) for h in hists]
    vmax = max(float(h.max()) for h in hists)
    tiles = []
    for h in hists:
        img = heatmap(h.T[::-1], vmax)  # rows = y (top = 1), columns = x
        tiles.append(np.kron(img, np.ones((scale, scale, 1))))
    H = max(t.shape[0] for t in tiles)
    parts = []
    for i, t in enumerate(tiles):
        if i:
            parts.append(np.ones((H, gap, 3)))
        parts.append(t)
    return write_png(path, np.concatenate(parts, axis=1))
