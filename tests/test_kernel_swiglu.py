"""SwiGLU as training runs it (forward_fused / backward_fused on [gate | up] rows) against the float64
reference at odd shapes, work-group sizes and both layouts; finite at extreme inputs; plus finite
differences of the reference (float64) and of the kernel itself (float32, loose)."""
import numpy as np
import pytest

from core.kernels.swiglu import SwiGLU
from core.kernels import swiglu_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, finite_differences, from_device, to_device

LAYOUTS = pytest.mark.parametrize("per_row", [False, True], ids=["float4-units", "rows-per-item"])


def _run(device, op, gate, up, d_out):
    """forward_fused and backward_fused on one ``[gate | up]`` row of ffn_dim ``gate.size``:
    (out, d_gate, d_up)."""
    n = gate.size
    GU, G, O, DGU = to_device(device, np.concatenate([gate, up]), d_out, np.full(n, np.nan, np.float32),
                              np.full(2 * n, np.nan, np.float32))
    op.forward_fused(O, GU, 1, n)
    op.backward_fused(DGU, G, GU, 1, n)
    dgu = from_device(device, DGU, ((2 * n,), np.float32))
    return [from_device(device, O, gate), dgu[:n], dgu[n:]]


@LAYOUTS
def test_swiglu_is_finite_and_right_at_extremes(device, per_row):
    gate = np.array([-1e30, -100, -30, 0, 30, 100, 1e30], np.float32)
    up = np.full(gate.size, 0.5, np.float32)
    out, d_gate, d_up = _run(device, SwiGLU(device, rows_per_item=per_row), gate, up, np.ones_like(gate))
    for name, got in (("out", out), ("d_gate", d_gate), ("d_up", d_up)):
        assert np.all(np.isfinite(got)), f"{name}: {got}"
    # silu(x) -> x for large x, -> 0 for very negative x; d silu -> 1 and 0 likewise
    np.testing.assert_allclose(out, [0, 0, 0, 0, 15, 50, 5e29], rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(d_gate, [0, 0, 0, 0.25, 0.5, 0.5, 0.5], rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(d_up, [0, 0, 0, 0, 30, 100, 1e30], rtol=1e-6, atol=1e-10)


def test_swiglu_reference_backward_matches_finite_differences(rng):
    gate, up, g = rng.standard_normal(8) * 3, rng.standard_normal(8), rng.standard_normal(8)

    def loss(a, b):  # sum(g * silu(a) * b), written out again in float64
        return (g * a / (1.0 + np.exp(-a)) * b).sum()

    dg, du = ref.swiglu_backward(g, gate, up)
    np.testing.assert_allclose(dg, finite_differences(lambda a: loss(a, up), gate.copy(), 1e-6), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(du, finite_differences(lambda b: loss(gate, b), up.copy(), 1e-6), atol=1e-6, rtol=1e-5)


@LAYOUTS
def test_swiglu_kernel_backward_matches_its_own_finite_differences(device, rng, per_row):
    gate = (rng.standard_normal(6) * 3).astype(np.float32)
    up, g = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    op = SwiGLU(device, rows_per_item=per_row)

    def loss(a, b):
        out = _run(device, op, a.astype(np.float32), b.astype(np.float32), g)[0]
        return float((g.astype(np.float64) * out).sum())

    _, dg, du = _run(device, op, gate, up, g)
    np.testing.assert_allclose(dg, finite_differences(lambda a: loss(a, up), gate.astype(np.float64), 1e-2), atol=2e-3, rtol=2e-2)
    np.testing.assert_allclose(du, finite_differences(lambda b: loss(gate, b), up.astype(np.float64), 1e-2), atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("rows,ffn_dim", [(1, 1), (3, 7), (5, 33), (2, 384), (7, 1030)])
@pytest.mark.parametrize("local", [1, 32, None])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
@LAYOUTS
def test_swiglu_fused_gate_up_rows(device, rng, rows, ffn_dim, local, contiguous, per_row):
    """SwiGLU on [gate | up] rows (the fused matmul's output): equals the reference on the halves,
    and the gradient lands in the matching halves (both layouts of the work)."""
    op = SwiGLU(device, local_size=local, contiguous=contiguous, rows_per_item=per_row)
    gu = (rng.standard_normal((rows, 2 * ffn_dim)) * 4).astype(np.float32)
    d_out = rng.standard_normal((rows, ffn_dim)).astype(np.float32)
    GU, D, O, DGU = to_device(device, gu, d_out, np.full((rows, ffn_dim), np.nan, np.float32),
                              np.full_like(gu, np.nan))
    op.forward_fused(O, GU, rows, ffn_dim)
    op.backward_fused(DGU, D, GU, rows, ffn_dim)
    gate, up = gu[:, :ffn_dim], gu[:, ffn_dim:]
    assert_close(from_device(device, O, d_out), ref.swiglu_forward(gate, up), what="out")
    want_dg, want_du = ref.swiglu_backward(d_out, gate, up)
    got = from_device(device, DGU, gu)
    assert_close(got[:, :ffn_dim], want_dg, what="d_gate half")
    assert_close(got[:, ffn_dim:], want_du, what="d_up half")


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
