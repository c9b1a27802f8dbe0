"""The layout of root Func storage on the CPU: dense, with outer strides padded away from
multiples of 4 KiB. The compiled kernels read every stride from the arrays (outputs take
the user's arrays as they are), so the padding lives here alone."""
from __future__ import annotations

import numpy as np

#: L1 set aliasing: rows or planes whose byte stride is a multiple of this map every element
#: of a column (or every channel of a pixel) to one cache set, and a loop that walks across
#: them (a scatter over channels, a transposed read) thrashes an 8-way L1
ALIAS_BYTES = 4096
CACHE_LINE = 64


def padded_empty(shape, dtypes, order=None):
    """Uninitialised arrays of ``shape`` (numpy order), one per dtype (a Tuple's values), all
    with the same element strides: laid out in the Halide dimension ``order`` (innermost
    first; default 0, 1, ...), the outer strides padded by a cache line of the first dtype
    wherever they would be a multiple of 4 KiB (intermediate Funcs: the compiled kernels take
    their strides from the arrays)."""
    dtypes = [np.dtype(dt) for dt in dtypes]
    ndim = len(shape)
    order = range(ndim) if order is None else order
    item = dtypes[0].itemsize
    strides, stride = [0] * ndim, 1
    for d in order:
        strides[ndim - 1 - d] = stride
        stride *= shape[ndim - 1 - d]
        if stride * item % ALIAS_BYTES == 0 and item <= CACHE_LINE:
            stride += CACHE_LINE // item
    if 0 in shape:
        return [np.empty(shape, dt) for dt in dtypes]
    return [np.lib.stride_tricks.as_strided(
        np.empty(stride, dt), shape, [st * dt.itemsize for st in strides], writeable=True)
        for dt in dtypes]


def element_strides(a):
    return tuple(st // a.itemsize for st in a.strides)
