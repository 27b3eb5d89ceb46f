"""Embedding, RMSNorm and SwiGLU kernels against numpy, plus finite-difference checks of the references."""
import numpy as np
import pytest

from core.kernels.embedding import Embedding
from core.kernels.rmsnorm import RMSNorm
from core.kernels.swiglu import SwiGLU
from tests import reference as ref
from tests.opcheck import assert_close, from_device, to_device

SHAPES = [(1, 1), (7, 7), (33, 33), (3, 257), (5, 1000)]


@pytest.mark.parametrize("n_tokens,d_model,vocab", [(1, 1, 1), (7, 33, 5), (33, 7, 257), (257, 64, 40)])
@pytest.mark.parametrize("local", [1, 32, 256])
def test_embedding(device, rng, n_tokens, d_model, vocab, local):
    op = Embedding(device, local_size=local)
    w = rng.standard_normal((vocab, d_model)).astype(np.float32)
    tokens = rng.integers(0, vocab, n_tokens).astype(np.int32)
    g = rng.standard_normal((n_tokens, d_model)).astype(np.float32)
    dw0 = rng.standard_normal((vocab, d_model)).astype(np.float32)
    W, T, O, G, DW = to_device(device, w, tokens, np.zeros((n_tokens, d_model), np.float32), g, dw0)
    op.forward(O, T, W, n_tokens, d_model, vocab)
    assert_close(from_device(device, O, g), ref.embedding_forward(tokens, w), what="out")
    op.backward(DW, G, T, n_tokens, vocab, d_model)
    assert_close(from_device(device, DW, dw0), dw0 + ref.embedding_backward(g, tokens, vocab), what="d_weight")


def test_embedding_out_of_range_ids_are_harmless(device):
    op = Embedding(device)
    w = np.ones((4, 3), np.float32)
    tokens = np.array([1, 9, -2], np.int32)
    W, T, O = to_device(device, w, tokens, np.full((3, 3), 7, np.float32))
    op.forward(O, T, W, 3, 3, 4)
    out = from_device(device, O, np.zeros((3, 3), np.float32))
    assert np.array_equal(out, [[1, 1, 1], [0, 0, 0], [0, 0, 0]])
    DW = device.upload(np.zeros((4, 3), np.float32))
    op.backward(DW, device.upload(np.ones((3, 3), np.float32)), T, 3, 4, 3)
    assert from_device(device, DW, w).sum() == 3.0  # only row 1 got a gradient


@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("local", [1, 2, 32, 256, None])
def test_rmsnorm(device, rng, rows, dim, local):
    op = RMSNorm(device, local_size=local)
    eps = 1e-5
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    g = rng.standard_normal((rows, dim)).astype(np.float32)
    dw0 = rng.standard_normal(dim).astype(np.float32)
    X, W, G, O, R, DX, DW = to_device(device, x, w, g, np.zeros_like(x), np.zeros(rows, np.float32),
                                      np.zeros_like(x), dw0)
    op.forward(O, R, X, W, rows, dim, eps)
    want_y, want_r = ref.rmsnorm_forward(x, w, eps)
    assert_close(from_device(device, O, x), want_y, what="y")
    assert_close(from_device(device, R, want_r), want_r, what="rstd")
    op.backward(DX, DW, G, X, W, R, rows, dim)
    want_dx, want_dw = ref.rmsnorm_backward(g, x, w, eps)
    assert_close(from_device(device, DX, x), want_dx, atol=1e-4, what="d_x")
    assert_close(from_device(device, DW, dw0), dw0 + want_dw, atol=1e-4, what="d_weight")


@pytest.mark.parametrize("n", [1, 7, 33, 257, 5000])
@pytest.mark.parametrize("local", [1, 64, 256])
def test_swiglu(device, rng, n, local):
    op = SwiGLU(device, local_size=local)
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    up, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    GA, U, G, O, DG, DU = to_device(device, gate, up, g, *(np.zeros(n, np.float32) for _ in range(3)))
    op.forward(O, GA, U, n)
    assert_close(from_device(device, O, gate), ref.swiglu_forward(gate, up), what="out")
    op.backward(DG, DU, G, GA, U, n)
    want_dg, want_du = ref.swiglu_backward(g, gate, up)
    assert_close(from_device(device, DG, gate), want_dg, what="d_gate")
    assert_close(from_device(device, DU, gate), want_du, what="d_up")


def test_swiglu_extremes_are_finite(device):
    op = SwiGLU(device)
    gate = np.array([-100, -30, 0, 30, 100], np.float32)
    up = np.ones(5, np.float32)
    GA, U, O, DG, DU = to_device(device, gate, up, *(np.zeros(5, np.float32) for _ in range(3)))
    op.forward(O, GA, U, 5)
    op.backward(DG, DU, device.upload(np.ones(5, np.float32)), GA, U, 5)
    for buf in (O, DG, DU):
        assert np.all(np.isfinite(from_device(device, buf, gate)))
    assert_close(from_device(device, O, gate), ref.swiglu_forward(gate, up), atol=1e-4, what="out")


def _fd(f, x, eps=1e-6):
    """Central finite differences of scalar f at x (float64)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        hi = f(x)
        x[i] = old - eps
        lo = f(x)
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


def test_rmsnorm_reference_matches_finite_differences(rng):
    x = rng.standard_normal((3, 5))
    w = rng.standard_normal(5)
    g = rng.standard_normal((3, 5))
    eps = 1e-5

    def y(x_, w_):
        return x_ / np.sqrt((x_ ** 2).mean(axis=1, keepdims=True) + eps) * w_

    dx, dw = ref.rmsnorm_backward(g.astype(np.float32), x.astype(np.float32), w.astype(np.float32), eps)
    np.testing.assert_allclose(dx, _fd(lambda a: (g * y(a, w)).sum(), x.copy()), atol=1e-4)
    np.testing.assert_allclose(dw, _fd(lambda b: (g * y(x, b)).sum(), w.copy()), atol=1e-4)


def test_swiglu_reference_matches_finite_differences(rng):
    gate, up, g = rng.standard_normal(6) * 3, rng.standard_normal(6), rng.standard_normal(6)

    def f(a, b):
        return (g * a / (1 + np.exp(-a)) * b).sum()

    dg, du = ref.swiglu_backward(g, gate, up)
    np.testing.assert_allclose(dg, _fd(lambda a: f(a, up), gate.copy()), atol=1e-5)
    np.testing.assert_allclose(du, _fd(lambda b: f(gate, b), up.copy()), atol=1e-5)
