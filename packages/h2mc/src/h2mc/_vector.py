"""3-vectors as tuples of core_ad expressions (or numbers): the arithmetic path expressions
are written in."""

from __future__ import annotations

from core_ad import sym


def dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def sub(a, b):
    return tuple(x - y for x, y in zip(a, b))


def normalize(a):
    inv = sym.rsqrt(dot(a, a))
    return tuple(x * inv for x in a)
