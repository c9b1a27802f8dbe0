"""codegen.compile_ir: one module, several entry points."""

import ctypes
import uuid

import pytest
from core_ad import codegen

_IR = """
define double @{p}_twice(double %x) {{
  %r = fmul double %x, 2.0
  ret double %r
}}
define double @{p}_square(double %x) {{
  %r = fmul double %x, %x
  ret double %r
}}
"""


def test_several_addresses_from_one_module():
    p = "t" + uuid.uuid4().hex[:12]
    (a, b), times = codegen.compile_ir(_IR.format(p=p), f"test_{p}",
                                       [f"{p}_twice", f"{p}_square"])
    fty = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)
    assert fty(a)(3.5) == 7.0 and fty(b)(3.5) == 12.25
    assert {"parse", "opt", "codegen"} <= set(times)


def test_single_name_keeps_returning_one_address():
    p = "t" + uuid.uuid4().hex[:12]
    addr, _ = codegen.compile_ir(_IR.format(p=p), f"test_{p}", f"{p}_square")
    assert isinstance(addr, int)
    assert ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(addr)(-3.0) == 9.0


def test_missing_function_is_named():
    p = "t" + uuid.uuid4().hex[:12]
    with pytest.raises(RuntimeError, match=f"{p}_cube"):
        codegen.compile_ir(_IR.format(p=p), f"test_{p}", [f"{p}_twice", f"{p}_cube"])
    with pytest.raises(TypeError, match="fn_name"):
        codegen.compile_ir(_IR.format(p=p), f"test2_{p}", [])
