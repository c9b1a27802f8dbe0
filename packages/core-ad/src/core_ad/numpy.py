"""numpy-like math on traced arrays (and plain numpy values).

Every function dispatches through the rule table, so it records a graph node when an argument
is a traced :class:`core_ad.Array`, evaluates plainly on numpy inputs, and builds a symbolic
node on :mod:`core_ad.sym` expressions (lane-wise functions only).
"""

from ._rules import (  # noqa: F401
    abs,
    add,
    arccos,
    arcsin,
    arctan,
    arctan2,
    astype,
    broadcast_to,
    ceil,
    clamp,
    concatenate,
    cos,
    cosh,
    cross,
    div,
    dot,
    eq,
    erf,
    exp,
    expand_dims,
    expm1,
    floor,
    gather,
    ge,
    getitem,
    gt,
    identity,
    isfinite,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    lt,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mul,
    ne,
    neg,
    norm,
    normalize,
    pow,
    prod,
    reciprocal,
    reshape,
    round,
    rsqrt,
    scatter,
    scatter_add,
    sigmoid,
    sign,
    sin,
    sinh,
    sqrt,
    square,
    squeeze,
    stop_gradient,
    stack,
    sub,
    sum,
    swapaxes,
    take,
    tan,
    tanh,
    transpose,
    trunc,
    where,
    floor_divide,
    mod,
)

from ._linalg import eigh  # noqa: E402, F401

clip = clamp
multiply = mul
subtract = sub
divide = div
remainder = mod
negative = neg
power = pow
absolute = abs
arctan2 = arctan2
