import numpy as np
import pytest

from core.kernels.attention import Attention
from tests import reference as ref
from tests.opcheck import assert_close, from_device, to_device

# (batch, seq, n_heads, n_kv_heads, head_dim)
SHAPES = [
    (1, 1, 1, 1, 1),
    (1, 7, 4, 2, 8),      # GQA
    (3, 33, 4, 2, 33),    # GQA, odd sizes
    (3, 7, 2, 2, 8),      # plain multi-head
    (1, 33, 4, 1, 1),     # multi-query, head_dim 1
]
TOL = dict(atol=2e-5, rtol=2e-4)


def _qkv(rng, b, sq, sk, h, kvh, d):
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, kvh, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, kvh, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("local", [1, 16, 128])
def test_attention_forward_backward(device, rng, shape, local):
    b, s, h, kvh, d = shape
    op = Attention(device, local_size=local)
    q, k, v = _qkv(rng, b, s, s, h, kvh, d)
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    Q, K, V, DO = to_device(device, q, k, v, d_out)
    O, P = device.alloc(q.size), device.alloc(b * h * s * s)
    op.forward(O, P, Q, K, V, b, s, s, 0, h, kvh, d)
    out_ref, p_ref = ref.attention_forward(q, k, v)
    assert_close(from_device(device, O, q), out_ref, **TOL, what="out")
    assert_close(from_device(device, P, p_ref), p_ref, **TOL, what="probs")

    DQ, DK, DV = device.alloc(q.size), device.alloc(k.size), device.alloc(v.size)
    DS = device.alloc(b * h * s * s)
    op.backward(DQ, DK, DV, DS, DO, Q, K, V, P, b, s, h, kvh, d)
    dq, dk, dv = ref.attention_backward(d_out, q, k, v)
    assert_close(from_device(device, DQ, q), dq, **TOL, what="d_q")
    assert_close(from_device(device, DK, k), dk, **TOL, what="d_k")
    assert_close(from_device(device, DV, v), dv, **TOL, what="d_v")


@pytest.mark.parametrize("local", [1, 64])
def test_attention_kv_cache_matches_full_forward(device, rng, local):
    """Prompt chunk, then a second chunk, then one token at a time: each call's rows equal the
    corresponding rows of a full causal forward."""
    s, h, kvh, d = 33, 4, 2, 8
    op = Attention(device, local_size=local)
    q, k, v = _qkv(rng, 1, s, s, h, kvh, d)
    out_full, p_full = ref.attention_forward(q, k, v)
    K, V = to_device(device, k, v)  # the cache holds all keys; a call reads the first seq_k
    chunks = [(0, 20), (20, 27)] + [(i, i + 1) for i in range(27, s)]
    for start, stop in chunks:
        sq, sk = stop - start, stop
        (Q,) = to_device(device, q[:, start:stop])
        O, P = device.alloc(sq * h * d), device.alloc(h * sq * sk)
        op.forward(O, P, Q, K, V, 1, sq, sk, start, h, kvh, d)
        assert_close(from_device(device, O, ((1, sq, h, d), np.float32)),
                     out_full[:, start:stop], **TOL, what=f"out rows {start}:{stop}")
        assert_close(from_device(device, P, ((1, h, sq, sk), np.float32)),
                     p_full[:, :, start:stop, :sk], **TOL, what=f"probs rows {start}:{stop}")


def test_attention_fully_masked_rows_are_zero(device, rng):
    op = Attention(device, local_size=8)
    q, k, v = _qkv(rng, 1, 5, 4, 2, 1, 3)
    Q, K, V = to_device(device, q, k, v)
    O, P = device.alloc(q.size), device.alloc(2 * 5 * 4)
    op.forward(O, P, Q, K, V, 1, 5, 4, -3, 2, 1, 3)  # queries 0..2 see no key
    out_ref, p_ref = ref.attention_forward(q, k, v, q_pos_start=-3)
    out = from_device(device, O, q)
    assert_close(out, out_ref, **TOL, what="out")
    assert_close(from_device(device, P, p_ref), p_ref, **TOL, what="probs")
    assert not out[:, :3].any()
    op.forward(O, P, Q, K, V, 1, 5, 0, 0, 2, 1, 3)  # no keys at all
    assert not from_device(device, O, q).any()


def test_attention_too_long_context_names_context_length(device):
    op = Attention(device)
    n = op.max_seq_len(8) + 1
    buf = device.alloc(1)
    with pytest.raises(ValueError, match="context_length"):
        op.forward(buf, buf, buf, buf, buf, 1, 1, n, n - 1, 1, 1, 8)


def test_attention_reference_matches_finite_differences():
    """Validate the reference backward with central differences of sum(out * d_out), float64."""
    rng = np.random.default_rng(7)
    b, s, h, kvh, d = 2, 4, 4, 2, 3
    q, k, v = (rng.standard_normal(sh) for sh in [(b, s, h, d), (b, s, kvh, d), (b, s, kvh, d)])
    d_out = rng.standard_normal((b, s, h, d))
    grads = ref.attention_backward(d_out, q, k, v)
    eps = 1e-6
    for idx, x in enumerate((q, k, v)):
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + eps
            plus = np.sum(ref.attention_forward(q, k, v)[0] * d_out)
            x[i] = old - eps
            minus = np.sum(ref.attention_forward(q, k, v)[0] * d_out)
            x[i] = old
            fd[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grads[idx], fd, atol=1e-7, rtol=1e-6,
                                   err_msg=("d_q", "d_k", "d_v")[idx])
