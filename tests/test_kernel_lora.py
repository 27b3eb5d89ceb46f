"""lora.cl's column blocks (cols_add / cols_take) against the numpy reference at odd shapes and several
work-group sizes; and a LoRALinear against core/kernels/lora_ref.py."""
import numpy as np
import pytest

from core.kernels import lora_ref as ref
from core.kernels.lora import LoRACols
from core.kernels.matmul import Matmul
from core.lora import AdapterPart, DenseFrozen, LoRALinear, LoRAScratch
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device


@pytest.mark.parametrize("local", [1, 4, 16, None])
@pytest.mark.parametrize("n,ld,col0,width", [(1, 1, 0, 1), (5, 13, 4, 9), (3, 37, 0, 37), (17, 150, 31, 119)])
def test_cols_add_and_take_match_numpy(device, rng, local, n, ld, col0, width):
    op = LoRACols(device, local_size=local)
    out = rng.standard_normal((n, ld)).astype(np.float32)
    src = rng.standard_normal((n, width)).astype(np.float32)
    O, S, D = to_device(device, out, src, np.full((n, width), np.nan, np.float32))
    op.add(O, S, n, ld, col0, width, scale=0.37)
    assert_close(from_device(device, O, out), ref.cols_add(out, src, col0, 0.37), atol=1e-6, what="cols_add")
    op.take(D, O, n, ld, col0, width, scale=-2.5)
    added = ref.cols_add(out, src, col0, 0.37)
    assert_close(from_device(device, D, src), ref.cols_take(added, col0, width, -2.5), atol=1e-5, what="cols_take")


def test_columns_outside_the_rows_are_refused(device):
    op = LoRACols(device)
    buf = device.zeros(8)
    with pytest.raises(ValueError, match="outside rows of 4"):
        op.add(buf, buf, 2, 4, 2, 3)


def test_lora_linear_on_a_fused_matrix_matches_numpy(device, rng):
    """Two adapters on columns [0, 5) and [9, 16) of a (16, 11) matrix; the middle block has none."""
    n, n_in, r, scale = 7, 11, 3, 1.7
    x, w = rng.standard_normal((n, n_in)).astype(np.float32), rng.standard_normal((16, n_in)).astype(np.float32)
    blocks = [(0, 5), (9, 7)]
    ab = [(rng.standard_normal((r, n_in)).astype(np.float32), rng.standard_normal((wd, r)).astype(np.float32))
          for _, wd in blocks]
    dy = rng.standard_normal((n, 16)).astype(np.float32)
    mm = Matmul(device)
    X, W, DY = to_device(device, x, w, dy)
    parts = []
    for (c0, wd), (a, b) in zip(blocks, ab):
        A, B = to_device(device, a, b)
        parts.append(AdapterPart(c0, wd, A, B, device.zeros(a.size), device.zeros(b.size), device.alloc(n * r)))
    lin = LoRALinear(DenseFrozen(mm, W, 16, n_in), 16, n_in, parts, scale, mm, LoRACols(device),
                     LoRAScratch(device, n, r, 7))
    Y, DX = device.alloc(n * 16), device.alloc(n * n_in)
    lin.forward(Y, X, n)
    lin.input_grad(DX, DY, n, x=X)
    want_y = x.astype(np.float64) @ w.T.astype(np.float64)
    want_dx = dy.astype(np.float64) @ w.astype(np.float64)
    for (c0, wd), (a, b), p in zip(blocks, ab, parts):
        full_b = np.zeros((16, r), np.float32)
        full_b[c0:c0 + wd] = b
        want_y += ref.lora_forward(x, np.zeros_like(w), a, full_b, scale)
        dxj, da, db = ref.lora_backward(dy[:, c0:c0 + wd], x, np.zeros((wd, n_in)), a, b, scale)
        want_dx += dxj
        assert_close(from_device(device, p.grad_a, ((r, n_in), np.float32)), da, atol=1e-4, what="dA")
        assert_close(from_device(device, p.grad_b, ((wd, r), np.float32)), db, atol=1e-4, what="dB")
    assert_close(from_device(device, Y, ((n, 16), np.float32)), want_y, atol=1e-4, what="y")
    assert_close(from_device(device, DX, ((n, n_in), np.float32)), want_dx, atol=1e-4, what="dx")


def test_selfcheck(device):
    """The op's launches as ``ref.selfcheck`` makes them (small shapes, for a device check) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
