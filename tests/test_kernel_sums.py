import numpy as np
import pytest

from core.kernels.sums import Sums
from core.kernels import sums_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device


@pytest.mark.parametrize("n", [1, 7, 257, 1_000_000])
@pytest.mark.parametrize("local", [1, 32, 256])
def test_reduce_sum_squares_and_sum(device, rng, n, local):
    op = Sums(device, local_size=local)
    x = rng.standard_normal(n).astype(np.float32)
    (X,) = to_device(device, x)
    out = device.upload(np.full(4, -1.0, np.float32))
    op.sum_squares(out, 1, X, n)
    op.sum(out, 3, X, n)
    got = from_device(device, out, ((4,), np.float32))
    assert_close(got[[0, 2]], [-1.0, -1.0], what="untouched slots")
    assert_close(got[1], ref.sum_squares(x), atol=1e-5, rtol=1e-5, what="sum_squares")
    # a float32 sum can cancel: bound its error by sum(|x|), not by the result
    assert_close(got[3], ref.sum_(x), atol=1e-6 * float(np.abs(x).sum()), rtol=0, what="sum")
    op.sum_squares(out, 0, X, n)  # deterministic: bitwise the same result again
    assert from_device(device, out, ((4,), np.float32))[0] == got[1]


def test_reduce_empty_is_zero(device):
    op = Sums(device)
    out = device.upload(np.full(1, 7.0, np.float32))
    op.sum(out, 0, device.alloc(1), 0)
    assert from_device(device, out, ((1,), np.float32))[0] == 0.0


@pytest.mark.parametrize("local", [1, 64])
def test_per_layer_norms(device, rng, local):
    """Per-layer sums of squares through sub-buffers, and the global norm."""
    cl = device.cl
    op = Sums(device, local_size=local)
    align = device.base_align_bytes // 4
    sizes = [5, 300, 1, 4099]
    offsets, off = [], 0
    for s in sizes:  # each layer starts on an allowed sub-buffer origin
        offsets.append(off)
        off = -(-(off + s) // align) * align
    flat = np.zeros(off, np.float32)
    for o, s in zip(offsets, sizes):
        flat[o:o + s] = rng.standard_normal(s) * 3.0
    (G,) = to_device(device, flat)
    out = device.alloc(len(sizes) + 1)
    for slot, (o, s) in enumerate(zip(offsets, sizes)):
        sub = G.get_sub_region(o * 4, s * 4, cl.mem_flags.READ_WRITE)
        op.sum_squares(out, slot, sub, s)
    op.sum_squares(out, len(sizes), G, off)
    sq = from_device(device, out, ((len(sizes) + 1,), np.float32))
    want = [ref.sum_squares(flat[o:o + s]) for o, s in zip(offsets, sizes)]
    assert_close(sq[:-1], want, rtol=1e-5, what="per-layer sums of squares")
    assert_close(sq[-1], sum(want), rtol=1e-5, what="global sum of squares")



@pytest.mark.parametrize("local", [1, 32, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "slices"])
def test_sum_squares_segments_one_launch(device, rng, local, contiguous):
    """Per-tensor sums of squares of a flat buffer in one pass: odd sizes, an empty segment, segments
    longer than one chunk and not ending on a chunk boundary, gaps (padding) skipped; both work splits
    (interleaved: some work-items with none; a slice per work-item: one work-item a chunk, read as four
    streams of whole blocks of 16, then blocks of 16 and the last elements: 300 = 4 x 64 + 2 x 16 + 12)."""
    op = Sums(device, local_size=local, contiguous=contiguous)
    chunk = op.chunk
    sizes = [7, 0, 1, 17, 16 * local + 3, chunk, 2 * chunk + 5, 300]
    segments, off = [], 3
    for s in sizes:
        segments.append((off, s))
        off += s + 11  # padding between tensors must not be counted
    flat = (rng.standard_normal(off) * 2.0).astype(np.float32)
    (X,) = to_device(device, flat)
    out = device.upload(np.full(len(sizes) + 3, -1.0, np.float32))
    op.sum_squares_segments(out, 2, X, segments)
    got = from_device(device, out, ((len(sizes) + 3,), np.float32))
    want = [ref.sum_squares(flat[o:o + s]) for o, s in segments]
    assert_close(got[[0, 1, -1]], [-1.0, -1.0, -1.0], what="untouched slots")
    assert got[3] == 0.0, "empty segment"
    assert_close(got[2:2 + len(sizes)], want, atol=1e-6, rtol=1e-5, what="segment sums of squares")
    op.sum_squares_segments(out, 2, X, segments)  # deterministic: bitwise the same again
    assert np.array_equal(from_device(device, out, ((len(sizes) + 3,), np.float32)), got)


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
