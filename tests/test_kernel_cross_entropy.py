import numpy as np
import pytest

from core.kernels.cross_entropy import CrossEntropy
from core.kernels import cross_entropy_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

SHAPES = [(1, 1), (7, 7), (5, 257), (3, 1000), (4, 5000)]  # (n_rows, vocab_size)


def _inputs(rng, n_rows, vocab):
    logits = (rng.standard_normal((n_rows, vocab)) * 5.0 + 30.0).astype(np.float32)
    targets = rng.integers(0, vocab, n_rows).astype(np.int32)
    mask = rng.uniform(0.5, 1.5, n_rows).astype(np.float32)
    if n_rows > 1:  # masked rows, with out-of-range targets that must never be read
        mask[1::3] = 0.0
        targets[1] = -1
        targets[1::3] = vocab + 5
    return logits, targets, mask


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("local", [1, 32, 256])
@pytest.mark.parametrize("per_item", [False, True, "interleaved"], ids=["group-per-row", "rows-per-item", "rows-interleaved"])
def test_cross_entropy_forward_backward(device, rng, shape, local, per_item):
    n_rows, vocab = shape
    op = CrossEntropy(device, local_size=local, rows_per_item=bool(per_item), contiguous=per_item is True)
    logits, targets, mask = _inputs(rng, n_rows, vocab)
    grad_scale = 1.0 / max(float(mask.sum()), 1.0)
    X, T, M = to_device(device, logits, targets, mask)
    loss_ref = ref.cross_entropy_forward(logits, targets, mask)

    losses = device.upload(np.full(n_rows, np.nan, np.float32))  # every row must be written
    op.forward(losses, X, T, M, n_rows, vocab)
    assert_close(from_device(device, losses, loss_ref), loss_ref, atol=1e-5, rtol=1e-5, what="losses")

    losses = device.upload(np.full(n_rows, np.nan, np.float32))
    dX = device.upload(np.full(logits.shape, np.nan, np.float32))
    op.forward_backward(losses, dX, X, T, M, n_rows, vocab, grad_scale)
    assert_close(from_device(device, losses, loss_ref), loss_ref, atol=1e-5, rtol=1e-5, what="losses")
    d_ref = ref.cross_entropy_backward(logits, targets, mask, grad_scale)
    assert_close(from_device(device, dX, logits), d_ref, atol=1e-7, rtol=1e-4, what="d_logits")

    # in place, as the Model calls it: the gradient written over the logits, bit for bit the same
    losses2 = device.upload(np.full(n_rows, np.nan, np.float32))
    op.forward_backward(losses2, X, X, T, M, n_rows, vocab, grad_scale)
    assert np.array_equal(from_device(device, losses2, loss_ref), from_device(device, losses, loss_ref), equal_nan=True)
    assert np.array_equal(from_device(device, X, logits), from_device(device, dX, logits)), "in place"


@pytest.mark.parametrize("local", [1, 32])
@pytest.mark.parametrize("per_item", [False, True, "interleaved"], ids=["group-per-row", "rows-per-item", "rows-interleaved"])
def test_cross_entropy_in_chunks_of_rows(device, rng, local, per_item):
    """The Model's loss head: each chunk's logits at the start of one buffer, ``row0`` into the batch's targets,
    mask and losses; every loss written once, no element of another chunk's touched."""
    n_rows, vocab = 11, 257
    op = CrossEntropy(device, local_size=local, rows_per_item=bool(per_item), contiguous=per_item is True)
    logits, targets, mask = _inputs(rng, n_rows, vocab)
    grad_scale = 1.0 / float(mask.sum())
    T, M = to_device(device, targets, mask)
    loss_ref = ref.cross_entropy_forward(logits, targets, mask)
    d_ref = ref.cross_entropy_backward(logits, targets, mask, grad_scale)
    for backward in (False, True):
        losses = device.upload(np.full(n_rows, np.nan, np.float32))
        for row0, end in ((0, 4), (4, 5), (5, n_rows)):
            before = from_device(device, losses, loss_ref)
            chunk = device.upload(np.ascontiguousarray(logits[row0:end]))
            if backward:
                op.forward_backward(losses, chunk, chunk, T, M, end - row0, vocab, grad_scale, row0=row0)
                assert_close(from_device(device, chunk, logits[row0:end]), d_ref[row0:end], atol=1e-7, rtol=1e-4,
                             what=f"d_logits of rows {row0}..{end}")
            else:
                op.forward(losses, chunk, T, M, end - row0, vocab, row0=row0)
            after = from_device(device, losses, loss_ref)
            outside = np.r_[0:row0, end:n_rows]
            assert np.array_equal(after[outside], before[outside], equal_nan=True), "another chunk's losses"
        assert_close(from_device(device, losses, loss_ref), loss_ref, atol=1e-5, rtol=1e-5, what="losses")


@pytest.mark.parametrize("per_item", [False, True], ids=["group-per-row", "rows-per-item"])
def test_cross_entropy_bad_target_on_unmasked_row_is_nan(device, per_item):
    op = CrossEntropy(device, local_size=4, rows_per_item=bool(per_item), contiguous=per_item is True)
    X, T, M, L = to_device(device, np.zeros((1, 3), np.float32), np.array([3], np.int32),
                           np.ones(1, np.float32), np.zeros(1, np.float32))
    op.forward(L, X, T, M, 1, 3)
    assert np.isnan(from_device(device, L, ((1,), np.float32))[0])


def test_cross_entropy_reference_matches_finite_differences():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 6)) * 3.0
    targets = np.array([0, 5, 99, 2])
    mask = np.array([1.0, 0.5, 0.0, 2.0])
    grad_scale = 0.25
    g = ref.cross_entropy_backward(logits, targets, mask, grad_scale)
    eps = 1e-6
    fd = np.zeros_like(logits)
    for i in np.ndindex(logits.shape):
        old = logits[i]
        logits[i] = old + eps
        plus = ref.cross_entropy_forward(logits, targets, mask).sum()
        logits[i] = old - eps
        minus = ref.cross_entropy_forward(logits, targets, mask).sum()
        logits[i] = old
        fd[i] = grad_scale * (plus - minus) / (2 * eps)
    np.testing.assert_allclose(g, fd, atol=1e-8, rtol=1e-6)
    # and the loss itself against a direct log of the softmax
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    want = [-np.log(p[0, 0]), -0.5 * np.log(p[1, 5]), 0.0, -2.0 * np.log(p[3, 2])]
    np.testing.assert_allclose(ref.cross_entropy_forward(logits, targets, mask), want, rtol=1e-12)


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
