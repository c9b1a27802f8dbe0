"""Bilateral slice-and-apply layer of HDRNet (Gharbi et al. 2017; [P] sections 1 and 5.1.3,
Fig. 2, Listing 1, Table 1): a low-resolution grid of affine colour transforms is sliced
trilinearly at each full-resolution pixel ``(x, y, guide(x, y))`` and the sliced transform is
applied to the input pixel.

    s = w / gw (= h / gh, an integer)                   pixels per grid cell
    gx = (x + 0.5) / s,  fx = floor(gx - 0.5) = (x - s/2) div s,  wx = gx - 0.5 - fx (y alike)
    gz = clamp(guide(x, y, n), 0, 1) gd,  fz = floor(gz - 0.5),  wz = gz - 0.5 - fz
    coeff(x, y, k, n) = sum over the 8 corners of repeat_edge(grid)(fx+i, fy+j, fz+l, k, n)
                        * (i ? wx : 1-wx) (j ? wy : 1-wy) (l ? wz : 1-wz)
    output(x, y, co, n) = coeff(x, y, co (ci+1) + ci, n)                      (the offset)
    output(x, y, co, n) += coeff(x, y, co (ci+1) + r, n) * input(x, y, r, n),  r < ci

Grid cells are centred at ``(i + 0.5) s`` (the Fig. 2 CUDA reference's convention). ``fx`` is
the integer division of the paper's Listing 1, so the adjoint of the grid gathers each cell's
``s x s`` preimage pixels in x and y (race-free and parallel over cells) and scatters in z.
Inputs: ``grid`` ``(n, co (ci + 1), gd, gh, gw)``, ``guide`` ``(n, h, w)``, ``image``
``(n, ci, h, w)``, all float32 or all float64. Output ``output``: ``(n, co, h, w)``.
Gradients: ``adjoint_pipeline(hl, app, d_out, ("grid", "guide", "image"))`` (``_common``).
"""
from __future__ import annotations


from ._common import App, check_shape, contiguous, float_type, shape


def build(hl, grid, guide, image):
    check_shape("grid", grid, 5, "(n, co (ci + 1), gd, gh, gw)")
    check_shape("guide", guide, 3, "(n, h, w)")
    check_shape("image", image, 4, "(n, ci, h, w)")
    n, ci, h, w = shape(image)
    gn, gc, gd, gh, gw = shape(grid)
    if shape(guide) != (n, h, w) or gn != n:
        raise ValueError(f"guide must be ({n}, {h}, {w}) and grid ({n}, ...) for image "
                         f"{shape(image)}, got {shape(guide)} and {shape(grid)}")
    if gc % (ci + 1):
        raise ValueError(f"grid channels ({gc}) must be a multiple of ci + 1 = {ci + 1}")
    if w % gw or h % gh or w // gw != h // gh:
        raise ValueError(f"the image ({h} x {w}) must be the grid ({gh} x {gw}) times one "
                         "integer cell size")
    co, s = gc // (ci + 1), w // gw
    dt, t = float_type(hl, grid, guide, image)
    grid, guide, image = (contiguous(a) for a in (grid, guide, image))
    x, y, z, k, b = hl.Var("x"), hl.Var("y"), hl.Var("z"), hl.Var("k"), hl.Var("n")
    gb, gu, im = (hl.Buffer(grid, name="grid"), hl.Buffer(guide, name="guide"),
                  hl.Buffer(image, name="image"))
    src = hl.BoundaryConditions.repeat_edge(gb)

    def cell(v):
        f = (v - s // 2) / s                                  # floor division
        return f, (hl.cast(t, v) + 0.5) * (1.0 / s) - 0.5 - hl.cast(t, f)

    fx, wx = cell(x)
    fy, wy = cell(y)
    gz = hl.clamp(gu[x, y, b], 0.0, 1.0) * float(gd) - 0.5
    fzf = hl.floor(gz)
    fz, wz = hl.i32(fzf), gz - fzf
    coeff = hl.Func("coeff")
    terms = []
    for i, kx in ((0, 1.0 - wx), (1, wx)):
        for j, ky in ((0, 1.0 - wy), (1, wy)):
            for l_, kz in ((0, 1.0 - wz), (1, wz)):
                terms.append(src[fx + i, fy + j, fz + l_, k, b] * (kx * ky * kz))
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    coeff[x, y, k, b] = total
    r = hl.RDom([hl.Range(0, ci)])
    out = hl.Func("bilateral_slice")
    out[x, y, z, b] = coeff[x, y, z * (ci + 1) + ci, b]
    out[x, y, z, b] += coeff[x, y, z * (ci + 1) + r.x, b] * im[x, y, r.x, b]
    return App(hl, outputs={"output": out}, funcs={"src": src, "coeff": coeff},
               vars={"x": x, "y": y, "z": z, "k": k, "n": b}, sizes={"output": [w, h, co, n]},
               rdoms={"r": r}, buffers={"grid": gb, "guide": gu, "image": im},
               meta={"dtype": dt, "cell": s})


def torch_reference(torch, grid, guide, image):
    """The paper's PyTorch version (Fig. 2, middle): the 8 trilinear corners gathered by
    advanced indexing ``grid[n, :, z, y, x]`` with clamped indices, then the affine transform
    as a channel sum. Its backward scatters (``index_put`` with accumulation)."""
    n, ci, h, w = image.shape
    _, gc, gd, gh, gw = grid.shape
    dt = image.dtype
    gx = (torch.arange(w, dtype=dt, device=image.device) + 0.5) * (gw / w)
    gy = (torch.arange(h, dtype=dt, device=image.device) + 0.5) * (gh / h)
    gz = guide.clamp(0, 1) * gd
    fx, fy, fz = torch.floor(gx - 0.5), torch.floor(gy - 0.5), torch.floor(gz - 0.5)
    wx, wy, wz = gx - 0.5 - fx, gy - 0.5 - fy, gz - 0.5 - fz          # (w,), (h,), (n, h, w)
    fx, fy, fz = fx.long(), fy.long(), fz.long()
    bi = torch.arange(n, device=image.device)[:, None, None]
    coeff = 0
    for i, kx in ((0, 1 - wx), (1, wx)):
        cx = (fx + i).clamp(0, gw - 1)[None, None, :]
        for j, ky in ((0, 1 - wy), (1, wy)):
            cy = (fy + j).clamp(0, gh - 1)[None, :, None]
            for l_, kz in ((0, 1 - wz), (1, wz)):
                cz = (fz + l_).clamp(0, gd - 1)
                v = grid.permute(0, 2, 3, 4, 1)[bi, cz, cy, cx]            # (n, h, w, gc)
                wgt = kz * ky[None, :, None] * kx[None, None, :]
                coeff = coeff + v * wgt[..., None]
    co = gc // (ci + 1)
    a = coeff.reshape(n, h, w, co, ci + 1)
    out = (a[..., :ci] * image.permute(0, 2, 3, 1)[:, :, :, None, :]).sum(-1) + a[..., ci]
    return out.permute(0, 3, 1, 2)


def torch_grid_sample(torch, grid, guide, image):
    """The same slicing as one trilinear ``grid_sample`` over ``(gd, gh, gw)`` (border
    padding, ``align_corners=False``: its cell centres are ours), then the affine transform."""
    n, ci, h, w = image.shape
    _, gc, gd, gh, gw = grid.shape
    dt = image.dtype
    xs = (2 * torch.arange(w, dtype=dt, device=image.device) + 1) / w - 1
    ys = (2 * torch.arange(h, dtype=dt, device=image.device) + 1) / h - 1
    zs = guide.clamp(0, 1) * 2 - 1
    pos = torch.stack([xs.expand(n, h, w), ys[:, None].expand(n, h, w), zs], -1)
    coeff = torch.nn.functional.grid_sample(grid, pos[:, None], mode="bilinear",
                                            padding_mode="border", align_corners=False)[:, :, 0]
    co = gc // (ci + 1)
    a = coeff.reshape(n, co, ci + 1, h, w)
    return (a[:, :, :ci] * image[:, None]).sum(2) + a[:, :, ci]
