"""The demo's gradient-descent fit: blur taps recovered through propagate_adjoints."""

import numpy as np

from halide_ad import demo


def test_fit_recovers_blur_taps():
    losses, taps, truth = demo.fit_blur_taps(steps=150, size=(40, 24))  # steps cost ~1 ms
    assert losses[-1] < 1e-6 * losses[0]
    assert np.abs(taps - truth).max() < 1e-3
