"""Checkpointing is scheduling (spec section 3.9, AE-9): the adjoint of E6 (2-D convolution
plus L2 loss) is the same whether its forward intermediate ``convolved`` is stored
(compute_root), recomputed (inline) or computed per 32 x 32 tile of ``d_in`` (compute_at).
The pipeline and schedules are those of ``benchmarks/bench_checkpoint.py``, in float64."""

import os
import sys

import halide_ad as hl
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_checkpoint import SCHEDULES, backward  # noqa: E402 - the benchmark's own pipeline

N = 64


def _convolve(img, kernel):
    """E6's convolved image, zero padding (float64)."""
    h, w = img.shape
    kh, kw = kernel.shape
    p = np.pad(img, ((kh - 1, 0), (kw - 1, 0)))
    return sum(p[kh - 1 - j:kh - 1 - j + h, kw - 1 - i:kw - 1 - i + w] * kernel[j, i]
               for j in range(kh) for i in range(kw))


def _reference(img, target, kernel):
    """d_in = correlation of 2 (convolved - target) with kernel, zero padding (float64)."""
    h, w = img.shape
    kh, kw = kernel.shape
    g = np.pad(2 * (_convolve(img, kernel) - target), ((0, kh - 1), (0, kw - 1)))
    return sum(g[j:j + h, i:i + w] * kernel[j, i] for j in range(kh) for i in range(kw))


@pytest.fixture(scope="module", params=[(1, 5), (3, 5)], ids=["1x5", "3x5"])
def problem(request):
    rng = np.random.default_rng(7)
    img, target = rng.random((N, N)), rng.random((N, N))
    kernel = rng.random(request.param)
    unscheduled = backward(hl, img, target, kernel, "unscheduled")[0]().copy()
    return img, target, kernel, unscheduled


def test_unscheduled_adjoint_matches_numpy(problem):
    img, target, kernel, unscheduled = problem
    ref = _reference(img, target, kernel)
    assert np.max(np.abs(unscheduled - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize("how", SCHEDULES[:4])  # rule=paper inlines as "recompute" does
def test_schedule_gives_the_unscheduled_gradient(problem, how):
    img, target, kernel, unscheduled = problem
    got = backward(hl, img, target, kernel, how)[0]()
    assert got.dtype == np.float64
    assert np.max(np.abs(got - unscheduled)) <= 1e-12 * np.max(np.abs(unscheduled))


def _loss(img, target, kernel):
    """E6's loss, sum (convolved - target)^2, in numpy (float64)."""
    return float(np.sum((_convolve(img, kernel) - target) ** 2))


@pytest.mark.parametrize("how", SCHEDULES[:4])
def test_scheduled_gradient_passes_finite_differences_on_a_crop(problem, how):
    """AE-9's FD check: a 3 x 3 crop at the image corner (zero padding) and one inside."""
    img, target, kernel, _ = problem
    got = backward(hl, img, target, kernel, how)[0]()
    h = 1e-6
    for r0, c0 in ((0, 0), (30, 41)):
        for r in range(r0, r0 + 3):
            for c in range(c0, c0 + 3):
                e = np.zeros_like(img)
                e[r, c] = h
                fd = (_loss(img + e, target, kernel) - _loss(img - e, target, kernel)) / (2 * h)
                assert abs(got[r, c] - fd) <= 1e-6 * max(1.0, abs(fd)), (how, r, c, got[r, c], fd)
