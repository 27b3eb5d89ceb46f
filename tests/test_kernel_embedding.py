"""Embedding lookup and its deterministic scatter-add backward against the float64 reference."""
import numpy as np
import pytest

from core.kernels.embedding import Embedding
from core.kernels import embedding_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device


@pytest.mark.parametrize("n_tokens,d_model,vocab", [(1, 1, 1), (7, 33, 5), (257, 7, 40), (33, 257, 3)])
@pytest.mark.parametrize("local", [1, 32, None])
def test_embedding_forward_backward(device, rng, n_tokens, d_model, vocab, local):
    op = Embedding(device, local_size=local)
    w = rng.standard_normal((vocab, d_model)).astype(np.float32)
    tokens = rng.integers(0, vocab, n_tokens).astype(np.int32)  # small vocab: many repeats
    d_out = rng.standard_normal((n_tokens, d_model)).astype(np.float32)
    dw0 = rng.standard_normal((vocab, d_model)).astype(np.float32)
    W, T, O, G, DW = to_device(device, w, tokens, np.full((n_tokens, d_model), np.nan, np.float32),
                               d_out, dw0)
    op.forward(O, T, W, n_tokens, d_model, vocab)
    assert_close(from_device(device, O, d_out), ref.embedding_forward(tokens, w), what="out")
    op.backward(DW, G, T, n_tokens, vocab, d_model)
    assert_close(from_device(device, DW, dw0), dw0 + ref.embedding_backward(d_out, tokens, vocab),
                 what="d_weight (accumulated)")


def test_embedding_out_of_range_ids_are_skipped(device, rng):
    """Bad ids give a zero row forward and no gradient, and nothing is written past the table."""
    vocab, d_model, guard = 6, 5, 4
    w = rng.standard_normal((vocab, d_model)).astype(np.float32)
    tokens = np.array([2, -1, vocab, 2, 2**31 - 1, -(2**31), 5], np.int32)
    valid = (tokens >= 0) & (tokens < vocab)
    n = len(tokens)
    d_out = rng.standard_normal((n, d_model)).astype(np.float32)
    table_and_guard = np.concatenate([np.zeros(vocab * d_model), np.full(guard, 9.0)]).astype(np.float32)
    W, T, O, G, DW = to_device(device, w, tokens, np.full((n, d_model), np.nan, np.float32), d_out,
                               table_and_guard)
    op = Embedding(device)
    op.forward(O, T, W, n, d_model)  # vocab_size from the buffer's size
    want = np.where(valid[:, None], w[np.clip(tokens, 0, vocab - 1)], 0.0)
    assert_close(from_device(device, O, d_out), want, what="out")
    op.backward(DW, G, T, n, vocab, d_model)
    got = from_device(device, DW, table_and_guard)
    assert np.all(got[vocab * d_model:] == 9.0), "backward wrote past the table"
    assert_close(got[:vocab * d_model].reshape(vocab, d_model),
                 ref.embedding_backward(d_out[valid], tokens[valid], vocab), what="d_weight")


def test_embedding_backward_is_deterministic(device, rng):
    n, d_model, vocab = 513, 48, 3  # many repeats of each id
    tokens = rng.integers(0, vocab, n).astype(np.int32)
    d_out = (rng.standard_normal((n, d_model)) * 1e3).astype(np.float32)
    op = Embedding(device)
    T, G = to_device(device, tokens, d_out)
    runs = []
    for _ in range(3):
        DW = device.zeros(vocab * d_model)
        op.backward(DW, G, T, n, vocab, d_model)
        runs.append(from_device(device, DW, (vocab * d_model, np.float32)))
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


@pytest.mark.parametrize("n_tokens,d_model,vocab", [(1, 1, 1), (7, 33, 5), (257, 7, 40), (513, 48, 3)])
@pytest.mark.parametrize("local", [1, 32, None])
def test_embedding_backward_over_grouped_tokens_is_bit_identical(device, rng, n_tokens, d_model, vocab, local):
    """The GPUs' backward over the tokens grouped by id (index_tokens) adds in the same order as
    the per-column one: the same bits, and the reference's values; out-of-range ids add nothing."""
    op = Embedding(device, local_size=local)
    tokens = rng.integers(-1, vocab + 1, n_tokens).astype(np.int32)  # repeats and a few bad ids
    d_out = (rng.standard_normal((n_tokens, d_model)) * 1e3).astype(np.float32)
    dw0 = rng.standard_normal((vocab, d_model)).astype(np.float32)
    T, G, DW1, DW2 = to_device(device, tokens, d_out, dw0, dw0)
    op.backward(DW1, G, T, n_tokens, vocab, d_model)
    op.backward(DW2, G, T, n_tokens, vocab, d_model, index=op.index_tokens(tokens, vocab))
    plain, grouped = from_device(device, DW1, dw0), from_device(device, DW2, dw0)
    assert np.array_equal(plain, grouped)
    valid = (tokens >= 0) & (tokens < vocab)
    assert_close(grouped, dw0 + ref.embedding_backward(d_out[valid], tokens[valid], vocab),
                 atol=1e-2, what="d_weight")
    with pytest.raises(ValueError, match="token index"):
        op.backward(DW2, G, T, n_tokens + 1, vocab, d_model, index=op.index_tokens(tokens, vocab))


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
