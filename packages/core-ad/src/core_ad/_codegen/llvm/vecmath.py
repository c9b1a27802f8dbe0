"""Vector math for generated kernels: glibc's libmvec where it exists, scalar libm otherwise.

A call ``VecMath.call(builder, "sin", [x], dtype)`` with a scalar ``x`` calls libm (``sin`` /
``sinf``); with a vector ``x`` of ``W`` lanes it calls libmvec's variant for the widest ISA the
host supports (``'e'`` AVX-512, ``'d'`` AVX2, ``'c'`` AVX, ``'b'`` SSE; x86 vector function ABI
names such as ``_ZGVdN4v_sin`` or ``_ZGVdN8vv_powf``), or a narrower ISA's variant of exactly
``W`` lanes, else padding or splitting when ``W`` is not the variant's width. Without libmvec (another libc, another architecture, or
``CORE_AD_LIBMVEC=0`` / the ``libmvec=False`` compile option) the vector is scalarised:
``W`` libm calls, still correct, slower. ``sqrt``, ``fabs``, ``floor``, ``ceil``, ``trunc`` and
``rint`` are LLVM intrinsics (exact, one instruction on x86).

Accuracy, measured against numpy (numpy's float64 ``exp``/``log``/``sin``/..., scipy's ``erf``
as the reference backend uses it; float32 likewise, evaluated in float32) by
:func:`core_ad._accuracy.measure_accuracy` on an AMD znver3 host (glibc 2.36, libmvec ISA
``'d'`` = AVX2: 4 x float64, 8 x float32) over the domains of :data:`DOMAINS` (float32: :data:`DOMAINS_F32`
where the float64 domain would overflow: exp [-87, 88], expm1 [-40, 88], log [1e-37, 1e37],
sinh/cosh [-88, 88], pow x in [1e-2, 1e2]); 2^18 points per function, three quarters evenly
spaced, one quarter uniformly random. Max error in units in the last place of numpy's result
(its dtype's ulp); "vector" = libmvec (the kernels' main loop), "scalar" = libm (the
remainder loop, ``vectorize=False``). numpy calls the same glibc libm for most float64
functions, hence the zeros:

=========  ====================  ==========  ==========  ==========  ==========
function   domain (float64)      f64 vector  f64 scalar  f32 vector  f32 scalar
=========  ====================  ==========  ==========  ==========  ==========
exp        [-700, 700]           3           0           4           2
expm1      [-40, 40]             2           0           2           0
log        [1e-300, 1e300]       1           0           4           2
log1p      [-0.999, 1e6]         1           0           1           0
sin        [-1e4, 1e4]           3           0           2           1
cos        [-1e4, 1e4]           3           0           2           1
tan        [-1.5, 1.5]           3           0           3           0
asin       [-1, 1]               2           0           3           0
acos       [-1, 1]               2           0           2           0
atan       [-1e3, 1e3]           1           0           2           0
sinh       [-700, 700]           2           0           2           0
cosh       [-700, 700]           2           0           2           0
tanh       [-20, 20]             2           2           1           3
erf        [-6, 6]               3           3           2           1
pow        x [1e-3, 1e3], y +-8  1           0           1           0
atan2      [-1e3, 1e3]^2         2           0           3           0
=========  ====================  ==========  ==========  ==========  ==========

So float64 results are within 3 ulp of numpy, float32 within 4 ulp (4 x 2^-23 = 4.8e-7
relative, inside the 1e-6 target). Regenerate the table with ``from core_ad import
_accuracy as a; print(a.table(a.measure_accuracy(1 << 18)))``; the test suite
re-measures it (2^14 points) and checks every entry against :data:`ULP_BOUNDS` (4 ulp).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import numpy as np
from llvmlite import ir

__all__ = [
    "VecMath",
    "MATH_FUNCTIONS",
    "DOMAINS",
    "ULP_BOUNDS",
    "host_isa",
    "libmvec_available",
    "intrinsic",
]

# core name -> (arity, libm / libmvec base name)
MATH_FUNCTIONS: dict[str, tuple[int, str]] = {
    "exp": (1, "exp"),
    "expm1": (1, "expm1"),
    "log": (1, "log"),
    "log1p": (1, "log1p"),
    "sin": (1, "sin"),
    "cos": (1, "cos"),
    "tan": (1, "tan"),
    "asin": (1, "asin"),
    "acos": (1, "acos"),
    "atan": (1, "atan"),
    "sinh": (1, "sinh"),
    "cosh": (1, "cosh"),
    "tanh": (1, "tanh"),
    "erf": (1, "erf"),
    "pow": (2, "pow"),
    "atan2": (2, "atan2"),
}

# lanes of (float64, float32) per libmvec ISA letter
ISA_WIDTHS = {"b": (2, 4), "c": (4, 8), "d": (4, 8), "e": (8, 16)}
_ISA_ORDER = ("e", "d", "c", "b")  # widest first; a host runs every ISA after its own

# the domains of the accuracy table (and of tests/test_codegen_llvm.py): name -> ((lo, hi) per
# argument, log-spaced?)
DOMAINS: dict[str, tuple] = {
    "exp": (((-700.0, 700.0),), False),
    "expm1": (((-40.0, 40.0),), False),
    "log": (((1e-300, 1e300),), True),
    "log1p": (((-0.999, 1e6),), False),
    "sin": (((-1e4, 1e4),), False),
    "cos": (((-1e4, 1e4),), False),
    "tan": (((-1.5, 1.5),), False),
    "asin": (((-1.0, 1.0),), False),
    "acos": (((-1.0, 1.0),), False),
    "atan": (((-1e3, 1e3),), False),
    "sinh": (((-700.0, 700.0),), False),
    "cosh": (((-700.0, 700.0),), False),
    "tanh": (((-20.0, 20.0),), False),
    "erf": (((-6.0, 6.0),), False),
    "pow": (((1e-3, 1e3), (-8.0, 8.0)), False),
    "atan2": (((-1e3, 1e3), (-1e3, 1e3)), False),
}
# float32 domains where the float64 one would overflow float32
DOMAINS_F32 = {
    "exp": (((-87.0, 88.0),), False),
    "expm1": (((-40.0, 88.0),), False),
    "log": (((1e-37, 1e37),), True),
    "sinh": (((-88.0, 88.0),), False),
    "cosh": (((-88.0, 88.0),), False),
    "pow": (((1e-2, 1e2), (-8.0, 8.0)), False),
}

# documented limits, checked by the tests: max ulp error vs numpy over DOMAINS
ULP_BOUNDS = {"float64": 4.0, "float32": 4.0}


# --------------------------------------------------------------------------------------------
# host detection


def _host_features() -> dict:
    """The JIT's target features: the host's, or those of ``CORE_AD_LLVM_CPU``'s level."""
    from .jit import _target

    return _target()[1]


def host_isa() -> str | None:
    """The widest libmvec ISA letter the host supports (None on a non-x86 host)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    f = _host_features()
    if f.get("avx512f"):
        return "e"
    if f.get("avx2") and f.get("fma"):
        return "d"
    if f.get("avx"):
        return "c"
    return "b"


_LIBMVEC: dict = {}
_LIBMVEC_LOCK = threading.Lock()


def _find_libmvec():
    for name in ("libmvec.so.1", ctypes.util.find_library("mvec")):
        if not name:
            continue
        try:
            return name, ctypes.CDLL(name)
        except OSError:
            continue
    return None, None


def libmvec_available(isa: str | None = None) -> bool:
    """Whether libmvec loads and exports the variants for ``isa`` (default: the host's) of
    every function of :data:`MATH_FUNCTIONS`; it is then loaded into the JIT's symbol space."""
    isa = isa or host_isa()
    if isa is None:
        return False
    with _LIBMVEC_LOCK:
        if isa in _LIBMVEC:
            return _LIBMVEC[isa]
        name, lib = _find_libmvec()
        ok = lib is not None
        if ok:
            w64, w32 = ISA_WIDTHS[isa]
            for fname, (arity, base) in MATH_FUNCTIONS.items():
                for sym in (_mvec_name(isa, w64, arity, base), _mvec_name(isa, w32, arity,
                                                                           base + "f")):
                    if not hasattr(lib, sym):
                        ok = False
        if ok:
            import llvmlite.binding as llvm

            llvm.load_library_permanently(name)
        _LIBMVEC[isa] = ok
        return ok


def _mvec_name(isa, width, arity, base):
    return f"_ZGV{isa}N{width}{'v' * arity}_{base}"


# --------------------------------------------------------------------------------------------
# intrinsics


def _mangle(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    if isinstance(t, ir.PointerType):
        return "p0"  # LLVM's opaque pointers
    raise TypeError(f"cannot mangle {t}")


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list, overloads=None):
    """Declare (once) the LLVM intrinsic ``name`` overloaded on ``overloads`` (default: the
    return type), e.g. ``intrinsic(m, "llvm.sqrt", v4f64, [v4f64])``."""
    overloads = [ret] if overloads is None else overloads
    full = name + "".join("." + _mangle(t) for t in overloads)
    try:
        return module.get_global(full)
    except KeyError:
        return ir.Function(module, ir.FunctionType(ret, args), full)


def _declare(module: ir.Module, name: str, ret: ir.Type, args: list):
    try:
        return module.get_global(name)
    except KeyError:
        fn = ir.Function(module, ir.FunctionType(ret, args), name)
        fn.attributes.add("nounwind")
        return fn


# --------------------------------------------------------------------------------------------
# the call lowering


def _ftype(dtype) -> ir.Type:
    return ir.DoubleType() if np.dtype(dtype) == np.float64 else ir.FloatType()


class VecMath:
    """How transcendental calls are emitted.

    ``isa``: libmvec ISA letter (default: the host's); ``libmvec``: use libmvec for vector
    calls (default: when available, unless ``CORE_AD_LIBMVEC=0``).
    """

    def __init__(self, isa: str | None = None, libmvec: bool | None = None):
        self.isa = isa if isa is not None else host_isa()
        if libmvec is None:
            libmvec = os.environ.get("CORE_AD_LIBMVEC", "1") != "0"
        self.libmvec = bool(libmvec) and self.isa is not None and libmvec_available(self.isa)

    @property
    def key(self) -> tuple:
        return (self.isa, self.libmvec)

    def width(self, dtype) -> int:
        """Natural vector width (lanes) for ``dtype`` on this ISA (4 for float64 on AVX2)."""
        isa = self.isa or "b"
        w64, w32 = ISA_WIDTHS[isa]
        return w32 if np.dtype(dtype).itemsize <= 4 else w64

    def call(self, builder: ir.IRBuilder, name: str, args: list, dtype) -> ir.Value:
        """``name(*args)`` for floating-point ``dtype``, scalar or vector args."""
        arity, base = MATH_FUNCTIONS[name]
        if len(args) != arity:
            raise ValueError(f"{name} takes {arity} argument(s), got {len(args)}")
        dtype = np.dtype(dtype)
        ft = _ftype(dtype)
        libm = base + ("f" if dtype == np.float32 else "")
        t = args[0].type
        module = builder.module
        if not isinstance(t, ir.VectorType):
            fn = _declare(module, libm, ft, [ft] * arity)
            return builder.call(fn, args)
        w = t.count
        if not self.libmvec:
            return self._scalarise(builder, libm, ft, args, w)
        isa = self._isa_for(w, dtype)
        v = ISA_WIDTHS[isa][1 if dtype == np.float32 else 0]
        vt = ir.VectorType(ft, v)
        fn = _declare(module, _mvec_name(isa, v, arity, libm), vt, [vt] * arity)
        if w == v:
            return builder.call(fn, args)
        if w < v:  # pad with lane 0, call once, keep the first w lanes
            mask = ir.Constant(ir.VectorType(ir.IntType(32), v),
                               [i if i < w else 0 for i in range(v)])
            padded = [builder.shuffle_vector(a, ir.Constant(t, ir.Undefined), mask)
                      for a in args]
            r = builder.call(fn, padded)
            keep = ir.Constant(ir.VectorType(ir.IntType(32), w), list(range(w)))
            return builder.shuffle_vector(r, ir.Constant(vt, ir.Undefined), keep)
        # w > v: split into w / v calls and concatenate
        parts = []
        for k in range(0, w, v):
            sel = ir.Constant(ir.VectorType(ir.IntType(32), v), list(range(k, k + v)))
            parts.append(builder.call(fn, [builder.shuffle_vector(a, ir.Constant(t, ir.Undefined),
                                                                  sel) for a in args]))
        while len(parts) > 1:
            n = parts[0].type.count
            cat = ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n)))
            parts = [builder.shuffle_vector(parts[i], parts[i + 1], cat)
                     for i in range(0, len(parts), 2)]
        return parts[0]

    def _isa_for(self, lanes, dtype):
        """The host's ISA, or a narrower one the host also runs whose variants take exactly
        ``lanes`` lanes (8 float32 lanes on an AVX-512 host: AVX2's, not half of a 16-lane
        call)."""
        k = 1 if np.dtype(dtype) == np.float32 else 0
        narrower = _ISA_ORDER[_ISA_ORDER.index(self.isa):]
        return next((i for i in narrower if ISA_WIDTHS[i][k] == lanes
                     and libmvec_available(i)), self.isa)

    @staticmethod
    def _scalarise(builder, libm, ft, args, w):
        fn = _declare(builder.module, libm, ft, [ft] * len(args))
        out = ir.Constant(ir.VectorType(ft, w), ir.Undefined)
        for k in range(w):
            i = ir.Constant(ir.IntType(32), k)
            r = builder.call(fn, [builder.extract_element(a, i) for a in args])
            out = builder.insert_element(out, r, i)
        return out


# --------------------------------------------------------------------------------------------
# accuracy measurement (the docstring table)


def _points(name, dtype, n, seed=0):
    dom, logspaced = (DOMAINS_F32.get(name) if np.dtype(dtype) == np.float32 else None) or \
        DOMAINS[name]
    rng = np.random.default_rng(seed)
    cols = []
    for k, (lo, hi) in enumerate(dom):
        if logspaced:
            even = np.geomspace(lo, hi, n)
            rnd = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
        else:
            even = np.linspace(lo, hi, n)
            rnd = rng.uniform(lo, hi, n)
        if k == 1:
            rng.shuffle(even)
        col = np.where(np.arange(n) % 4 == 3, rnd, even)
        cols.append(col.astype(dtype))
    return cols


def ulp_error(got, ref) -> np.ndarray:
    """|got - ref| in units of ulp(ref) (in ref's dtype); 0 where both are equal or both NaN,
    inf where exactly one is NaN / the infinities differ."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    dt = ref.dtype
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    with np.errstate(all="ignore"):
        tiny = np.finfo(dt).smallest_subnormal
        ulp = np.spacing(np.abs(ref).astype(dt)).astype(np.float64)
        ulp = np.maximum(ulp, float(tiny))
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / ulp
    err = np.where(same, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)
