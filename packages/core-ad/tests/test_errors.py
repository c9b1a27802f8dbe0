"""Bad programs and inputs fail with a named error that says what is wrong."""

import numpy as np
import pytest

import core_ad as ad
import core_ad.numpy as anp


def test_differentiating_integer_array():
    with pytest.raises(TypeError, match="dtype int64"):
        ad.grad(lambda x: anp.sum(x * 2.0))(np.arange(3))
    with pytest.raises(TypeError, match="only floating-point"):
        ad.Array(np.arange(3), requires_grad=True)
    with pytest.raises(TypeError, match="dtype int"):
        ad.batch_hessian(lambda x: x[:, 0], np.ones((4, 2), dtype=np.int32))


def test_vjp_cotangent_shape_mismatch():
    out, pull = ad.vjp(lambda x: x * 2.0, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"cotangent 0 has shape \(3, 2\) but output 0 has shape"
                                         r" \(2, 3\)"):
        pull(np.ones((3, 2)))
    with pytest.raises(ValueError, match="structure"):
        pull((np.ones((2, 3)), np.ones(1)))
    with pytest.raises(TypeError, match="floating point"):
        pull(np.ones((2, 3), dtype=np.int64))


def test_jvp_tangent_shape_mismatch():
    with pytest.raises(ValueError, match=r"tangent 0 has shape \(2,\) but primal 0 has shape"):
        ad.jvp(anp.sin, (np.ones(3),), (np.ones(2),))
    with pytest.raises(ValueError, match="2 primals but 1 tangents"):
        ad.jvp(lambda a, b: a * b, (np.ones(3), np.ones(3)), (np.ones(3),))


def test_batch_hessian_of_lane_mixing_function():
    x = np.random.default_rng(0).normal(size=(64, 3))
    with pytest.raises(ad.LaneMixingError, match="depends on other lanes"):
        ad.batch_hessian(lambda v: anp.sum(v * v, axis=1) - anp.mean(v[:, 0]), x)
    shifted = lambda v: anp.concatenate([v[1:, 0], v[:1, 0]]) * v[:, 1]  # noqa: E731
    with pytest.raises(ad.LaneMixingError):
        ad.batch_hessian(shifted, x)
    with pytest.raises(ValueError, match=r"must map shape \(64, 3\) to \(64,\)"):
        ad.batch_hessian(lambda v: v * v, x)
    with pytest.raises(ValueError, match=r"shape \(B, n\)"):
        ad.batch_hessian(lambda v: v, np.ones(5))


def test_grad_of_non_scalar():
    with pytest.raises(TypeError, match="scalar output"):
        ad.grad(lambda x: x * 2.0)(np.ones(3))
    with pytest.raises(TypeError, match="scalar output"):
        ad.hessian(lambda x: x * 2.0)(np.ones(3))


def test_shape_errors_name_shapes():
    a = ad.Array(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"\(2, 3\), \(4,\) do not broadcast"):
        a + np.ones(4)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        anp.matmul(a, np.ones((2, 2)))
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(4, 2)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        anp.sum(a, axis=2)


def test_traced_arrays_are_immutable_and_numpy_escape_is_caught():
    a = ad.Array(np.ones(3), requires_grad=True)
    with pytest.raises(TypeError, match="immutable"):
        a[0] = 2.0
    with pytest.raises(TypeError, match="not differentiable"):
        np.add.reduce(a)
    with pytest.raises(TypeError, match="not differentiable"):
        np.cumsum(a)


def test_backward_errors():
    a = ad.Array(np.ones(3), requires_grad=True)
    y = a * 2.0
    with pytest.raises(ValueError, match=r"seed has shape \(2,\) but the output has shape"):
        ad.backward(y, np.ones(2))
    with pytest.raises(ValueError, match="does not depend"):
        ad.Array(np.ones(2)).backward()
    with pytest.raises(ValueError, match="2 outputs but 1 seeds"):
        ad.backward([y, y], [np.ones(3)])


def test_argnums_out_of_range():
    with pytest.raises(ValueError, match="argnums 2 out of range"):
        ad.grad(lambda x: x, argnums=2)(1.0)


def test_custom_functions_without_rules():
    @ad.custom_vjp
    def f(x):
        return x

    with pytest.raises(TypeError, match="call defvjp"):
        f(np.ones(1))


def test_check_grads_reports_the_wrong_entry():
    @ad.custom_vjp
    def bad(x):
        return anp.sin(x)

    bad.defvjp(lambda x: (bad(x), x), lambda x, ct: (ct * anp.cos(x) * 1.01,))  # 1% off
    with pytest.raises(AssertionError, match=r"reverse-mode d out\[0\] / d in\[0\]"):
        ad.check_grads(bad, (np.array([0.3, 0.4]),), order=1, modes=("rev",))
    ad.check_grads(bad, (np.array([0.3, 0.4]),), order=1, modes=("fwd",))  # fwd uses sin


def test_check_grads_arguments():
    with pytest.raises(ValueError, match="unknown modes"):
        ad.check_grads(anp.sin, (np.ones(2),), modes=("sideways",))
    with pytest.raises(TypeError, match="not floating point"):
        ad.check_grads(anp.sin, (np.arange(2),))


@pytest.mark.parametrize(
    "h, fwd_err, central_err", [(1e-3, 1.36e-3, 4.53e-7), (1e-6, 1.36e-6, -1.6e-10)]
)
def test_finite_difference_step_dilemma(h, fwd_err, central_err):  # CA-NUM-6
    e = np.exp(1.0)
    fwd = (np.exp(1 + h) - e) / h - e
    central = (np.exp(1 + h) - np.exp(1 - h)) / (2 * h) - e
    assert fwd == pytest.approx(fwd_err, rel=0.1)
    if abs(central_err) > 1e-9:
        assert central == pytest.approx(central_err, rel=0.1)
    else:
        assert abs(central) < 1e-9
    tiny = 1e-12
    assert abs((np.exp(1 + tiny) - e) / tiny - e) > 1e-5
    assert abs((np.exp(1 + tiny) - np.exp(1 - tiny)) / (2 * tiny) - e) > 1e-5
