"""Halide's scalar types (``hl.Float(32)``, ``hl.Int(32)``, ``hl.UInt(8)``, ``hl.Bool()``) and
their numpy dtypes, plus Halide's rules for combining types in arithmetic."""

from __future__ import annotations

import numpy as np

__all__ = ["Bool", "Float", "Int", "Type", "UInt", "common_type", "type_of_dtype"]


class Type:
    """A Halide scalar type: ``code`` in {"float", "int", "uint", "bool"} and ``bits``."""

    __slots__ = ("bits", "code")

    def __init__(self, code: str, bits: int):
        self.code, self.bits = code, bits
        _ = self.dtype  # validates the combination

    @property
    def dtype(self) -> np.dtype:
        if self.code == "bool":
            return np.dtype(np.bool_)
        letter = {"float": "f", "int": "i", "uint": "u"}[self.code]
        try:
            return np.dtype(f"{letter}{self.bits // 8}")
        except TypeError:
            raise ValueError(f"unsupported type {self.code}{self.bits}") from None

    def is_float(self) -> bool:
        return self.code == "float"

    def is_int(self) -> bool:
        return self.code == "int"

    def is_uint(self) -> bool:
        return self.code == "uint"

    def is_bool(self) -> bool:
        return self.code == "bool"

    def with_bits(self, bits: int) -> Type:
        return Type(self.code, bits)

    def min(self):
        return np.iinfo(self.dtype).min if self.code in ("int", "uint") else -np.inf

    def max(self):
        return np.iinfo(self.dtype).max if self.code in ("int", "uint") else np.inf

    def __eq__(self, other):
        return isinstance(other, Type) and (self.code, self.bits) == (other.code, other.bits)

    def __hash__(self):
        return hash((self.code, self.bits))

    def __repr__(self):
        return "Bool()" if self.code == "bool" else f"{self.code.capitalize()}({self.bits})"

    __str__ = __repr__


def Float(bits: int = 32) -> Type:
    return Type("float", bits)


def Int(bits: int = 32) -> Type:
    return Type("int", bits)


def UInt(bits: int = 32) -> Type:
    return Type("uint", bits)


def Bool() -> Type:
    return Type("bool", 1)


def type_of_dtype(dt) -> Type:
    dt = np.dtype(dt)
    if dt.kind == "b":
        return Bool()
    code = {"f": "float", "i": "int", "u": "uint"}.get(dt.kind)
    if code is None:
        raise TypeError(f"no Halide type for numpy dtype {dt}")
    return Type(code, dt.itemsize * 8)


def common_type(a: Type, b: Type) -> Type:
    """Halide's coercion of two operand types: a float beats an int (and takes its own width);
    two floats or two ints of one signedness take the wider; a signed and an unsigned int
    give a signed int of the wider width; bool acts as the other operand's type."""
    if a == b:
        return a
    if a.is_bool():
        return b
    if b.is_bool():
        return a
    if a.is_float() and b.is_float():
        return a if a.bits >= b.bits else b
    if a.is_float():
        return a
    if b.is_float():
        return b
    bits = max(a.bits, b.bits)
    if a.code == b.code:
        return Type(a.code, bits)
    return Int(bits)
