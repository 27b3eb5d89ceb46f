import numpy as np
import pytest

from core.kernels.rope import RoPE
from tests import reference as ref
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
