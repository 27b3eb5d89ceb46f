import numpy as np
import pytest

from core.kernels.rope import RoPE
from core.kernels import rope_ref as ref
from tests.opcheck import assert_close, from_device, to_device

# (batch, seq_len, n_heads, head_dim, pos_start, theta)
SHAPES = [
    (1, 1, 1, 2, 0, 10000.0),
    (3, 7, 2, 8, 0, 10000.0),
    (2, 33, 3, 64, 0, 500000.0),
    (1, 5, 4, 128, 4000, 10000.0),   # KV-cache chunk at a large position
    (1, 1, 2, 16, 8191, 10000.0),    # single generated token
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
@pytest.mark.parametrize("local", [1, 64, 256])
def test_rope_forward_backward(device, rng, shape, local):
    batch, seq_len, n_heads, head_dim, pos_start, theta = shape
    n_tokens = batch * seq_len
    op = RoPE(device, local_size=local)
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    X, G = to_device(device, x, g)
    args = (n_tokens, seq_len, n_heads, head_dim, pos_start, theta)
    op.forward(X, *args)
    assert_close(from_device(device, X, x), ref.rope_forward(x, seq_len, pos_start, theta),
                 atol=2e-6, rtol=1e-5, what="rope out")
    op.backward(G, *args)
    assert_close(from_device(device, G, g), ref.rope_backward(g, seq_len, pos_start, theta),
                 atol=2e-6, rtol=1e-5, what="rope d_x")
    op.backward(X, *args)  # inverse rotation undoes the forward
    assert_close(from_device(device, X, x), x, atol=2e-6, rtol=1e-5, what="rope round trip")


def test_rope_kv_cache_positions_match_training(device, rng):
    """Rotating tokens 5..8 with pos_start=5 equals rows 5..8 of rotating the whole sequence."""
    op = RoPE(device)
    x = rng.standard_normal((9, 2, 8)).astype(np.float32)
    full, part = to_device(device, x, x[5:])
    op.forward(full, 9, 9, 2, 8, 0, 10000.0)
    op.forward(part, 4, 4, 2, 8, 5, 10000.0)
    np.testing.assert_array_equal(from_device(device, part, x[5:]), from_device(device, full, x)[5:])


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


def test_rope_rejects_odd_head_dim(device):
    op = RoPE(device)
    with pytest.raises(ValueError, match="even head_dim"):
        op.forward(device.alloc(3), 1, 1, 1, 3, 0, 10000.0)


@pytest.mark.parametrize("shape", [(3, 7, 4, 2, 8, 0), (1, 5, 6, 3, 64, 4000), (2, 1, 1, 1, 2, 7)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("local", [1, 64, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
def test_rope_qk_one_launch_in_a_fused_row(device, rng, shape, local, contiguous):
    """Q and K rotated in one launch inside a fused [q|k|v] row (strides, k offset), V untouched;
    equals the separate reference rotations, forward and backward (GQA: fewer kv heads)."""
    batch, seq_len, n_heads, n_kv, head_dim, pos_start = shape
    n, theta = batch * seq_len, 10000.0
    qd, kd = n_heads * head_dim, n_kv * head_dim
    width = qd + 2 * kd
    op = RoPE(device, local_size=local, contiguous=contiguous)
    for sign, fn, want_fn in ((1, op.forward_qk, ref.rope_forward), (-1, op.backward_qk, ref.rope_backward)):
        fused = rng.standard_normal((n, width)).astype(np.float32)
        (F,) = to_device(device, fused)
        fn(F, F, n, seq_len, n_heads, n_kv, head_dim, pos_start, theta, q_stride=width, k_stride=width, k_offset=qd)
        got = from_device(device, F, fused)
        q, k = fused[:, :qd].reshape(n, n_heads, head_dim), fused[:, qd:qd + kd].reshape(n, n_kv, head_dim)
        assert_close(got[:, :qd].reshape(q.shape), want_fn(q, seq_len, pos_start, theta), atol=2e-6, rtol=1e-5,
                     what=f"q (sign {sign})")
        assert_close(got[:, qd:qd + kd].reshape(k.shape), want_fn(k, seq_len, pos_start, theta), atol=2e-6,
                     rtol=1e-5, what=f"k (sign {sign})")
        assert np.array_equal(got[:, qd + kd:], fused[:, qd + kd:]), "v untouched"
    # separate buffers with default strides give bitwise the same as the single-tensor launches
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((n, n_kv, head_dim)).astype(np.float32)
    Q, K, Q1, K1 = to_device(device, q, k, q, k)
    op.forward_qk(Q, K, n, seq_len, n_heads, n_kv, head_dim, pos_start, theta)
    op.forward(Q1, n, seq_len, n_heads, head_dim, pos_start, theta)
    op.forward(K1, n, seq_len, n_kv, head_dim, pos_start, theta)
    assert np.array_equal(from_device(device, Q, q), from_device(device, Q1, q))
    assert np.array_equal(from_device(device, K, k), from_device(device, K1, k))


@pytest.mark.parametrize("shape", [(3, 7, 4, 2, 8, 0, 0), (1, 5, 6, 3, 64, 4000, 4000), (1, 1, 2, 1, 2, 9, 9),
                                   (2, 3, 2, 2, 6, 0, 0)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("local", [1, 64])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
def test_rope_split_and_join_qkv(device, rng, shape, local, contiguous):
    """[q|k|v] rows of the fused QKV matmul -> q, k, v with RoPE (k, v at row kv_row0 of a cache), and
    the backward join of the gradients with the inverse rotation."""
    batch, seq_len, n_heads, n_kv, head_dim, pos_start, kv_row0 = shape
    n, theta = batch * seq_len, 10000.0
    qd, kd = n_heads * head_dim, n_kv * head_dim
    op = RoPE(device, local_size=local, contiguous=contiguous)
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
