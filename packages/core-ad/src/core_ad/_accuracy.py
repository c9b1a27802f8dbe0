"""Accuracy of the LLVM backend's math (libmvec / libm) against numpy, in ulp: the
measurement behind the table in :mod:`core_ad._codegen.llvm.vecmath` (a diagnostic on top of
``sym.compile``, so it sits above the backends: none of them imports it)."""

from __future__ import annotations

import numpy as np

from ._codegen.llvm.vecmath import DOMAINS, MATH_FUNCTIONS, _points, ulp_error

__all__ = ["measure_accuracy", "table"]


def measure_accuracy(n: int = 1 << 16, names=None) -> dict:
    """{(name, dtype, "vector"|"scalar"): max ulp error vs numpy} over :data:`DOMAINS`,
    through ``sym.compile(..., backend="llvm")`` (``vectorize=False`` for the scalar column)."""
    from . import _rules as R
    from . import sym

    ref_fn = {
        "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "sin": np.sin,
        "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "erf": R.erf_p.impl,
        "pow": np.power, "atan2": np.arctan2,
    }
    sym_fn = {
        "exp": sym.exp, "expm1": sym.expm1, "log": sym.log, "log1p": sym.log1p, "sin": sym.sin,
        "cos": sym.cos, "tan": sym.tan, "asin": sym.arcsin, "acos": sym.arccos,
        "atan": sym.arctan, "sinh": sym.sinh, "cosh": sym.cosh, "tanh": sym.tanh,
        "erf": sym.erf, "pow": sym.pow, "atan2": sym.arctan2,
    }
    out = {}
    for dt in ("float64", "float32"):
        names_ = names or list(MATH_FUNCTIONS)
        vs = [sym.var("a", dt), sym.var("b", dt)]
        for name in names_:
            arity = MATH_FUNCTIONS[name][0]
            e = sym_fn[name](*vs[:arity])
            pts = _points(name, dt, n)
            with np.errstate(all="ignore"):
                ref = ref_fn[name](*pts)
            for mode in ("vector", "scalar"):
                fn = sym.compile([e], vs[:arity], backend="llvm", vectorize=(mode == "vector"))
                got = fn(*pts)[0]
                out[(name, dt, mode)] = float(np.max(ulp_error(got, ref)))
    return out


def table(acc: dict) -> str:
    """The docstring table of :mod:`.vecmath` from :func:`measure_accuracy`."""
    rows = []
    for name in MATH_FUNCTIONS:
        dom = DOMAINS[name][0]
        if name == "pow":
            d = "x [1e-3, 1e3], y +-8"
        elif name == "atan2":
            d = "[-1e3, 1e3]^2"
        else:
            d = f"[{dom[0][0]:g}, {dom[0][1]:g}]"
        cells = [f"{acc[(name, dt, m)]:.3g}" for dt in ("float64", "float32")
                 for m in ("vector", "scalar")]
        rows.append(f"{name:<10s} {d:<21s} " + " ".join(f"{c:<16s}" for c in cells))
    return "\n".join(rows)


