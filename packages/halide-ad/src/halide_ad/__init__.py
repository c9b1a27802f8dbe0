"""halide_ad: a Halide-like image-pipeline language in Python, compiled to multi-threaded,
vectorised CPU code through core_ad's LLVM emitter.

The names and call shapes are those of Halide's Python bindings::

    import halide_ad as hl
    x, y = hl.Var("x"), hl.Var("y")
    inp = hl.Buffer(img)                       # numpy (h, w): x is the LAST numpy axis
    clamped = hl.BoundaryConditions.repeat_edge(inp)
    blur_x, blur = hl.Func("blur_x"), hl.Func("blur")
    blur_x[x, y] = (clamped[x - 1, y] + clamped[x, y] + clamped[x + 1, y]) / 3
    blur[x, y] = (blur_x[x, y - 1] + blur_x[x, y] + blur_x[x, y + 1]) / 3
    blur.tile(x, y, xi, yi, 64, 32).vectorize(xi, 8).parallel(y)
    blur_x.compute_at(blur, x)
    out = np.asarray(blur.realize([w, h]))     # numpy (h, w)
    blur.print_loop_nest()
"""

from . import _boundary as BoundaryConditions
from ._autoschedule import AutoSchedule, auto_schedule
from ._bounds import const_value
from ._buffer import Buffer
from ._custom import custom_derivative
from ._derivative import Derivative, propagate_adjoints
from ._expr import (
    Expr,
    ExprError,
    Param,
    Range,
    RDom,
    RVar,
    Var,
    abs,
    acos,
    acosh,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    cast,
    ceil,
    clamp,
    cos,
    cosh,
    erf,
    exp,
    f32,
    f64,
    fast_exp,
    fast_log,
    floor,
    i8,
    i16,
    i32,
    i64,
    is_finite,
    is_nan,
    lerp,
    log,
    max,
    min,
    pow,
    round,
    select,
    sin,
    sinh,
    sqrt,
    tan,
    tanh,
    trunc,
    u8,
    u16,
    u32,
    u64,
)
from ._func import Func, FuncError, FuncRef, Stage, Tuple
from ._lower import BoundsError
from ._pipeline import Pipeline, Realization
from ._schedule import ScheduleError
from ._tangents import Tangents, propagate_tangents
from ._torch import TorchOp, torch_op
from ._types import Bool, Float, Int, Type, UInt

__all__ = [
    "AutoSchedule",
    "Bool",
    "BoundaryConditions",
    "BoundsError",
    "Buffer",
    "Derivative",
    "Expr",
    "ExprError",
    "Float",
    "Func",
    "FuncError",
    "FuncRef",
    "Int",
    "Param",
    "Pipeline",
    "RDom",
    "RVar",
    "Range",
    "Realization",
    "ScheduleError",
    "Stage",
    "Tangents",
    "TorchOp",
    "Tuple",
    "Type",
    "UInt",
    "Var",
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "auto_schedule",
    "cast",
    "ceil",
    "clamp",
    "const_value",
    "cos",
    "cosh",
    "custom_derivative",
    "erf",
    "exp",
    "f32",
    "f64",
    "fast_exp",
    "fast_log",
    "floor",
    "i8",
    "i16",
    "i32",
    "i64",
    "is_finite",
    "is_nan",
    "lerp",
    "log",
    "max",
    "min",
    "pow",
    "propagate_adjoints",
    "propagate_tangents",
    "round",
    "select",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "torch_op",
    "trunc",
    "u8",
    "u16",
    "u32",
    "u64",
]
