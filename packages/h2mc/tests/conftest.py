import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


class Poisoned:
    """A compiled path kernel whose outputs ``poison(out, calls)`` edits (NaN contributions,
    say) before PathSpace sees them: ``out`` is the ``(n_out, lanes)`` result of call number
    ``calls`` (from 1)."""

    def __init__(self, kernel, poison):
        self.kernel, self.poison, self.calls = kernel, poison, 0

    def call_stacked(self, block):
        out = np.array(self.kernel.call_stacked(block), dtype=np.float64)
        self.calls += 1
        self.poison(out, self.calls)
        return out


@pytest.fixture
def poisoned():
    """``poisoned(kernel, poison)``: a :class:`Poisoned` kernel."""
    return Poisoned
