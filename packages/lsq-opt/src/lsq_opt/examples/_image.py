"""Small raster helpers for the examples: float images -> RGB8 panels -> PNG.

PNG writing uses Pillow when it is importable and otherwise a minimal built-in encoder
(zlib + struct from the standard library), so the examples never need matplotlib.
Images in the examples are indexed ``[x, y]`` (the ``(W, H)`` layout of :mod:`lsq_opt`); the
helpers here take display-ordered ``(rows, cols[, channels])`` arrays."""
from __future__ import annotations

import os
import struct
import zlib

import numpy as np

__all__ = ["to_rgb8", "side_by_side", "write_png", "png_backend", "gray_to_rgb"]


def png_backend() -> str:
    try:
        import PIL.Image  # noqa: F401
        return "pillow"
    except Exception:
        return "builtin"


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


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def write_png(path: str, rgb8: np.ndarray) -> str:
    """Write an (rows, cols, 3) uint8 array as an 8-bit RGB PNG; returns the path."""
    rgb8 = np.ascontiguousarray(rgb8, np.uint8)
    if rgb8.ndim != 3 or rgb8.shape[2] != 3:
        raise ValueError(f"write_png: expected (rows, cols, 3) uint8, got {rgb8.shape}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if png_backend() == "pillow":
        import PIL.Image
        PIL.Image.fromarray(rgb8, "RGB").save(path)
        return path
    h, w, _ = rgb8.shape
    raw = b"".join(b"\x00" + rgb8[r].tobytes() for r in range(h))  # filter type 0 per row
    data = (b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(raw, 6))
            + _chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(data)
    return path


def read_png_size(path: str) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR (for tests)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])
