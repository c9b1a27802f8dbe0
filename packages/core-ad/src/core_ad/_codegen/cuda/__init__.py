"""CUDA backend of :func:`core_ad.sym.compile`: CUDA C generated from the same ``cse`` program
as the numpy reference, compiled and launched through CuPy.

* :func:`cuda_source(outputs, inputs, name=...) <.source.cuda_source>` -- the kernel source
  (no GPU or CuPy needed);
* :func:`compile_cuda(outputs, inputs) <.launcher.compile_cuda>` -- ``fn(*cupy_arrays)``
  returning a tuple of CuPy arrays, one per output;
* registry hooks for ``sym.compile(..., backend="cuda")``: :func:`available`,
  :func:`check_options` (``name``), :func:`compile_program(prog, roots, inputs, options, key)
  <.launcher.compile_program>`;
* :func:`spell <.source.spell>` -- the scalar-expression emitter (one lane-wise primitive over C
  operand expressions), for sibling code generators with their own loop nests.

The kernel signature convention is documented in :mod:`.source`. CuPy is imported only when a
compiled function is called.
"""

from .launcher import (
    CudaFunction,
    available,
    check_options,
    clear_cache,
    compile_cuda,
    compile_program,
)
from .source import KernelSpec, c_literal, c_type, cuda_source, kernel_spec, program_spec, spell

__all__ = [
    "CudaFunction",
    "KernelSpec",
    "available",
    "c_literal",
    "c_type",
    "check_options",
    "clear_cache",
    "compile_cuda",
    "compile_program",
    "cuda_source",
    "kernel_spec",
    "program_spec",
    "spell",
]
