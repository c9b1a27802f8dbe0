"""A short tour of core_ad: derivatives printed, then checked against finite differences.

Run with ``python -m core_ad.demo`` (the README's main job).
"""

from __future__ import annotations

import numpy as np

import core_ad as ad
import core_ad.numpy as anp


def _rosenbrock(v):
    return (1 - v[0]) ** 2 + 100 * (v[1] - v[0] ** 2) ** 2


def _rotation_loss(axis, angle, a, b):
    """|| R(normalize(axis), angle) a - b || with Rodrigues' rotation (Enoki's example)."""
    k = anp.normalize(axis)
    c, s = anp.cos(angle), anp.sin(angle)
    ra = a * c + anp.cross(k, a) * s + k * anp.sum(k * a) * (1 - c)
    return anp.norm(ra - b)


def main() -> int:
    np.set_printoptions(precision=6, suppress=True)
    print("core_ad", ad.__version__, "-", len(ad.primitives()), "primitives in the rule table\n")

    x0 = np.array([-1.2, 1.0])
    value, g = ad.value_and_grad(_rosenbrock)(x0)
    H = ad.hessian(_rosenbrock)(x0)
    print("Rosenbrock at (-1.2, 1):  f =", value, " grad =", g)
    print("  Hessian (forward-over-reverse) =\n", H)
    ad.check_grads(_rosenbrock, (x0,), order=2)
    print("  check_grads(order=2, fwd+rev) against central differences: ok\n")

    a = anp.normalize(np.array([2.0, 1.0, 3.0]))
    b = anp.normalize(np.array([-1.0, 2.0, 3.0]))
    axis, angle = np.array([1.0, 0.0, 0.0]), np.array(1.0)
    print("Enoki rotation fit by gradient descent (lr 0.2):")
    for it in range(20):
        loss, (g_axis, g_angle) = ad.value_and_grad(_rotation_loss, (0, 1))(axis, angle, a, b)
        if it in (0, 2, 19):
            print(f"  iteration {it:2d}: loss {float(loss):.7f}")
        axis = np.asarray(anp.normalize(axis - 0.2 * g_axis))
        angle = angle - 0.2 * g_angle
    ad.check_grads(_rotation_loss, (np.array([1.0, 0.2, 0.1]), np.array(1.0), a, b), order=1)
    print("  check_grads of the loss (all four inputs): ok\n")

    lanes = np.random.default_rng(0).uniform(-1, 1, (4096, 3))

    def throughput(x):
        return anp.cos(x[:, 0] * x[:, 1]) * anp.exp(-x[:, 2] ** 2) / (1 + x[:, 0] ** 2)

    gb, Hb = ad.batch_hessian(throughput, lanes)
    print(f"batch_hessian over {lanes.shape[0]} lanes: grad {gb.shape}, Hessian {Hb.shape},"
          f" max asymmetry {np.max(np.abs(Hb - Hb.transpose(0, 2, 1)))}")
    H0 = ad.hessian(lambda v: throughput(v[None, :])[0])(lanes[0])
    print("  lane 0 agrees with the dense hessian:", np.allclose(Hb[0], H0, rtol=1e-12), "\n")

    g2, H2 = ad.batch_hessian(throughput, lanes, compiled=True)
    print("compiled batch_hessian (symbolic gradient + Hessian in one kernel): max |difference|"
          f" to the traced one {np.max(np.abs(H2 - Hb)):.1e}\n")

    x = ad.sym.var("x")
    e = ad.sym.sin(x) * ad.sym.exp(-x * x) + ad.sym.log1p(x * x)
    kernel = ad.sym.compile([e, ad.sym.diff(e, x)], [x])
    xv = np.linspace(-2, 2, 1_000_001)
    value, deriv = kernel(xv)
    print(f"sym.compile on the {kernel.backend} backend: e(x) and de/dx over {xv.size} lanes;")
    fd = np.gradient(value, xv)[1:-1]
    print(f"  de/dx against central differences (step {xv[1] - xv[0]:.0e}): max error"
          f" {np.max(np.abs(deriv[1:-1] - fd)):.1e}\n")

    xs = ad.Array(np.array([-1.0, 0.0, 4.0]), requires_grad=True)
    with np.errstate(invalid="ignore"):  # sqrt(-1) in the masked-off lane
        anp.sum(anp.where(xs > 0, anp.sqrt(xs), 0.0)).backward()
    print("NaN-safe select: d/dx sum(where(x > 0, sqrt(x), 0)) at [-1, 0, 4] =", xs.grad)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
