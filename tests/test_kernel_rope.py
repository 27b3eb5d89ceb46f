"""RoPE as training and generation run it (split_qkv / join_qkv) against the float64 reference, at odd
shapes, several work-group sizes and both layouts of the work, on any device."""
import numpy as np
import pytest

from core.kernels.rope import RoPE
from core.kernels import rope_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device


def test_rope_reference_is_adjacent_pair_rotation():
    """The complex-number reference equals the explicit ggml formula, and backward is its transpose."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 2, 4))
    y = ref.rope_forward(x, 3, 2, 100.0)
    pos = 2 + np.arange(6) % 3
    for i in range(2):
        a = pos[:, None] * 100.0 ** (-2 * i / 4)
        x0, x1 = x[..., 2 * i], x[..., 2 * i + 1]
        np.testing.assert_allclose(y[..., 2 * i], x0 * np.cos(a) - x1 * np.sin(a), atol=1e-12)
        np.testing.assert_allclose(y[..., 2 * i + 1], x0 * np.sin(a) + x1 * np.cos(a), atol=1e-12)
    g = rng.standard_normal(x.shape)
    np.testing.assert_allclose(np.sum(y * g), np.sum(x * ref.rope_backward(g, 3, 2, 100.0)))


# (batch, seq_len, n_heads, n_kv_heads, head_dim, pos_start, kv_row0, theta)
SHAPES = [
    (1, 1, 1, 1, 2, 0, 0, 10000.0),
    (3, 7, 4, 2, 8, 0, 0, 10000.0),
    (2, 33, 3, 3, 64, 0, 0, 500000.0),
    (1, 5, 6, 3, 64, 4000, 4000, 10000.0),  # KV-cache chunk at a large position
    (1, 5, 4, 4, 128, 4000, 0, 10000.0),
    (1, 1, 2, 1, 2, 9, 9, 10000.0),
    (1, 1, 2, 2, 16, 8191, 8191, 10000.0),  # single generated token
    (2, 3, 2, 2, 6, 0, 0, 10000.0),
]
LAYOUTS = pytest.mark.parametrize("rows", [False, True], ids=["unit-per-pair", "rows-per-item"])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:7])))
@pytest.mark.parametrize("local", [1, 64, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
@LAYOUTS
def test_rope_split_and_join_qkv(device, rng, shape, local, contiguous, rows):
    """[q|k|v] rows of the fused QKV matmul -> q, k, v with RoPE (k, v at row kv_row0 of a cache), and
    the backward join of the gradients with the inverse rotation; both layouts of the work (angles per
    (row, pair), or whole rows reading the cos/sin table)."""
    batch, seq_len, n_heads, n_kv, head_dim, pos_start, kv_row0, theta = shape
    n = batch * seq_len
    qd, kd = n_heads * head_dim, n_kv * head_dim
    op = RoPE(device, local_size=local, contiguous=contiguous, rows_per_item=rows)
    qkv = rng.standard_normal((n, qd + 2 * kd)).astype(np.float32)
    rows = kv_row0 + n + 2
    Q, K, V, QKV = to_device(device, np.full((n, qd), np.nan, np.float32), np.full((rows, kd), 7.0, np.float32),
                             np.full((rows, kd), 7.0, np.float32), qkv)
    op.split_qkv(Q, K, V, QKV, n, seq_len, n_heads, n_kv, head_dim, pos_start, theta, kv_row0=kv_row0)
    q, k, v = (qkv[:, :qd].reshape(n, n_heads, head_dim), qkv[:, qd:qd + kd].reshape(n, n_kv, head_dim),
               qkv[:, qd + kd:])
    assert_close(from_device(device, Q, ((n, qd), np.float32)).reshape(q.shape),
                 ref.rope_forward(q, seq_len, pos_start, theta), atol=2e-6, rtol=1e-5, what="q")
    got_k, got_v = (from_device(device, B, ((rows, kd), np.float32)) for B in (K, V))
    assert_close(got_k[kv_row0:kv_row0 + n].reshape(k.shape), ref.rope_forward(k, seq_len, pos_start, theta),
                 atol=2e-6, rtol=1e-5, what="k")
    assert np.array_equal(got_v[kv_row0:kv_row0 + n], v), "v copied"
    others = np.r_[0:kv_row0, kv_row0 + n:rows]
    assert np.all(got_k[others] == 7.0) and np.all(got_v[others] == 7.0), "other cache rows untouched"
    # backward: join gradients
    dq, dk, dv = (rng.standard_normal(a.shape).astype(np.float32) for a in (q, k, v))
    DQ, DK, DV, DQKV = to_device(device, dq, dk, dv, np.full_like(qkv, np.nan))
    op.join_qkv(DQKV, DQ, DK, DV, n, seq_len, n_heads, n_kv, head_dim, pos_start, theta)
    got = from_device(device, DQKV, qkv)
    assert_close(got[:, :qd].reshape(q.shape), ref.rope_backward(dq, seq_len, pos_start, theta), atol=2e-6,
                 rtol=1e-5, what="d_q")
    assert_close(got[:, qd:qd + kd].reshape(k.shape), ref.rope_backward(dk, seq_len, pos_start, theta),
                 atol=2e-6, rtol=1e-5, what="d_k")
    assert np.array_equal(got[:, qd + kd:], dv), "d_v copied"


def test_rope_rows_table_grows_with_the_position(device, rng):
    """The cos/sin table of the rows layout covers later, larger positions (generation) after a
    first call built it small: split_qkv at positions 0.. and then 700.. both match the reference."""
    op = RoPE(device, rows_per_item=True)
    n_heads, head_dim, theta = 2, 8, 10000.0
    for pos_start in (0, 700, 3):
        qkv = rng.standard_normal((3, 3 * n_heads * head_dim)).astype(np.float32)
        Q, K, V, QKV = to_device(device, *(np.zeros((3, n_heads * head_dim), np.float32),) * 3, qkv)
        op.split_qkv(Q, K, V, QKV, 3, 3, n_heads, n_heads, head_dim, pos_start, theta)
        q = qkv[:, :n_heads * head_dim].reshape(3, n_heads, head_dim)
        assert_close(from_device(device, Q, ((3, n_heads * head_dim), np.float32)).reshape(q.shape),
                     ref.rope_forward(q, 3, pos_start, theta), atol=2e-6, rtol=1e-5, what=f"q at {pos_start}")


@LAYOUTS
def test_rope_kv_cache_positions_match_training(device, rng, rows):
    """Splitting tokens 5..8 with pos_start=5 (generation) gives bitwise rows 5..8 of splitting the
    whole sequence (training)."""
    op = RoPE(device, rows_per_item=rows)
    n_heads, head_dim, width = 2, 8, 2 * 3 * 8
    qkv = rng.standard_normal((9, width)).astype(np.float32)
    got = []
    for part, n, pos in ((qkv, 9, 0), (qkv[5:], 4, 5)):
        Q, K, V, QKV = to_device(device, *(np.zeros((n, n_heads * head_dim), np.float32),) * 3, part)
        op.split_qkv(Q, K, V, QKV, n, n, n_heads, n_heads, head_dim, pos, 10000.0)
        got.append([from_device(device, B, ((n, n_heads * head_dim), np.float32)) for B in (Q, K)])
    for full, part in zip(*got):
        np.testing.assert_array_equal(part, full[5:])


def test_rope_rejects_odd_head_dim(device):
    op = RoPE(device)
    bufs = [device.alloc(9) for _ in range(4)]
    with pytest.raises(ValueError, match="even head_dim"):
        op.split_qkv(*bufs, 1, 1, 1, 1, 3, 0, 10000.0)
    with pytest.raises(ValueError, match="even head_dim"):
        op.join_qkv(*bufs, 1, 1, 1, 1, 3, 0, 10000.0)


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
