"""RMSNorm forward/backward against the float64 reference, at many work-group sizes, plus finite
differences of the reference (float64) and of the kernel itself (float32, loose)."""
import numpy as np
import pytest

from core.kernels.rmsnorm import RMSNorm
from core.kernels import rmsnorm_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, finite_differences, from_device, to_device

EPS = 1e-5
# work layouts: one group per row; rows per item in blocks (CPU default) or interleaved (GPU order)
PER_ITEM = pytest.mark.parametrize("per_item", [False, True, "interleaved"],
                                   ids=["group-per-row", "rows-per-item", "rows-interleaved"])


def _run(device, op, x, w, d_out, dw0):
    rows, dim = x.shape
    X, W, G, O, R, DX, DW = to_device(device, x, w, d_out, np.full_like(x, np.nan),
                                      np.full(rows, np.nan, np.float32), np.full_like(x, np.nan), dw0)
    op.forward(O, R, X, W, rows, dim, EPS)
    op.backward(DX, DW, G, X, W, R, rows, dim)
    return (from_device(device, O, x), from_device(device, R, (rows, np.float32)),
            from_device(device, DX, x), from_device(device, DW, dw0))


# 70 rows: the group-per-row layout's d_weight in three chunks of rmsnorm.WEIGHT_CHUNK (the last short)
@pytest.mark.parametrize("rows,dim", [(1, 1), (5, 7), (3, 33), (2, 257), (4, 1000), (70, 45)])
@pytest.mark.parametrize("local", [1, 2, 32, 256, "max"])
@PER_ITEM
def test_rmsnorm_forward_backward(device, rng, rows, dim, local, per_item):
    op = RMSNorm(device, local_size=device.max_work_group_size if local == "max" else local,
                 rows_per_item=bool(per_item), contiguous=per_item is True)
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    d_out = rng.standard_normal((rows, dim)).astype(np.float32)
    dw0 = rng.standard_normal(dim).astype(np.float32)
    y, rstd, dx, dw = _run(device, op, x, w, d_out, dw0)
    want_y, want_rstd = ref.rmsnorm_forward(x, w, EPS)
    want_dx, want_dw = ref.rmsnorm_backward(d_out, x, w, EPS)
    assert_close(y, want_y, what="y")
    assert_close(rstd, want_rstd, what="rstd")
    assert_close(dx, want_dx, atol=1e-4, what="d_x")
    assert_close(dw, dw0 + want_dw, atol=1e-4, what="d_weight (accumulated)")


@pytest.mark.parametrize("per_item", [False, True], ids=["group-per-row", "rows-per-item"])
def test_rmsnorm_backward_in_place(device, rng, per_item):
    """d_x may be the d_out buffer (d_weight is computed first)."""
    rows, dim = 6, 40
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    d_out = rng.standard_normal((rows, dim)).astype(np.float32)
    op = RMSNorm(device, local_size=16, rows_per_item=bool(per_item), contiguous=per_item is True)
    X, W, G, O, R, DW = to_device(device, x, w, d_out, np.zeros_like(x), np.zeros(rows, np.float32),
                                  np.zeros(dim, np.float32))
    op.forward(O, R, X, W, rows, dim, EPS)
    op.backward(G, DW, G, X, W, R, rows, dim)
    want_dx, want_dw = ref.rmsnorm_backward(d_out, x, w, EPS)
    assert_close(from_device(device, G, x), want_dx, atol=1e-4, what="d_x in place")
    assert_close(from_device(device, DW, w), want_dw, atol=1e-4, what="d_weight")


def test_rmsnorm_reference_backward_matches_finite_differences(rng):
    x, w, g = rng.standard_normal((3, 6)), rng.standard_normal(6), rng.standard_normal((3, 6))

    def loss(x_, w_):  # sum(g * y), y written out again in float64
        return (g * x_ / np.sqrt((x_ ** 2).mean(axis=1, keepdims=True) + EPS) * w_).sum()

    dx, dw = ref.rmsnorm_backward(g, x, w, EPS)
    np.testing.assert_allclose(dx, finite_differences(lambda a: loss(a, w), x.copy(), 1e-6), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(dw, finite_differences(lambda b: loss(x, b), w.copy(), 1e-6), atol=1e-5, rtol=1e-4)


def test_rmsnorm_kernel_backward_matches_its_own_finite_differences(device, rng):
    rows, dim = 2, 5
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float32)
    g = rng.standard_normal((rows, dim)).astype(np.float32)
    op = RMSNorm(device, local_size=4)

    def loss(x_, w_):
        y = _run(device, op, x_.astype(np.float32), w_.astype(np.float32), g, np.zeros(dim, np.float32))[0]
        return float((g.astype(np.float64) * y).sum())

    _, _, dx, dw = _run(device, op, x, w, g, np.zeros(dim, np.float32))
    np.testing.assert_allclose(dx, finite_differences(lambda a: loss(a, w), x.astype(np.float64), 1e-2), atol=2e-3, rtol=2e-2)
    np.testing.assert_allclose(dw, finite_differences(lambda b: loss(x, b), w.astype(np.float64), 1e-2), atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("rows,dim", [(1, 1), (5, 7), (3, 33), (37, 128), (4, 1001)])
@pytest.mark.parametrize("local", [1, 4, 64, 256])
@PER_ITEM
def test_rmsnorm_fused_residual(device, rng, rows, dim, local, per_item):
    """x_sum = a + b and RMSNorm(x_sum) in one launch: the same as the residual add then forward."""
    op = RMSNorm(device, local_size=local, rows_per_item=bool(per_item), contiguous=per_item is True)
    a, b = (rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(dim).astype(np.float32)
    A, B, W, S, O, R = to_device(device, a, b, w, np.full_like(a, np.nan), np.full_like(a, np.nan),
                                 np.full(rows, np.nan, np.float32))
    op.forward_residual(S, O, R, A, B, W, rows, dim, EPS)
    x = a + b
    want_y, want_rstd = ref.rmsnorm_forward(x, w, EPS)
    assert np.array_equal(from_device(device, S, a), x), "x_sum is the float32 sum"
    assert_close(from_device(device, O, a), want_y, what="y")
    assert_close(from_device(device, R, (rows, np.float32)), want_rstd, what="rstd")


@pytest.mark.parametrize("rows,dim", [(1, 1), (5, 7), (37, 128)])
@pytest.mark.parametrize("local", [1, 32])
@PER_ITEM
def test_rmsnorm_backward_accumulates_into_d_x(device, rng, rows, dim, local, per_item):
    """accumulate=True adds the input gradient to d_x (the residual stream's gradient)."""
    op = RMSNorm(device, local_size=local, rows_per_item=bool(per_item), contiguous=per_item is True)
    x, d_out, dx0 = (rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal(dim).astype(np.float32)
    X, W, G, O, R, DX, DW = to_device(device, x, w, d_out, np.zeros_like(x), np.zeros(rows, np.float32), dx0,
                                      np.zeros(dim, np.float32))
    op.forward(O, R, X, W, rows, dim, EPS)
    op.backward(DX, DW, G, X, W, R, rows, dim, accumulate=True)
    want_dx, _ = ref.rmsnorm_backward(d_out, x, w, EPS)
    assert_close(from_device(device, DX, x), dx0 + want_dx, atol=1e-4, what="d_x accumulated")


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
