"""Matmul against the float64 numpy reference: every kernel, all transposes, ragged sizes, accumulate
and offsets."""
import numpy as np
import pytest

from core.kernels.matmul import Matmul, MatmulTiles
from tests import reference as ref
from tests.opcheck import assert_close, from_device, to_device

TILED, DIRECT, DIRECT_NT = "matmul_tiled", "matmul_direct", "matmul_direct_nt"
NT = (False, True)  # (trans_a, trans_b) of a linear layer's forward
# name -> tiles override (None: the device's own choice). Both kernel families run on every
# device, so CI (PoCL) also covers the GPU kernel and a GPU run covers the CPU ones.
CONFIGS = {
    "default": None,
    "tiled-64x64": MatmulTiles(TILED, 64, 64, 4, 4, tsk=16),
    "tiled-16x32-k8": MatmulTiles(TILED, 16, 32, 2, 8, tsk=8),
    "tiled-1x1": MatmulTiles(TILED, 1, 1, 1, 1, tsk=1),
    "direct-8x8": MatmulTiles(DIRECT, 8, 8, 8, 8),
    "direct-6x16-wg2x4": {v: MatmulTiles(DIRECT, 6, 16, 3, 4) for v in [(0, 0), (1, 0), (1, 1)]}
    | {NT: MatmulTiles(DIRECT_NT, 8, 6, 4, 3)},
    "direct-nt-4x2": {NT: MatmulTiles(DIRECT_NT, 4, 2, 4, 2)},
}
SHAPES = [(1, 1, 1), (1, 7, 33), (7, 1, 257), (33, 257, 7), (257, 33, 65), (64, 64, 64), (70, 130, 9)]
_ops: dict = {}


def _op(device, name):
    """One Matmul per (device, config) for the whole run: each builds four programs."""
    key = (device.info.index, name)
    if key not in _ops:
        tiles = CONFIGS[name]
        if isinstance(tiles, dict):
            tiles = {(bool(a), bool(b)): t for (a, b), t in tiles.items()}
        _ops[key] = Matmul(device, tiles=tiles)
    return _ops[key]


def _inputs(rng, M, N, K, trans_a, trans_b):
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    return a, b


def _atol(K):
    return 2e-5 * np.sqrt(K) + 1e-6  # float32 rounding of a K-term sum of O(1) products


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_matmul_overwrite_then_accumulate(device, rng, config, trans_a, trans_b, M, N, K):
    op = _op(device, config)
    a, b = _inputs(rng, M, N, K, trans_a, trans_b)
    A, B, C = to_device(device, a, b, np.full((M, N), np.nan, np.float32))  # NaN: must be overwritten
    op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b)
    want = ref.matmul_forward(a, b, trans_a, trans_b)
    assert_close(from_device(device, C, want), want, atol=_atol(K), what=f"C {op.tiles(trans_a, trans_b)}")
    op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b, accumulate=True)
    assert_close(from_device(device, C, want), ref.matmul_forward(a, b, trans_a, trans_b, c=want),
                 atol=2 * _atol(K), what="C += A @ B")


@pytest.mark.parametrize("config", ["default", "tiled-16x32-k8", "direct-6x16-wg2x4"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_offsets(device, rng, config, trans_a, trans_b):
    op = _op(device, config)
    M, N, K = 13, 21, 34
    a, b = _inputs(rng, M, N, K, trans_a, trans_b)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    ao, bo, co = 5, 17, 3
    pad = lambda x, n: np.concatenate([np.full(n, -7.0, np.float32), x.ravel(), np.full(11, -7.0, np.float32)])  # noqa: E731
    A, B, C = to_device(device, pad(a, ao), pad(b, bo), pad(c0, co))
    op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b, accumulate=True,
       a_offset=ao, b_offset=bo, c_offset=co)
    got = from_device(device, C, (co + M * N + 11, np.float32))
    assert np.all(got[:co] == -7.0) and np.all(got[co + M * N:] == -7.0), "wrote outside C"
    assert_close(got[co:co + M * N].reshape(M, N), ref.matmul_forward(a, b, trans_a, trans_b, c=c0),
                 atol=2 * _atol(K), what="C with offsets")


@pytest.mark.parametrize("local", [1, 4, 16, 64])
def test_matmul_local_size_caps_work_group(device, rng, local):
    op = Matmul(device, local_size=local)
    M, N, K = 45, 67, 89
    for trans_a, trans_b in [(False, False), NT, (True, False)]:
        assert op.tiles(trans_a, trans_b).items <= local
        a, b = _inputs(rng, M, N, K, trans_a, trans_b)
        A, B, C = to_device(device, a, b, np.zeros((M, N), np.float32))
        op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b)
        want = ref.matmul_forward(a, b, trans_a, trans_b)
        assert_close(from_device(device, C, want), want, atol=_atol(K), what=f"C local={local}")


def test_matmul_linear_layer_and_its_backward(device, rng):
    """The three products of a linear layer y = x @ W.T as the model calls them (architecture.md)."""
    op = _op(device, "default")
    n, d_in, d_out = 96, 200, 72
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32)
    dy = rng.standard_normal((n, d_out)).astype(np.float32)
    dw0 = rng.standard_normal((d_out, d_in)).astype(np.float32)
    X, W, DY, Y, DX, DW = to_device(device, x, w, dy, np.zeros((n, d_out), np.float32),
                                    np.zeros_like(x), dw0)
    op(Y, X, W, n, d_out, d_in, trans_b=True)
    op(DX, DY, W, n, d_in, d_out)
    op(DW, DY, X, d_out, d_in, n, trans_a=True, accumulate=True)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    assert_close(from_device(device, Y, dy), x64 @ w64.T, atol=1e-4, what="y")
    assert_close(from_device(device, DX, x), dy64 @ w64, atol=1e-4, what="dx")
    assert_close(from_device(device, DW, w), dw0 + dy64.T @ x64, atol=5e-4, what="dW")


def test_matmul_empty_is_a_no_op(device):
    op = _op(device, "default")
    C = device.upload(np.full(4, 3.0, np.float32))
    op(C, C, C, 0, 4, 4)
    op(C, C, C, 4, 0, 4)
    assert np.all(from_device(device, C, np.zeros(4, np.float32)) == 3.0)


def test_matmul_tiles_are_validated(device):
    with pytest.raises(ValueError):
        MatmulTiles(TILED, 64, 64, 3, 4)  # 64 not a multiple of 3
    with pytest.raises(ValueError):
        MatmulTiles(DIRECT, 8, 6, 2, 3)  # vector width 3 only for the dot-product kernel
    with pytest.raises(ValueError):
        Matmul(device, tiles=MatmulTiles(DIRECT_NT, 4, 4, 4, 4))  # NT kernel for every variant
