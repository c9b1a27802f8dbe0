"""PNG (sRGB, 8 bit, via Pillow) and EXR (linear float32, via the OpenEXR bindings) output."""

from __future__ import annotations

import numpy as np
import OpenEXR
import torch
from PIL import Image


def _array(image):
    a = image.detach().cpu().numpy() if torch.is_tensor(image) else np.asarray(image)
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[2] not in (1, 3):
        raise ValueError(f"image must be (H, W), (H, W, 1) or (H, W, 3), got {a.shape}")
    return a.astype(np.float32)


def to_srgb8(image):
    a = np.clip(_array(image), 0.0, 1.0)
    srgb = np.where(a <= 0.0031308, 12.92 * a, 1.055 * a ** (1 / 2.4) - 0.055)
    return (srgb * 255.0 + 0.5).astype(np.uint8)


def write_png(path, image):
    a = to_srgb8(image)
    Image.fromarray(a[..., 0] if a.shape[2] == 1 else a).save(path)


def write_exr(path, image):
    """Linear float32 OpenEXR (ZIP compression): RGB, or Y for one channel."""
    a = _array(image)
    channels = {"Y": a[..., 0]} if a.shape[2] == 1 else {"RGB": a}
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    OpenEXR.File(header, channels).write(str(path))


def read_exr(path):
    """(H, W, C) float32 array of an EXR written by ``write_exr`` (or any RGB / Y file)."""
    with OpenEXR.File(str(path)) as f:
        channels = f.channels()
        key = "RGB" if "RGB" in channels else "Y"
        if key not in channels:
            raise ValueError(f"read_exr: {path} has channels {sorted(channels)}, not RGB or Y")
        a = np.asarray(channels[key].pixels, dtype=np.float32)
    return a[..., None] if a.ndim == 2 else a
