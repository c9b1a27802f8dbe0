"""Small raster helpers for the examples: float images -> RGB8 panels -> PNG (Pillow).

Images in the examples are indexed ``[x, y]`` (the ``(W, H)`` layout of :mod:`lsq_opt`); the
helpers here take display-ordered ``(rows, cols[, channels])`` arrays."""
from __future__ import annotations

import os

import numpy as np

__all__ = ["to_rgb8", "side_by_side", "write_png", "read_png_size", "gray_to_rgb"]


def gray_to_rgb(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img, float)
    return np.repeat(img[..., None], 3, axis=-1)


def to_rgb8(img: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """(rows, cols), (rows, cols, 3) or (rows, cols, 4) floats -> (rows, cols, 3) uint8, scaled
    from [lo, hi] (default the image's own range). RGBA is composited over a light checkerboard."""
    img = np.asarray(img, float)
    if img.ndim == 2:
        img = gray_to_rgb(img)
    if img.shape[-1] == 4:
        rgb, a = img[..., :3], np.clip(img[..., 3:4], 0.0, 1.0)
        r, c = np.indices(img.shape[:2])
        bg = np.where(((r // 8 + c // 8) % 2 == 0)[..., None], 0.85, 0.65)
        img = rgb * a + bg * (1 - a)
    lo = float(np.nanmin(img)) if lo is None else lo
    hi = float(np.nanmax(img)) if hi is None else hi
    scale = (hi - lo) if hi > lo else 1.0
    out = np.clip((img - lo) / scale, 0.0, 1.0)
    out = np.nan_to_num(out, nan=0.0)
    return (out * 255.0 + 0.5).astype(np.uint8)


def side_by_side(panels: list[np.ndarray], gap: int = 4, upscale: int = 1) -> np.ndarray:
    """Concatenate RGB8 panels horizontally (top-aligned, white gap), nearest-neighbour upscaled."""
    panels = [np.repeat(np.repeat(p, upscale, 0), upscale, 1) for p in panels]
    h = max(p.shape[0] for p in panels)
    w = sum(p.shape[1] for p in panels) + gap * (len(panels) - 1)
    out = np.full((h, w, 3), 255, np.uint8)
    c = 0
    for p in panels:
        out[: p.shape[0], c: c + p.shape[1]] = p
        c += p.shape[1] + gap
    return out


def _pillow_image():
    try:
        import PIL.Image
    except ImportError as e:  # Pillow is the `examples` extra, not a core dependency
        raise ImportError("lsq_opt's examples write PNGs with Pillow: "
                          "pip install 'difvis-lsq-opt[examples]'") from e
    return PIL.Image


def write_png(path: str, rgb8: np.ndarray) -> str:
    """Write an (rows, cols, 3) uint8 array as an 8-bit RGB PNG; returns the path."""
    rgb8 = np.ascontiguousarray(rgb8, np.uint8)
    if rgb8.ndim != 3 or rgb8.shape[2] != 3:
        raise ValueError(f"write_png: expected (rows, cols, 3) uint8, got {rgb8.shape}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _pillow_image().fromarray(rgb8, "RGB").save(path)
    return path


def read_png_size(path: str) -> tuple[int, int]:
    """(width, height) of a PNG (for tests)."""
    with _pillow_image().open(path) as im:
        if im.format != "PNG":
            raise ValueError(f"{path} is not a PNG")
        return im.size
