"""H2MC steps per second for many chains: h2mc on core_ad vs the same sampler in JAX.

Both sides run the pure H2MC kernel (spec 4.4-4.7: closed-form dynamics, exact offsets, prior
variance sigma2, flat-direction and isotropic fallbacks, MH with forward and reverse densities,
wrap-around) on ``B`` chains of the same n-dimensional target, in float64:

* ``h2mc (core_ad compiled)``: ``h2mc.Sampler`` with ``Target(..., derivatives="compiled")``,
  i.e. one ``core_ad`` compiled (LLVM) gradient+Hessian kernel call per step for the batch,
  core_ad's compiled per-lane Jacobi eigen-solver (``core_ad.eigh``) and numpy for the rest;
* ``h2mc (numpy eigh)``: the compiled case with numpy's batched ``eigh`` in place of
  ``core_ad.eigh`` (the sampler as it was before the per-lane eigen-solver), so the run prints
  what the eigen-solver buys;
* ``h2mc (core_ad traced)``: the same with ``core_ad.batch_hessian`` on tracing arrays;
* ``jax.jit(jax.vmap(step))``: one H2MC step per lane written in jax.numpy with
  ``jax.hessian`` / ``jax.grad`` and ``jnp.linalg.eigh``, vmapped over the chains and jitted
  (random numbers drawn inside the jitted step with ``jax.random``).

Before timing, the two compute the same thing: log f, gradients, Hessians, the proposal means and
covariances at the same states, and one MH step from the same states with the same normal draws
and uniforms (same moves). Compile/JIT time is reported separately. Median of ``--repeats`` runs
of ``--steps`` steps each, cases alternated. Run from the repository root:

    .venv/bin/python packages/h2mc/benchmarks/bench_sampler.py            # B = 10^4, n = 8, 16
    .venv/bin/python packages/h2mc/benchmarks/bench_sampler.py --B 1000 --n 8
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import core_ad
import core_ad.numpy as anp  # noqa: E402
import h2mc  # noqa: E402
import numpy as np
from core_ad import benchmark as bench

SIGMA2 = 1e-2


def make_log_f(n, sin, cos, col):
    """The benchmark target, written once for both sides: ``col(x, j)`` is coordinate j."""
    def log_f(x):
        s = 0.0
        for j in range(n):
            xj = col(x, j)
            d = xj - 0.5 - 0.1 * sin(6.0 * col(x, (j + 1) % n))
            s = s - d * d / (2 * 0.002) + 0.3 * cos(5.0 * xj * col(x, (j + 2) % n))
        return s
    return log_f


# ----------------------------------------------------------------------------- JAX side
def jax_sampler(n, sigma2, T=np.pi / 2, eps=1e-10, min_var=1e-10, min_f=1e-15, fb=0.5):
    import jax
    import jax.numpy as jnp

    lane_log_f = make_log_f(n, jnp.sin, jnp.cos, lambda x, j: x[j])
    inv_s2 = 1.0 / sigma2
    sh, ch = np.sinh(T), np.cosh(T)

    def gaussian(lf, g, H):
        bad = ~(jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(H)))
        g = jnp.where(bad, 0.0, g)
        H = jnp.where(bad, 0.0, H)
        H = 0.5 * (H + H.T)
        lam, E = jnp.linalg.eigh(H)
        ge = E.T @ g
        flat = jnp.abs(lam) <= eps
        a = jnp.where(flat, 0.0, 1.0 / jnp.where(flat, 1.0, jnp.abs(lam)))
        beta = a * ge
        # alpha = sign(lam) in {-1, 0, 1}: closed forms at T (exact offsets)
        s = jnp.where(lam > eps, sh, jnp.where(lam < -eps, np.sin(T), T))
        o = jnp.where(lam > eps, beta * (ch - 1.0),
                      jnp.where(lam < -eps, -beta * (np.cos(T) - 1.0), 0.0))
        v = s * s * a
        small = v <= min_var
        inv_v = jnp.where(small, 0.0, 1.0 / jnp.where(small, 1.0, v))
        prec = inv_v + inv_s2
        m = inv_v / prec * o
        iso = bad | (jnp.sqrt(jnp.sum(H * H)) < fb * inv_s2) | ~(lf > np.log(min_f))
        E = jnp.where(iso, jnp.eye(n), E)
        prec = jnp.where(iso, inv_s2, prec)
        m = jnp.where(iso, 0.0, m)
        return E, prec, E @ m

    def log_dens(z, E, prec, mean):
        w = E.T @ (z - mean)
        return 0.5 * jnp.sum(jnp.log(prec)) - 0.5 * jnp.sum(prec * w * w)

    def derivs(x):
        return lane_log_f(x), jax.grad(lane_log_f)(x), jax.hessian(lane_log_f)(x)

    def init_lane(x):
        lf, g, H = derivs(x)
        return (x, lf) + gaussian(lf, g, H)

    def lane_step(x, lf, E, prec, mean, xi, u):
        z = mean + E @ (xi / jnp.sqrt(prec))
        y = x + z
        y = y - jnp.floor(y)
        y = jnp.where(y >= 1.0, 0.0, y)
        lfy, gy, Hy = derivs(y)
        Ey, precy, meany = gaussian(lfy, gy, Hy)
        la = lfy - lf + log_dens(-z, Ey, precy, meany) - log_dens(z, E, prec, mean)
        la = jnp.where(jnp.isfinite(lfy) & ~jnp.isnan(la), la, -jnp.inf)
        acc = jnp.log(u) < la
        pick = lambda new, old: jnp.where(acc, new, old)  # noqa: E731
        return (pick(y, x), pick(lfy, lf), pick(Ey, E), pick(precy, prec), pick(meany, mean),
                acc)

    vstep = jax.vmap(lane_step)

    @jax.jit
    def step(state, key):
        key, k1, k2 = jax.random.split(key, 3)
        B = state[0].shape[0]
        xi = jax.random.normal(k1, (B, n), dtype=jnp.float64)
        u = jax.random.uniform(k2, (B,), dtype=jnp.float64)
        out = vstep(*state, xi, u)
        return out[:5], out[5], key

    return {"init": jax.jit(jax.vmap(init_lane)), "step": step, "derivs": jax.jit(jax.vmap(derivs)),
            "lane_step": jax.jit(vstep), "gaussian": jax.jit(jax.vmap(gaussian))}


# ----------------------------------------------------------------------------- checks
def check_same(n, B, ours_target, J, seed=0):
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    x = 0.5 + 0.03 * rng.standard_normal((B, n))  # near the mode: few isotropic fallbacks
    x = x - np.floor(x)
    lf = ours_target.log_f(x)
    g, H = ours_target.derivatives(x)
    lfj, gj, Hj = (np.asarray(a) for a in J["derivs"](jnp.asarray(x)))
    errs = {"log f": bench.max_rel_diff(lfj, lf), "grad": bench.max_rel_diff(gj, g),
            "hess": bench.max_rel_diff(Hj, H)}
    k = h2mc.H2MCStep(sigma2=SIGMA2)
    gx = k.gaussian(g, H, lf)
    Ej, pj, mj = (np.asarray(a) for a in J["gaussian"](jnp.asarray(lf), jnp.asarray(g),
                                                       jnp.asarray(H)))
    cov_j = np.einsum("bik,bk,bjk->bij", Ej, 1 / pj, Ej)
    errs["mean"] = bench.max_rel_diff(mj, gx.mean)
    errs["cov"] = bench.max_rel_diff(cov_j, gx.covariance())
    # one MH step from the same states with the same draws
    xi = rng.standard_normal((B, n))
    u = rng.random(B)
    z = gx.sample(xi=xi)
    y = x + z
    y = y - np.floor(y)
    lfy = ours_target.log_f(y)
    gy, Hy = ours_target.derivatives(y)
    gyp = k.gaussian(gy, Hy, lfy)
    acc = np.log(u) < h2mc.h2mc_log_acceptance(lf, lfy, gx, gyp, z)
    # the step from our proposal at x (same distribution as jax's: mean and covariance are
    # checked above; eigenvector signs are a solver's convention, so the same draws xi give the
    # same offset z only with the same basis)
    out = J["lane_step"](jnp.asarray(x), jnp.asarray(lf), jnp.asarray(gx.basis),
                         jnp.asarray(gx.precision), jnp.asarray(gx.mean), jnp.asarray(xi),
                         jnp.asarray(u))
    acc_j = np.asarray(out[5])
    errs["accept decisions differing"] = float(np.mean(acc_j != acc))
    errs["acceptance"] = float(acc.mean())
    errs["isotropic fallback lanes"] = float(gx.isotropic.mean())
    return errs


# ----------------------------------------------------------------------------- main
@contextlib.contextmanager
def numpy_eigh():
    """The proposal's eigen-decompositions by numpy's batched LAPACK ``eigh``."""
    with mock.patch.object(core_ad, "eigh", np.linalg.eigh):
        yield


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", type=int, default=10_000)
    ap.add_argument("--n", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--steps", type=int, default=5, help="steps per timed run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-traced", action="store_true", help="skip the traced core_ad case")
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    print(bench.machine_info())
    for n in args.n:
        B = args.B
        log_f = make_log_f(n, anp.sin, anp.cos, lambda x, j: x[:, j])
        tc = h2mc.Target(log_f, n, derivatives="compiled", name=f"bench n={n}")
        tt = h2mc.Target(log_f, n, derivatives="traced", name=f"bench n={n}")
        rng = np.random.default_rng(1)
        x0 = 0.5 + 0.05 * rng.standard_normal((B, n))
        x0 = x0 - np.floor(x0)

        t0 = time.perf_counter()
        tc.derivatives(x0[:2])  # builds the compiled kernel
        t_compile_ours = time.perf_counter() - t0
        J = jax_sampler(n, SIGMA2)
        t0 = time.perf_counter()
        jstate = J["init"](jnp.asarray(x0))
        key = jax.random.PRNGKey(0)
        jstate, acc, key = J["step"](jstate, key)
        jax.block_until_ready(jstate)
        t_compile_jax = time.perf_counter() - t0

        errs = check_same(n, min(B, 2000), tc, J)
        print(f"\nn = {n}: same computation (max relative differences, core_ad vs jax): "
              + ", ".join(f"{k} {v:.3f}" if k in ("acceptance", "isotropic fallback lanes")
                          else f"{k} {v:.1e}"
                          for k, v in errs.items()))
        assert errs["hess"] < 1e-10 and errs["cov"] < 1e-8, errs
        assert errs["accept decisions differing"] < 1e-3, errs

        sc = h2mc.Sampler(tc, h2mc.H2MCStep(sigma2=SIGMA2))
        stc = sc.init(x0.copy())
        rngc = np.random.default_rng(2)
        sc.step(stc, rngc)
        sn = h2mc.Sampler(tc, h2mc.H2MCStep(sigma2=SIGMA2))
        stn = sn.init(x0.copy())
        rngn = np.random.default_rng(4)
        st_t = None
        if not args.no_traced:
            stt_s = h2mc.Sampler(tt, h2mc.H2MCStep(sigma2=SIGMA2))
            st_t = stt_s.init(x0.copy())
            rngt = np.random.default_rng(3)
        box = {"j": (jstate, key)}

        def run_ours():
            for _ in range(args.steps):
                sc.step(stc, rngc)

        def run_numpy_eigh():
            with numpy_eigh():
                for _ in range(args.steps):
                    sn.step(stn, rngn)

        def run_traced():
            for _ in range(args.steps):
                stt_s.step(st_t, rngt)

        def run_jax():
            s, k = box["j"]
            for _ in range(args.steps):
                s, _, k = J["step"](s, k)
            jax.block_until_ready(s)
            box["j"] = (s, k)

        cases = {"h2mc (core_ad compiled)": run_ours, "h2mc (numpy eigh)": run_numpy_eigh,
                 "jax.jit(jax.vmap(step))": run_jax}
        if st_t is not None:
            cases["h2mc (core_ad traced)"] = run_traced
        res = bench.compare(cases, repeats=args.repeats, warmup=1)
        first = {"h2mc (core_ad compiled)": t_compile_ours,
                 "jax.jit(jax.vmap(step))": t_compile_jax}
        sps = {name: args.steps / r["median"] for name, r in res.items()}
        ratios = bench.side_by_side(
            res, "h2mc (core_ad compiled)", first_calls=first,
            columns={"steps/s": {k: f"{v:.2f}" for k, v in sps.items()},
                     "chain-steps/s": {k: f"{v * B:.3g}" for k, v in sps.items()}},
            title=f"n = {n}: {args.steps} H2MC steps of {B} chains, float64, median of"
                  f" {args.repeats}")
        print(f"n = {n}: h2mc (core_ad compiled) is {ratios['jax.jit(jax.vmap(step))']:.2f}x the"
              f" steps/s of jax (acceptance: ours {sc.stats['h2mc'].acceptance:.3f}); with "
              f"numpy's eigh it was {ratios['jax.jit(jax.vmap(step))'] / ratios['h2mc (numpy eigh)']:.2f}x;"
              f" the eigen-solver makes a step {ratios['h2mc (numpy eigh)']:.2f}x faster")
        print()


if __name__ == "__main__":
    main()
