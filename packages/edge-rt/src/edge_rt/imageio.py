"""PNG (sRGB, 8 bit, via Pillow) and EXR (linear float32, uncompressed scanlines) output."""

from __future__ import annotations

import struct

import numpy as np
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


def _attr(name, kind, data):
    return name.encode() + b"\0" + kind.encode() + b"\0" + struct.pack("<i", len(data)) + data


def write_exr(path, image):
    """Minimal OpenEXR 2 scanline file, no compression, FLOAT channels (B, G, R or Y)."""
    a = _array(image)
    h, w, c = a.shape
    names = ["Y"] if c == 1 else ["B", "G", "R"]
    planes = [a[..., 0]] if c == 1 else [a[..., 2], a[..., 1], a[..., 0]]
    chlist = b"".join(n.encode() + b"\0" + struct.pack("<iB3xii", 2, 0, 1, 1) for n in names)
    header = b"".join([
        struct.pack("<ii", 20000630, 2),
        _attr("channels", "chlist", chlist + b"\0"),
        _attr("compression", "compression", b"\0"),
        _attr("dataWindow", "box2i", struct.pack("<iiii", 0, 0, w - 1, h - 1)),
        _attr("displayWindow", "box2i", struct.pack("<iiii", 0, 0, w - 1, h - 1)),
        _attr("lineOrder", "lineOrder", b"\0"),
        _attr("pixelAspectRatio", "float", struct.pack("<f", 1.0)),
        _attr("screenWindowCenter", "v2f", struct.pack("<ff", 0.0, 0.0)),
        _attr("screenWindowWidth", "float", struct.pack("<f", 1.0)),
        b"\0",
    ])
    line_bytes = w * 4 * len(names)
    table_start = len(header)
    first = table_start + 8 * h
    offsets = struct.pack(f"<{h}Q", *[first + y * (8 + line_bytes) for y in range(h)])
    lines = [struct.pack("<ii", y, line_bytes)
             + b"".join(p[y].astype("<f4").tobytes() for p in planes) for y in range(h)]
    with open(path, "wb") as f:
        f.write(header + offsets + b"".join(lines))


def read_exr(path):
    """Reader for files written by :func:`write_exr` (used by the tests)."""
    data = open(path, "rb").read()
    pos, attrs = 8, {}
    while data[pos] != 0:
        end = data.index(b"\0", pos)
        name = data[pos:end].decode()
        tend = data.index(b"\0", end + 1)
        (size,) = struct.unpack("<i", data[tend + 1:tend + 5])
        attrs[name] = data[tend + 5:tend + 5 + size]
        pos = tend + 5 + size
    pos += 1
    x0, y0, x1, y1 = struct.unpack("<iiii", attrs["dataWindow"])
    w, h = x1 - x0 + 1, y1 - y0 + 1
    ch = attrs["channels"]
    names, p = [], 0
    while ch[p] != 0:
        e = ch.index(b"\0", p)
        names.append(ch[p:e].decode())
        p = e + 1 + 16
    pos += 8 * h
    out = np.zeros((h, w, len(names)), dtype=np.float32)
    for y in range(h):
        pos += 8
        for k in range(len(names)):
            out[y, :, k] = np.frombuffer(data[pos:pos + 4 * w], dtype="<f4")
            pos += 4 * w
    order = {"R": 0, "G": 1, "B": 2, "Y": 0}
    result = np.zeros_like(out)
    for k, n in enumerate(names):
        result[..., order[n]] = out[..., k]
    return result
