"""A caching allocator for the host arrays compiled kernels write (Dr.Jit's malloc cache).

A fresh large numpy array is fresh memory from the kernel: the first write to each of its
pages faults, about 3 ms per 8 MiB on the 2-core test machine, which costs more than the
kernel that fills it (bench_grad's fused forward: 2.3 ms into reused memory, 20-40 ms into
fresh). Whether glibc reuses a freed block depends on its adaptive mmap and trim thresholds,
so the same loop ran at 8 or 28 ms per iteration depending on the order of its frees.

Kernel outputs of at least :data:`MIN_BYTES` are therefore carved from blocks this pool owns.
The array handed out is a view whose base is a small holder object; when the last view dies,
the holder's finalizer returns the block to a free list keyed by its size class (sizes round up
to eighths of a power of two, so a renderer's shrinking wavefronts reuse blocks too; at most
12.5% is wasted) and the next output of that class reuses the warm pages. At most :data:`CAP_BYTES` (``CORE_AD_HOST_CACHE_MB``) are
kept free, oldest released first; :func:`empty_cache` hands them all back.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections import deque

import numpy as np

__all__ = ["CAP_BYTES", "MIN_BYTES", "cache_stats", "empty", "empty_cache", "zeros"]

MIN_BYTES = 256 << 10  # below glibc's initial mmap threshold (128 KiB) faults are rare
CAP_BYTES = int(os.environ.get("CORE_AD_HOST_CACHE_MB", "1024")) << 20
_ALIGN = 64  # a cache line: vector loads and stores of the kernels never straddle one

_lock = threading.Lock()
_free: dict[int, deque] = {}  # block size -> blocks, oldest first
_released: deque = deque()  # (size, block) in release order, for eviction
_stats = {"free_bytes": 0, "reused": 0, "allocated": 0}
_holder_types: dict[int, type] = {}


def _holder(nbytes: int) -> type:
    """A ctypes array type of ``nbytes`` that accepts weak references (its instances are the
    bases of the arrays handed out; the memory is the pool's)."""
    t = _holder_types.get(nbytes)
    if t is None:
        t = _holder_types[nbytes] = type("_PooledBlock", (ctypes.c_char * nbytes,), {})
    return t


def _size_class(nbytes: int) -> int:
    step = 1 << max(0, nbytes.bit_length() - 4)  # eighths of the power of two below nbytes
    return -(-nbytes // step) * step


def _release(nbytes: int, block: np.ndarray) -> None:
    with _lock:
        _free.setdefault(nbytes, deque()).append(block)
        _released.append((nbytes, block))
        _stats["free_bytes"] += nbytes
        while _stats["free_bytes"] > CAP_BYTES and _released:
            size, old = _released.popleft()
            blocks = _free.get(size)
            if blocks and any(b is old for b in blocks):
                blocks.remove(old)
                _stats["free_bytes"] -= size


def _take(nbytes: int):
    with _lock:
        blocks = _free.get(nbytes)
        if not blocks:
            return None
        block = blocks.pop()  # the most recently released: its pages are the warmest
        _stats["free_bytes"] -= nbytes
        _stats["reused"] += 1
        for i in range(len(_released) - 1, -1, -1):
            if _released[i][1] is block:
                del _released[i]
                break
        return block


def empty(n: int, dtype) -> np.ndarray:
    """A 1-D array of ``n`` elements, uninitialised, from the pool when it is large."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(n, dtype)
    size = _size_class(nbytes)
    block = _take(size)
    if block is None:
        block = np.empty(size + _ALIGN, np.uint8)
        with _lock:
            _stats["allocated"] += 1
    address = block.ctypes.data
    holder = _holder(size).from_address(address + (-address) % _ALIGN)
    weakref.finalize(holder, _release, size, block)
    return np.frombuffer(holder, dtype, count=n)


def zeros(n: int, dtype) -> np.ndarray:
    out = empty(n, dtype)
    out.fill(0)
    return out


def empty_cache() -> int:
    """Free every cached block (arrays still in use are untouched); returns the bytes freed."""
    with _lock:
        freed = _stats["free_bytes"]
        _free.clear()
        _released.clear()
        _stats["free_bytes"] = 0
    return freed


def cache_stats() -> dict:
    """``free_bytes`` (cached, not in use), ``reused`` and ``allocated`` (block counts)."""
    with _lock:
        return dict(_stats)
