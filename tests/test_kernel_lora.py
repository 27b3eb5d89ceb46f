"""lora.cl's block-diagonal B and its gradient's blocks against the numpy reference at odd shapes and several
work-group sizes; and a LoRALinear against core/kernels/lora_ref.py."""
import numpy as np
import pytest

from core.kernels import lora_ref as ref
from core.kernels.lora import LoRABlockDiag
from core.kernels.matmul import Matmul
from core.lora import DenseFrozen, LoRALinear, LoRAScratch
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

PARTS = [  # (n_out, parts): one adapter on all rows, a middle block without one, three parts, gaps at both ends
    (1, [(0, 1)]), (13, [(0, 4), (9, 4)]), (37, [(0, 20), (20, 8), (28, 9)]), (150, [(31, 80), (119, 30)])]


@pytest.mark.parametrize("local", [1, 4, 16, None])
@pytest.mark.parametrize("rank", [1, 3, 16])
@pytest.mark.parametrize("n_out,parts", PARTS)
def test_blockdiag_and_its_gradient_match_numpy(device, rng, local, rank, n_out, parts):
    op = LoRABlockDiag(device, local_size=local)
    rows = sum(w for _, w in parts)
    b_cat = rng.standard_normal((rows, rank)).astype(np.float32)
    g = rng.standard_normal((n_out, len(parts) * rank)).astype(np.float32)
    grad_b = rng.standard_normal((rows, rank)).astype(np.float32)
    BD, B, G, GB = to_device(device, np.full((n_out, len(parts) * rank), np.nan, np.float32), b_cat, g, grad_b)
    op.blockdiag(BD, B, n_out, rank, parts, scale=0.37)  # NaN first: every element must be written
    assert_close(from_device(device, BD, ((n_out, len(parts) * rank), np.float32)),
                 ref.blockdiag(b_cat, n_out, parts, 0.37), atol=1e-6, what="blockdiag")
    op.blockdiag_grad(GB, G, rank, parts, scale=-2.5)
    assert_close(from_device(device, GB, grad_b), ref.blockdiag_grad(grad_b, g, parts, -2.5), atol=1e-5,
                 what="blockdiag_grad")


@pytest.mark.parametrize("parts", [[], [(0, 2)] * 4, [(0, 0)], [(-1, 3)]])
def test_bad_parts_are_refused(device, parts):
    op = LoRABlockDiag(device)
    buf = device.zeros(64)
    with pytest.raises(ValueError, match="adapter parts"):
        op.blockdiag(buf, buf, 8, 2, parts, 1.0)
    with pytest.raises(ValueError, match="outside 4 output columns"):
        op.blockdiag(buf, buf, 4, 2, [(2, 3)], 1.0)


@pytest.mark.parametrize("blocks", [[(0, 5), (9, 7)], [(0, 16)], [(0, 5), (5, 4), (9, 7)]])
def test_lora_linear_on_a_fused_matrix_matches_numpy(device, rng, blocks):
    """Adapters on column blocks of a (16, 11) matrix (with a middle block without one; one on all of it;
    three): output, input gradient and every A and B gradient; a second backward accumulates; after the B's
    change, refresh() gives the new output."""
    n, n_in, r, scale = 7, 11, 3, 1.7
    x, w = rng.standard_normal((n, n_in)).astype(np.float32), rng.standard_normal((16, n_in)).astype(np.float32)
    ab = [(rng.standard_normal((r, n_in)).astype(np.float32), rng.standard_normal((wd, r)).astype(np.float32))
          for _, wd in blocks]
    dy = rng.standard_normal((n, 16)).astype(np.float32)
    mm = Matmul(device)
    a_cat, b_cat = np.concatenate([a for a, _ in ab]), np.concatenate([b for _, b in ab])
    X, W, DY, A, B = to_device(device, x, w, dy, a_cat, b_cat)
    GA, GB = device.zeros(a_cat.size), device.zeros(b_cat.size)
    P = len(blocks)
    lin = LoRALinear(DenseFrozen(mm, W, 16, n_in), 16, n_in, blocks, scale, r, A, B, GA, GB, mm,
                     LoRABlockDiag(device), LoRAScratch(device, n, P * r, 16 * P * r), device)
    lin.refresh()
    Y, DX = device.alloc(n * 16), device.alloc(n * n_in)

    def want(ab):
        y = x.astype(np.float64) @ w.T.astype(np.float64)
        dx, das, dbs = dy.astype(np.float64) @ w.astype(np.float64), [], []
        for (c0, wd), (a, b) in zip(blocks, ab):
            full_b = np.zeros((16, r), np.float32)
            full_b[c0:c0 + wd] = b
            y += ref.lora_forward(x, np.zeros_like(w), a, full_b, scale)
            dxj, da, db = ref.lora_backward(dy[:, c0:c0 + wd], x, np.zeros((wd, n_in)), a, b, scale)
            dx, das, dbs = dx + dxj, das + [da], dbs + [db]
        return y, dx, np.concatenate(das), np.concatenate(dbs)

    want_y, want_dx, want_da, want_db = want(ab)
    for times in (1, 2):  # the adapters' gradients accumulate
        lin.forward(Y, X, n)
        lin.input_grad(DX, DY, n, x=X)
        assert_close(from_device(device, Y, ((n, 16), np.float32)), want_y, atol=1e-4, what="y")
        assert_close(from_device(device, DX, ((n, n_in), np.float32)), want_dx, atol=1e-4, what="dx")
        assert_close(from_device(device, GA, a_cat), times * want_da, atol=1e-4, what="dA")
        assert_close(from_device(device, GB, b_cat), times * want_db, atol=1e-4, what="dB")
    ab2 = [(a, 2.0 * b) for a, b in ab]
    device.upload(2.0 * b_cat, B)
    lin.refresh()
    lin.forward(Y, X, n)
    assert_close(from_device(device, Y, ((n, 16), np.float32)), want(ab2)[0], atol=1e-4, what="y after refresh")


def test_selfcheck(device):
    """The op's launches as ``ref.selfcheck`` makes them (small shapes, for a device check) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
