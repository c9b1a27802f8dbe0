"""Kernel caches keyed by the structure of the expression graph.

Three levels:

1. **Identity** (:meth:`KernelCache.lookup`): ``(backend, options, id of each output, id of
   each input)``. Expressions are hash-consed, so within a process a structurally equal graph
   *is* the same objects; a cached kernel holds its outputs and inputs, so their ids stay
   valid while the entry lives. A repeated ``sym.compile`` costs a dict lookup (microseconds),
   before any traversal.
2. **Structure** (:func:`structural_key`): the SHA-256 of a canonical serialisation of the
   :func:`~core_ad.sym.cse` program -- per node, in topological order: primitive name, params,
   result dtype and operand positions; constant values (bytes), dtypes and weakness; leaf
   kind, key, dtype and input position -- plus the outputs, the input list, the backend and
   its options. Two compiles of structurally equal graphs return the same kernel object.
3. **Code** (:func:`code_key`): the structural serialisation with leaf names left out (only
   kind, dtype and input position: renaming a var does not change the machine code), the
   variant, the backend's code-generation settings, the host signature and
   :data:`CODEGEN_VERSION`, a hash of the code generators' own sources (an edit to the
   emitter, the kernel builder, the vector math or the runtime's calling convention names new
   machine code, so the disk cache never serves what an older generator built). It names the
   machine code in memory and the object file in the disk cache (see :mod:`.llvm.jit`).

Both in-memory caches are bounded (least recently used entries are dropped).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

import numpy as np

from .._sym.program import Program
from .._sym.expr import Apply, Const, Leaf

__all__ = ["KernelCache", "structural_key", "code_key", "serialize", "KERNELS"]

def _generator_fingerprint(here: str = os.path.dirname(os.path.abspath(__file__))) -> str:
    """A hash of the code generators' sources below ``here`` (core_ad's ``_codegen``)."""
    h = hashlib.sha256()
    for rel in ("cache.py", "llvm/emitter.py", "llvm/kernel.py", "llvm/vecmath.py",
                "llvm/runtime.py", "llvm/builder.py", "llvm/jit.py", "llvm/__init__.py"):
        try:
            with open(os.path.join(here, rel), "rb") as f:
                h.update(f.read())
        except OSError:  # sources not shipped: the package version stands in
            from importlib.metadata import version

            h.update(version("difvis-core-ad").encode())
            break
    return h.hexdigest()[:16]


CODEGEN_VERSION = "core_ad-llvm-" + _generator_fingerprint()


def _prim_ident(prim) -> str:
    from .._sym.simplify import CORE_PRIMITIVES

    if prim in CORE_PRIMITIVES:
        return prim.name
    low = prim.extra.get("llvm_lowering")
    tag = f"{low.__module__}.{low.__qualname__}" if low is not None else f"id{id(prim)}"
    return f"{prim.name}@{tag}"


def serialize(prog: Program, roots, inputs, with_leaf_keys: bool = True) -> list[str]:
    """The canonical serialisation (one string per node, then outputs and inputs)."""
    pos = {id(n): k for k, (_, n) in enumerate(prog.assignments)}
    in_pos = {id(v): j for j, v in enumerate(inputs)}
    lines = []
    for _, n in prog.assignments:
        if isinstance(n, Leaf):
            key = repr(n.key) if with_leaf_keys else ""
            lines.append(f"L|{n.kind}|{key}|{n.dtype.str}|{in_pos.get(id(n), -1)}")
        elif isinstance(n, Const):
            b = np.asarray(n.value, dtype=n.dtype).tobytes().hex()
            lines.append(f"C|{n.dtype.str}|{int(bool(n.weak))}|{b}")
        elif isinstance(n, Apply):
            args = ",".join(str(pos[id(a)]) for a in n.args)
            lines.append(f"A|{_prim_ident(n.prim)}|{n.pkey!r}|{n.dtype.str}|{args}")
        else:  # pragma: no cover - the node types are closed
            raise TypeError(f"unknown node {n!r}")
    lines.append("O|" + ",".join(str(pos[id(r)]) for r in roots))
    ins = []
    for v in inputs:
        key = repr(v.key) if with_leaf_keys else ""
        ins.append(f"{v.kind}:{key}:{v.dtype.str}:{pos.get(id(v), -1)}")
    lines.append("I|" + ",".join(ins))
    return lines


def _digest(lines, *extra) -> str:
    h = hashlib.sha256()
    for x in (*extra, *lines):
        h.update(str(x).encode())
        h.update(b"\n")
    return h.hexdigest()


def structural_key(prog: Program, roots, inputs, backend: str, options: tuple = ()) -> str:
    """Hash of the graph structure (with leaf kinds, keys, dtypes), backend and options."""
    return _digest(serialize(prog, roots, inputs, True), CODEGEN_VERSION, backend, options)


def code_key(prog: Program, roots, inputs, *extra) -> str:
    """Hash naming the machine code: the structure without leaf names, plus ``extra``
    (variant, code-generation settings, host signature)."""
    return _digest(serialize(prog, roots, inputs, False), CODEGEN_VERSION, *extra)


class KernelCache:
    """Bounded identity + structure caches of compiled kernel objects."""

    def __init__(self, maxsize: int = 512):
        self.maxsize = maxsize
        self.lock = threading.RLock()
        self._by_id: OrderedDict = OrderedDict()
        self._by_hash: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def identity_key(backend, roots, inputs, options) -> tuple:
        return (backend, options, tuple(map(id, roots)), tuple(map(id, inputs)))

    def lookup(self, backend, roots, inputs, options):
        key = self.identity_key(backend, roots, inputs, options)
        k = self._by_id.get(key)
        if k is not None:
            # the ids are valid: the cached kernel holds these very objects
            if all(a is b for a, b in zip(k.outputs, roots)) and all(
                a is b for a, b in zip(k.inputs, inputs)
            ):
                with self.lock:
                    self._by_id.move_to_end(key, last=True)
                    self.hits += 1
                return k
        return None

    def lookup_hash(self, skey):
        with self.lock:
            k = self._by_hash.get(skey)
            if k is not None:
                self._by_hash.move_to_end(skey, last=True)
                self.hits += 1
            return k

    def store(self, backend, roots, inputs, options, skey, kernel):
        with self.lock:
            self.misses += 1
            self._by_id[self.identity_key(backend, roots, inputs, options)] = kernel
            self._by_hash[skey] = kernel
            while len(self._by_id) > self.maxsize:
                self._by_id.popitem(last=False)
            while len(self._by_hash) > self.maxsize:
                self._by_hash.popitem(last=False)

    def clear(self):
        with self.lock:
            self._by_id.clear()
            self._by_hash.clear()

    def __len__(self):
        return len(self._by_hash)


KERNELS = KernelCache()
