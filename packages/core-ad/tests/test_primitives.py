"""Every primitive of the rule table against central finite differences.

docs/design/core-ad.md §2.1 and docs/ARCHITECTURE.md ("Testing and benchmarking"). The table ``DIFF_CASES`` maps each differentiable
primitive name to calls of its public op function on seeded random, in-domain, non-square,
non-symmetric inputs kept away from kinks (ties, clamp bounds, the origin of atan2 ...).
``NONDIFF_CASES`` does the same for the zero-derivative primitives. A primitive registered
without an entry in either table makes ``test_table_covers_registry`` fail.

Each case is checked

* against central differences with ``check_grads(order=2, modes=("fwd", "rev"))``: first
  derivatives in both modes, then the derivative of ``x -> J v`` and of ``x -> J^T w``
  (forward-over-forward and reverse-over-reverse on traced rules);
* for vector forward mode: ``jacobian(mode="fwd")`` (one tangent per input entry, the ``nb``
  code paths) equals ``jacobian(mode="rev")``;
* for the transpose identity ``<J v, w> == <v, J^T w>`` with ``jvp``/``vjp`` on random v, w;
* for second order with direction axes: ``hessian`` of a random projection of the output
  (forward-over-reverse with ``nb = 1`` on traced rules) against central differences of the
  exact gradient, and its symmetry.

Tolerances: the check_grads defaults (rtol 1e-5, atol 1e-6 times the largest FD entry) are
what central differences with step 6e-6*max(1,|x|) reach on smooth float64 code with inputs of
size O(1) (truncation ~h^2 ~ 4e-11, rounding ~1e-16/h ~ 2e-11, times derivative magnitudes
<~ 10). AD-versus-AD comparisons (fwd vs rev, transpose identity) are exact up to summation
order: 1e-12 relative.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp
from core_ad import _rules as R
from core_ad._tracing import _toposort

# --------------------------------------------------------------------------------------------
# input generators (all seeded through the rng passed in)


def normal(rng, shape, scale=1.0):
    return scale * rng.standard_normal(shape)


def away(rng, shape, lo=0.5, hi=2.0):
    """Magnitude in [lo, hi] with a random sign: away from 0 (abs, div, atan2)."""
    return rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], size=shape)


def positive(rng, shape, lo=0.5, hi=2.0):
    return rng.uniform(lo, hi, shape)


def distinct(rng, shape):
    """Distinct values at least 0.5 apart (max/min reductions without ties)."""
    n = int(np.prod(shape))
    return (rng.permutation(n) + rng.uniform(0.0, 0.5, n)).reshape(shape) - n / 2


def clamp_inputs(rng, shape):
    """x below, inside and above [lo, hi], every lane at least 0.1 from a bound."""
    lo = rng.uniform(-1.0, -0.5, shape)
    hi = rng.uniform(0.5, 1.0, shape)
    cat = rng.permutation(np.arange(int(np.prod(shape))) % 3).reshape(shape)
    x = np.where(
        cat == 0,
        lo - rng.uniform(0.1, 0.5, shape),
        np.where(cat == 1, rng.uniform(lo + 0.1, hi - 0.1), hi + rng.uniform(0.1, 0.5, shape)),
    )
    return x, lo, hi


def pair_apart(rng, shape):
    """a, b with |a - b| >= 0.2 (maximum/minimum, where(a > b, ...) without ties)."""
    a = normal(rng, shape)
    return a, a + away(rng, shape, 0.2, 1.0)


# --------------------------------------------------------------------------------------------
# the table: primitive name -> list of (label, function, input generator)
#
# Functions take float64 arrays (positional) and return one array. Index arrays, masks and
# constants are closed over (they are not differentiable).

S = (3, 4)  # non-square default shape
MASK = np.array(
    [[True, False, False, True], [False, True, True, False], [True, True, False, False]]
)
IDX_DUP = np.array([2, 0, 2])

DIFF_CASES = {
    "safe_mul": [("2d", lambda a, p: R.safe_mul(a, p), lambda r: (normal(r, S), normal(r, S)))],
    "add": [
        ("2", lambda a, b: anp.add(a, b), lambda r: (normal(r, S), normal(r, S))),
        ("3", lambda a, b, c: anp.add(a, b, c),
         lambda r: (normal(r, S), normal(r, S), normal(r, S))),
        ("bcast", lambda a, b: anp.add(a, b), lambda r: (normal(r, S), normal(r, (4,)))),
    ],
    "sub": [
        ("2d", lambda a, b: anp.sub(a, b), lambda r: (normal(r, S), normal(r, S))),
        ("bcast", lambda a, b: anp.sub(a, b), lambda r: (normal(r, (3, 1)), normal(r, S))),
    ],
    "neg": [("2d", lambda a: anp.neg(a), lambda r: (normal(r, S),))],
    "identity": [("2d", lambda a: anp.identity(a), lambda r: (normal(r, S),))],
    "mul": [
        ("2", lambda a, b: anp.mul(a, b), lambda r: (normal(r, S), normal(r, S))),
        ("3", lambda a, b, c: anp.mul(a, b, c),
         lambda r: (normal(r, S), normal(r, S), normal(r, S))),
        ("self", lambda a: anp.mul(a, a), lambda r: (normal(r, S),)),
        ("bcast", lambda a, b: anp.mul(a, b), lambda r: (normal(r, (4,)), normal(r, S))),
    ],
    "div": [
        ("2d", lambda a, b: anp.div(a, b), lambda r: (normal(r, S), away(r, S))),
        ("const_num", lambda b: anp.div(2.0, b), lambda r: (away(r, S),)),
    ],
    "pow": [
        ("var_var", lambda x, y: anp.pow(x, y), lambda r: (positive(r, S), normal(r, S))),
        ("const3", lambda x: anp.pow(x, 3), lambda r: (away(r, S),)),
        ("const2", lambda x: anp.pow(x, 2), lambda r: (normal(r, S),)),
        ("const_half", lambda x: anp.pow(x, 0.5), lambda r: (positive(r, S),)),
        ("const_base", lambda y: anp.pow(1.7, y), lambda r: (normal(r, S),)),
    ],
    "exp": [("2d", lambda x: anp.exp(x), lambda r: (normal(r, S),))],
    "expm1": [("2d", lambda x: anp.expm1(x), lambda r: (normal(r, S),))],
    "log": [("2d", lambda x: anp.log(x), lambda r: (positive(r, S),))],
    "log1p": [("2d", lambda x: anp.log1p(x), lambda r: (r.uniform(-0.5, 2.0, S),))],
    "sqrt": [("2d", lambda x: anp.sqrt(x), lambda r: (positive(r, S),))],
    "rsqrt": [("2d", lambda x: anp.rsqrt(x), lambda r: (positive(r, S),))],
    "sin": [("2d", lambda x: anp.sin(x), lambda r: (normal(r, S, 2.0),))],
    "cos": [("2d", lambda x: anp.cos(x), lambda r: (normal(r, S, 2.0),))],
    "tan": [("2d", lambda x: anp.tan(x), lambda r: (r.uniform(-1.0, 1.0, S),))],
    "asin": [("2d", lambda x: anp.arcsin(x), lambda r: (r.uniform(-0.8, 0.8, S),))],
    "acos": [("2d", lambda x: anp.arccos(x), lambda r: (r.uniform(-0.8, 0.8, S),))],
    "atan": [("2d", lambda x: anp.arctan(x), lambda r: (normal(r, S, 2.0),))],
    "sinh": [("2d", lambda x: anp.sinh(x), lambda r: (normal(r, S),))],
    "cosh": [("2d", lambda x: anp.cosh(x), lambda r: (normal(r, S),))],
    "tanh": [("2d", lambda x: anp.tanh(x), lambda r: (normal(r, S),))],
    "erf": [("2d", lambda x: anp.erf(x), lambda r: (normal(r, S),))],
    "abs": [("2d", lambda x: anp.abs(x), lambda r: (away(r, S, 0.3),))],
    "atan2": [("2d", lambda y, x: anp.arctan2(y, x), lambda r: (away(r, S), away(r, S)))],
    "maximum": [
        ("2d", lambda a, b: anp.maximum(a, b), lambda r: pair_apart(r, S)),
        ("const", lambda a: anp.maximum(a, 0.0), lambda r: (away(r, S, 0.2),)),
    ],
    "minimum": [
        ("2d", lambda a, b: anp.minimum(a, b), lambda r: pair_apart(r, S)),
        ("const", lambda a: anp.minimum(a, 0.0), lambda r: (away(r, S, 0.2),)),
    ],
    "clamp": [
        ("arrays", lambda x, lo, hi: anp.clamp(x, lo, hi), lambda r: clamp_inputs(r, S)),
        ("scalars", lambda x: anp.clamp(x, -0.5, 0.5),
         lambda r: (np.where(MASK, 1.0, 0.3) * away(r, S, 0.6, 1.5),)),
    ],
    # float64 -> float32 loses ~6e-8 relative, which central differences with the default
    # step would amplify to ~1e-2; on this *linear* map there is no truncation error, so a
    # large step (eps=1e-2) is exact up to that rounding: 6e-8/1e-2 ~ 1e-5 -> rtol 1e-4.
    "convert": [
        ("f64_f32_f64", lambda x: anp.astype(anp.mul(anp.astype(x, np.float32), 3.0), np.float64),
         lambda r: (normal(r, S),), dict(eps=1e-2, rtol=1e-4, atol=1e-5)),
        ("f64_f32", lambda x: anp.mul(anp.astype(x, np.float32), 3.0),
         lambda r: (normal(r, S),), dict(eps=1e-2, rtol=1e-4, atol=1e-5)),
    ],
    "select": [
        ("mask", lambda a, b: anp.where(MASK, a, b), lambda r: (normal(r, S), normal(r, S))),
        ("scalar_branch", lambda a: anp.where(MASK, a, 0.0), lambda r: (normal(r, S),)),
        ("traced_cond", lambda a, b: anp.where(a > b, a * b, a - b), lambda r: pair_apart(r, S)),
    ],
    "broadcast_to": [
        ("row", lambda x: anp.broadcast_to(x, (3, 4)), lambda r: (normal(r, (4,)),)),
        ("col_3d", lambda x: anp.broadcast_to(x, (2, 3, 4)), lambda r: (normal(r, (3, 1)),)),
        ("scalar", lambda x: anp.broadcast_to(x, (3, 4)), lambda r: (normal(r, ()),)),
    ],
    "reshape": [
        ("2d", lambda x: anp.reshape(x, (2, 6)), lambda r: (normal(r, S),)),
        ("minus1", lambda x: anp.reshape(x, (4, -1)), lambda r: (normal(r, (2, 3, 2)),)),
    ],
    "transpose": [
        ("2d", lambda x: anp.transpose(x), lambda r: (normal(r, S),)),
        ("3d", lambda x: anp.transpose(x, (2, 0, 1)), lambda r: (normal(r, (2, 3, 4)),)),
    ],
    "concatenate": [
        ("axis0", lambda a, b: anp.concatenate([a, b], axis=0),
         lambda r: (normal(r, (2, 4)), normal(r, (3, 4)))),
        ("axis-1", lambda a, b: anp.concatenate([a, b], axis=-1),
         lambda r: (normal(r, (3, 2)), normal(r, (3, 4)))),
        ("with_const", lambda a, b: anp.concatenate([a, np.ones((1, 4)), b], axis=0),
         lambda r: (normal(r, (2, 4)), normal(r, (1, 4)))),
    ],
    "reduce_sum": [
        ("all", lambda x: anp.sum(x), lambda r: (normal(r, S),)),
        ("axis0", lambda x: anp.sum(x, axis=0), lambda r: (normal(r, S),)),
        ("axes_keep", lambda x: anp.sum(x, axis=(0, 2), keepdims=True),
         lambda r: (normal(r, (2, 3, 4)),)),
    ],
    "reduce_max": [
        ("all", lambda x: anp.max(x), lambda r: (distinct(r, S),)),
        ("axis1", lambda x: anp.max(x, axis=1), lambda r: (distinct(r, S),)),
        ("axis0_keep", lambda x: anp.max(x, axis=0, keepdims=True), lambda r: (distinct(r, S),)),
    ],
    "reduce_min": [
        ("all", lambda x: anp.min(x), lambda r: (distinct(r, S),)),
        ("axis1", lambda x: anp.min(x, axis=1), lambda r: (distinct(r, S),)),
        ("axis0_keep", lambda x: anp.min(x, axis=0, keepdims=True), lambda r: (distinct(r, S),)),
    ],
    "getitem": [
        ("slices", lambda x: x[1:, ::2], lambda r: (normal(r, S),)),
        ("ellipsis_int", lambda x: x[..., 1], lambda r: (normal(r, S),)),
        ("rev_newaxis", lambda x: x[::-1, None, 1:3], lambda r: (normal(r, S),)),
        ("int_array_dup", lambda x: x[IDX_DUP], lambda r: (normal(r, S),)),
        ("two_arrays", lambda x: x[[0, 2, 2], [1, 3, 1]], lambda r: (normal(r, S),)),
        # advanced indices separated by a slice: numpy moves their axes to the front
        ("split_advanced", lambda x: x[IDX_DUP, :, 1], lambda r: (normal(r, (3, 4, 2)),)),
        ("bool_mask", lambda x: x[MASK], lambda r: (normal(r, S),)),
    ],
    "index_add": [
        ("dup", lambda c: R.index_add(c, (IDX_DUP,), (4, 5)), lambda r: (normal(r, (3, 5)),)),
        ("slice", lambda c: R.index_add(c, (slice(1, 3),), (4, 5)), lambda r: (normal(r, (2, 5)),)),
        ("split_advanced", lambda c: R.index_add(c, (IDX_DUP, slice(None), 1), (3, 4, 2)),
         lambda r: (normal(r, (3, 4)),)),
    ],
    "take": [
        ("axis1_dup", lambda x: anp.take(x, [3, 0, 3, 1], axis=1), lambda r: (normal(r, S),)),
        ("idx2d_axis0", lambda x: anp.take(x, np.array([[2, 0], [1, 2]]), axis=0),
         lambda r: (normal(r, S),)),
        ("axis-1_3d", lambda x: anp.take(x, [1, 1, 0], axis=-1), lambda r: (normal(r, (2, 3, 2)),)),
    ],
    "scatter_add": [
        ("axis0_dup", lambda t, v: anp.scatter_add(t, [0, 2, 0, 4], v, axis=0),
         lambda r: (normal(r, (5, 3)), normal(r, (4, 3)))),
        ("axis1", lambda t, v: anp.scatter_add(t, [4, 1, 1], v, axis=1),
         lambda r: (normal(r, (3, 5)), normal(r, (3, 3)))),
        ("idx2d", lambda t, v: anp.scatter_add(t, np.array([[1, 0], [1, 3]]), v),
         lambda r: (normal(r, (4, 3)), normal(r, (2, 2, 3)))),
        ("values_only", lambda v: anp.scatter_add(np.zeros(5), [3, 0, 3], v),
         lambda r: (normal(r, (3,)),)),
    ],
    "scatter": [
        # duplicate index 3: the last writer wins, the earlier value has zero derivative
        ("axis0_dup", lambda t, v: anp.scatter(t, [3, 0, 3], v, axis=0),
         lambda r: (normal(r, (5, 3)), normal(r, (3, 3)))),
        ("axis1", lambda t, v: anp.scatter(t, [4, 1], v, axis=1),
         lambda r: (normal(r, (3, 5)), normal(r, (3, 2)))),
        ("target_only", lambda t: anp.scatter(t, [1, 3], np.array([5.0, 6.0])),
         lambda r: (normal(r, (4,)),)),
        ("values_only", lambda v: anp.scatter(np.ones((4, 2)), [3, 1, 3], v),
         lambda r: (normal(r, (3, 2)),)),
    ],
    "matmul": [
        ("2d_2d", lambda a, b: anp.matmul(a, b), lambda r: (normal(r, (3, 4)), normal(r, (4, 2)))),
        ("batched_3d", lambda a, b: anp.matmul(a, b),
         lambda r: (normal(r, (2, 3, 4)), normal(r, (2, 4, 2)))),
        ("bcast_3d_2d", lambda a, b: anp.matmul(a, b),
         lambda r: (normal(r, (2, 3, 4)), normal(r, (4, 2)))),
        ("1d_2d", lambda a, b: anp.matmul(a, b), lambda r: (normal(r, (3,)), normal(r, (3, 4)))),
        ("2d_1d", lambda a, b: anp.matmul(a, b), lambda r: (normal(r, (3, 4)), normal(r, (4,)))),
        ("1d_1d", lambda a, b: anp.matmul(a, b), lambda r: (normal(r, (4,)), normal(r, (4,)))),
    ],
    "norm": [
        ("all", lambda x: anp.norm(x), lambda r: (normal(r, S),)),
        ("axis1", lambda x: anp.norm(x, axis=1), lambda r: (normal(r, S),)),
        ("axis0_keep", lambda x: anp.norm(x, axis=0, keepdims=True), lambda r: (normal(r, S),)),
    ],
    # inputs away from the jumps at multiples of b: fractional parts of a / b in [0.2, 0.8]
    "mod": [("2d", lambda a, b: anp.mod(a, b),
             lambda r: ((lambda b: (b * (r.integers(-3, 4, S) + r.uniform(0.2, 0.8, S)), b))(
                 away(r, S, 0.5, 2.0))))],
}

# Composite ops (built from the primitives above); checked the same way.
COMPOSITES = {
    "mean": [
        ("all", lambda x: anp.mean(x), lambda r: (normal(r, S),)),
        ("axis1", lambda x: anp.mean(x, axis=1), lambda r: (normal(r, S),)),
    ],
    "prod": [
        ("all", lambda x: anp.prod(x), lambda r: (away(r, (2, 3), 0.5, 1.5),)),
        ("axis1", lambda x: anp.prod(x, axis=1), lambda r: (away(r, (3, 5), 0.5, 1.5),)),
        ("with_zero", lambda x: anp.prod(x, axis=1),
         lambda r: (away(r, (2, 3), 0.5, 1.5) * np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),)),
    ],
    "dot": [
        ("1d_1d", lambda a, b: anp.dot(a, b), lambda r: (normal(r, (4,)), normal(r, (4,)))),
        ("2d_2d", lambda a, b: anp.dot(a, b), lambda r: (normal(r, (3, 4)), normal(r, (4, 2)))),
    ],
    "cross": [
        ("rows", lambda a, b: anp.cross(a, b), lambda r: (normal(r, (4, 3)), normal(r, (4, 3))))
    ],
    "normalize": [("rows", lambda x: anp.normalize(x), lambda r: (normal(r, S),))],
    "stack": [
        ("axis0", lambda a, b: anp.stack([a, b]), lambda r: (normal(r, S), normal(r, S))),
        ("axis-1", lambda a, b: anp.stack([a, b], axis=-1), lambda r: (normal(r, S), normal(r, S))),
    ],
    "sigmoid": [("2d", lambda x: anp.sigmoid(x), lambda r: (normal(r, S, 2.0),))],
}

# Zero-derivative primitives: the op on a traced array gives a constant (no graph node).
NONDIFF_CASES = {
    "sign": lambda x: anp.sign(x),
    "floor": lambda x: anp.floor(x),
    "ceil": lambda x: anp.ceil(x),
    "round": lambda x: anp.round(x),
    "trunc": lambda x: anp.trunc(x),
    "floor_divide": lambda x: anp.floor_divide(x, 0.7),
    "lt": lambda x: anp.lt(x, 0.1),
    "le": lambda x: anp.le(x, 0.1),
    "gt": lambda x: anp.gt(x, 0.1),
    "ge": lambda x: anp.ge(x, 0.1),
    "eq": lambda x: anp.eq(x, x),
    "ne": lambda x: anp.ne(x, 0.1),
    "logical_and": lambda x: anp.logical_and(x > 0, x < 1),
    "logical_or": lambda x: anp.logical_or(x > 0, x < -1),
    "logical_not": lambda x: anp.logical_not(x > 0),
    "isfinite": lambda x: anp.isfinite(x),
    "isnan": lambda x: anp.isnan(x),
    "cast": lambda x: anp.astype(x * 3.0, np.int32),
    "stop_gradient": lambda x: anp.stop_gradient(x * x),
}

# Registered primitives with no entry in the tables above, each with the reason. Empty: every
# registered primitive is checked, differentiable ones by finite differences, the others for
# a zero derivative. (A one-off primitive made by custom_vjp is never registered.)
EXCLUDED: dict[str, str] = {
    "lane_gather": "kernel primitive over whole buffers (no traced-array derivative by design);"
    " tested in test_sym_buffers.py",
    "lane_scatter_add": "kernel output primitive (no derivative by design); tested in"
    " test_sym_buffers.py",
    "lane_sum": "kernel output primitive (the sum over a kernel's lanes); tested in"
    " test_sym_buffers.py and through the lazy sums of test_lazy.py",
}


def _flatten_cases(table):
    out = []
    for name, cases in table.items():
        for case in cases:
            label, fn, make = case[:3]
            kw = case[3] if len(case) > 3 else {}
            out.append(pytest.param(name, fn, make, kw, id=f"{name}-{label}"))
    return out


ALL = _flatten_cases(DIFF_CASES) + _flatten_cases(COMPOSITES)


def _args(name, make):
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # seeded per primitive
    return tuple(np.asarray(a, dtype=np.float64) for a in make(rng))


# --------------------------------------------------------------------------------------------
# the table is complete and honest


def test_table_covers_registry():
    reg = ad.primitives()
    covered = set(DIFF_CASES) | set(NONDIFF_CASES) | set(EXCLUDED)
    assert not set(reg) - covered, f"primitives without a test: {sorted(set(reg) - covered)}"
    assert not covered - set(reg), f"table names unknown primitives: {sorted(covered - set(reg))}"
    for name, prim in reg.items():
        if name in EXCLUDED:
            continue
        assert prim.differentiable == (name in DIFF_CASES), (
            f"{name}: differentiable={prim.differentiable} but listed in the"
            f" {'DIFF' if name in DIFF_CASES else 'NONDIFF'} table"
        )
    assert set(DIFF_CASES).isdisjoint(NONDIFF_CASES)
    assert all(reason.strip() for reason in EXCLUDED.values())


def _prims_used(out):
    return {n._prim.name for n in _toposort([out]) if n._prim is not None}


@pytest.mark.parametrize("name, fn, make, kw", _flatten_cases(DIFF_CASES))
def test_case_records_its_primitive(name, fn, make, kw):
    """Each table entry really goes through the primitive it is filed under."""
    args = [ad.Array(a, requires_grad=True) for a in _args(name, make)]
    out = fn(*args)
    assert isinstance(out, ad.Array) and out.requires_grad
    assert name in _prims_used(out), f"{name} case records only {sorted(_prims_used(out))}"


@pytest.mark.parametrize("name", sorted(NONDIFF_CASES))
def test_nondifferentiable_primitive_has_zero_derivative(name):
    fn = NONDIFF_CASES[name]
    x = np.random.default_rng(7).uniform(-2.0, 2.0, S)
    xt = ad.Array(x, requires_grad=True)
    out = fn(xt)
    assert isinstance(out, ad.Array) and not out.requires_grad  # a constant
    # mixed into a differentiable expression it contributes nothing: d/dx (x * c(x)) = c(x)
    g = ad.grad(lambda a: anp.sum(a * anp.astype(fn(a), np.float64)))(x)
    np.testing.assert_array_equal(g, np.asarray(fn(x), dtype=np.float64))


# --------------------------------------------------------------------------------------------
# finite differences, orders 1 and 2, forward and reverse


@pytest.mark.parametrize("name, fn, make, kw", ALL)
def test_check_grads(name, fn, make, kw):
    args = _args(name, make)
    ad.check_grads(fn, args, order=2, modes=("fwd", "rev"), **kw)


def _vector_fwd_vs_rev(fn, args):
    # AD vs AD, exact up to summation order: 1e-12 relative
    for i in range(len(args)):
        def f_i(x, i=i):
            return fn(*args[:i], x, *args[i + 1:])

        Jf = ad.jacobian(f_i, mode="fwd")(args[i])
        Jr = ad.jacobian(f_i, mode="rev")(args[i])
        assert Jf.shape == Jr.shape == np.shape(fn(*args)) + args[i].shape
        np.testing.assert_allclose(Jf, Jr, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, fn, make, kw", ALL)
def test_vector_forward_matches_reverse(name, fn, make, kw):
    _vector_fwd_vs_rev(fn, _args(name, make))


@pytest.mark.parametrize("name, fn, make, kw", ALL)
def test_transpose_identity(name, fn, make, kw):
    args = _args(name, make)
    rng = np.random.default_rng(11)
    v = tuple(rng.standard_normal(a.shape) for a in args)
    out, jv = ad.jvp(fn, args, v)
    w = rng.standard_normal(np.shape(out))
    _, pull = ad.vjp(fn, *args)
    jtw = pull(w)
    lhs = float(np.sum(np.asarray(jv, dtype=np.float64) * w))
    rhs = sum(float(np.sum(a * b)) for a, b in zip(v, jtw))
    # exact up to summation order (1e-12); the float32 cast cases compute jvp and vjp in
    # float32, whose rounding (6e-8) over a dozen terms stays below 1e-6
    tol = 1e-6 if kw else 1e-12
    assert lhs == pytest.approx(rhs, rel=tol, abs=tol)


@pytest.mark.parametrize("name, fn, make, kw", ALL)
def test_hessian_vector_forward_over_reverse(name, fn, make, kw):
    """Second order with direction axes and nesting, against FD of the exact gradient.

    ``hessian``: one vector forward pass (nb = 1) over a recorded reverse pass;
    ``jacobian(grad(f), mode="rev")``: reverse over a nested, recorded reverse pass.
    """
    if kw:  # the float32 round trip: second derivatives are zero and FD is rounding noise
        pytest.skip("linear float32 cast; covered by check_grads with its own step")
    args = _args(name, make)
    rng = np.random.default_rng(5)
    w = rng.standard_normal(np.shape(fn(*args)))
    for i, x0 in enumerate(args):  # with respect to each argument in turn

        def scalar(x, i=i):
            return anp.sum(anp.mul(fn(*args[:i], x, *args[i + 1:]), w))

        n = x0.size
        H = ad.hessian(scalar)(x0).reshape(n, n)
        np.testing.assert_array_equal(H, H.T)  # symmetric by construction
        gfun = ad.grad(scalar)
        cols = []
        for j in range(n):
            h = 6e-6 * max(1.0, abs(x0.flat[j]))
            e = np.zeros(n)
            e[j] = h
            e = e.reshape(x0.shape)
            cols.append((gfun(x0 + e) - gfun(x0 - e)).ravel() / (2 * h))
        H_fd = np.stack(cols, axis=1)
        # FD of an exact gradient: the same error budget as check_grads' first order
        scale = max(1.0, float(np.abs(H_fd).max()))
        np.testing.assert_allclose(H, H_fd, rtol=1e-5, atol=1e-6 * scale)
        H_rr = ad.jacobian(gfun, mode="rev")(x0).reshape(n, n)
        np.testing.assert_allclose(H_rr, H_fd, rtol=1e-5, atol=1e-6 * scale)


# --------------------------------------------------------------------------------------------
# explicit values that FD alone would not pin down


def test_prod_with_exact_zero_is_finite_and_exact():
    x = np.array([2.0, 0.0, 3.0, -1.5, 0.5])
    g = ad.grad(lambda a: anp.prod(a))(x)
    assert np.all(np.isfinite(g))
    # d prod / d x_i = product of the others; exact (no division by x_i)
    expected = np.array([np.prod(np.delete(x, i)) for i in range(x.size)])
    np.testing.assert_array_equal(g, expected)
    assert g[1] == 2.0 * 3.0 * -1.5 * 0.5
    # two zeros: every first derivative vanishes, the Hessian entry coupling them does not
    x2 = np.array([0.0, 4.0, 0.0])
    np.testing.assert_array_equal(ad.grad(lambda a: anp.prod(a))(x2), np.zeros(3))
    H = ad.hessian(lambda a: anp.prod(a))(x2)
    np.testing.assert_array_equal(H, np.array([[0, 0, 4.0], [0, 0, 0], [4.0, 0, 0]]))


def test_reduce_max_routes_to_argmax():
    x = np.array([[0.3, 2.0, -1.0], [5.0, 1.0, 4.0]])
    np.testing.assert_array_equal(ad.grad(lambda a: anp.max(a))(x), [[0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(
        ad.grad(lambda a: anp.sum(anp.min(a, axis=1) * np.array([1.0, 10.0])))(x),
        [[0, 0, 1], [0, 10, 0]],
    )


@pytest.mark.parametrize(
    "src, dst", [(np.float32, np.float64), (np.float64, np.float32)], ids=["f32->f64", "f64->f32"]
)
def test_convert_gradient_dtype(src, dst):
    rng = np.random.default_rng(3)
    x = ad.Array(rng.standard_normal(S).astype(src), requires_grad=True)
    w = rng.standard_normal(S)
    y = anp.astype(x, dst)
    assert y.dtype == dst
    out = anp.sum(anp.mul(anp.sin(y), w.astype(dst)))
    ad.backward(out)
    assert x.grad.dtype == src
    expected = np.cos(x.value.astype(dst)) * w.astype(dst)
    # float32 arithmetic on one side: 1e-6 relative
    np.testing.assert_allclose(x.grad, expected, rtol=1e-6, atol=1e-6)
    # the functional transforms return the cotangent as the rule produced it (no cast at a
    # leaf): it must already have been converted back to the input's dtype
    g = ad.grad(lambda a: anp.sum(anp.mul(anp.sin(anp.astype(a, dst)), w.astype(dst))))(x.value)
    assert g.dtype == src
    _, pull = ad.vjp(lambda a: anp.astype(a, dst), x.value)
    assert pull(np.ones(S, dst))[0].dtype == src
    # forward mode: the tangent takes the output dtype
    x.grad = None
    y2 = anp.astype(x, dst)
    ad.forward(x)
    assert y2.tangent.dtype == dst
    np.testing.assert_array_equal(y2.tangent, np.ones(S, dst))


def test_astype_to_int_is_a_constant():
    x = ad.Array(np.array([1.7, -2.2]), requires_grad=True)
    assert not anp.astype(x, np.int64).requires_grad
    assert not anp.astype(x, bool).requires_grad


# --------------------------------------------------------------------------------------------
# float32


F32_CASES = [
    ("exp", lambda x: anp.exp(x), lambda r: (normal(r, S),)),
    ("mul_div", lambda a, b: anp.div(anp.mul(a, b), b + 3.0),
     lambda r: (normal(r, S), positive(r, S))),
    ("sqrt", lambda x: anp.sqrt(x), lambda r: (positive(r, S),)),
    ("tanh", lambda x: anp.tanh(x), lambda r: (normal(r, S),)),
    ("sum_axis", lambda x: anp.sum(x, axis=0), lambda r: (normal(r, S),)),
    ("matmul", lambda a, b: anp.matmul(a, b), lambda r: (normal(r, (3, 4)), normal(r, (4, 2)))),
    ("take", lambda x: anp.take(x, [2, 0, 2], axis=0), lambda r: (normal(r, S),)),
    ("norm", lambda x: anp.norm(x, axis=1), lambda r: (normal(r, S),)),
    ("clamp", lambda x: anp.clamp(x, -0.5, 0.5),
     lambda r: (np.where(MASK, 1.0, 0.3) * away(r, S, 0.6, 1.5),)),
]


@pytest.mark.parametrize("label, fn, make", F32_CASES, ids=[c[0] for c in F32_CASES])
def test_float32(label, fn, make):
    args64 = _args(label, make)
    args32 = tuple(a.astype(np.float32) for a in args64)
    rng = np.random.default_rng(2)
    w = rng.standard_normal(np.shape(fn(*args64)))

    def run(args, dt):
        xs = [ad.Array(a, requires_grad=True) for a in args]
        out = fn(*xs)
        ad.backward(out, w.astype(dt))
        return out, [x.grad for x in xs]

    out32, g32 = run(args32, np.float32)
    out64, g64 = run(tuple(a.astype(np.float64) for a in args32), np.float64)
    assert out32.dtype == np.float32
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32
        # float32 rounding (~6e-8) through a few ops stays far below 1e-4 relative
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out32.value, out64.value, rtol=1e-4, atol=1e-6)
    # forward mode keeps float32 too
    xs = [ad.Array(a, requires_grad=True) for a in args32]
    out = fn(*xs)
    ad.forward(xs[0])
    assert out.tangent.dtype == np.float32
