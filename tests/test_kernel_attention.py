from dataclasses import replace

import numpy as np
import pytest

from core.device import KernelLimitError

from core.kernels.attention import Attention, AttentionTiles, default_tiles
from core.kernels import attention_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

# (batch, seq, n_heads, n_kv_heads, head_dim): seq not a multiple of any tile, head_dim 6/10/24/64,
# GQA ratios 1, 2 and 3, multi-query
SHAPES = [
    (1, 1, 1, 1, 6),
    (2, 13, 4, 2, 10),    # GQA 2
    (1, 37, 6, 2, 24),    # GQA 3
    (2, 19, 3, 3, 64),    # plain multi-head
    (1, 33, 3, 1, 6),     # multi-query
]
# None: the device's own tiling; then a CPU-style one (no local memory, several rows per item),
# GPU-style ones (local-memory staging, several items per group) and odd mixes of sizes
TILINGS = [
    None,
    AttentionTiles(items=1, rows=3, keys=4, kv_rows=2, vector=8),
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True),
    AttentionTiles(items=4, rows=2, keys=2, kv_rows=8, vector=8, stage_kv=True),
    AttentionTiles(items=2, rows=5, keys=1, kv_rows=16, vector=4),
    # the staged backward (GPUs, register micro-tiles): the GPU's tile, blocks that divide no seq, work-groups of
    # fewer or more items than micro-tiles or that divide no block, blocks smaller than a micro-tile
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, stage_kv=True, bwd_tile=8, bwd_items=7),
    AttentionTiles(items=2, rows=2, keys=2, kv_rows=1, vector=8, bwd_tile=2, bwd_items=3),
    # the staged forward (GPUs): the GPU's blocks, blocks that divide no seq with work-groups of fewer or more
    # items than micro-tiles, the smallest blocks
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128,
                   fwd_rows=64, fwd_keys=32),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=7, fwd_rows=16, fwd_keys=8,
                   fwd_items=13),
    AttentionTiles(items=2, rows=2, keys=2, kv_rows=1, vector=8, bwd_tile=2, bwd_items=3, fwd_rows=4, fwd_keys=4),
    # ... and with 4 x 8 score tiles (as many work-items as tiles or fewer): the GPU's blocks with half its work-items,
    # and an odd small one
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128,
                   fwd_rows=64, fwd_keys=32, fwd_items=64),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=7, fwd_rows=16, fwd_keys=8,
                   fwd_items=3),
    # the blocked backward (GPUs): 32 x 32 blocks, and blocks of more rows than keys (and the reverse) with
    # work-groups of fewer or more items than micro-tiles
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=64,
                   fwd_rows=64, fwd_keys=32, bwd_rows=32, bwd_keys=32),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=5, bwd_rows=16, bwd_keys=4),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=40, bwd_rows=4, bwd_keys=8),
    # split (a dK/dV work-group per query head, partials summed per kv head): the staged GPU tile, an odd one, and
    # the blocked 32 x 32 and one of more rows than keys
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128,
                   bwd_split=1),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=7, bwd_split=1),
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=64,
                   bwd_rows=32, bwd_keys=32, bwd_split=1),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=5, bwd_rows=16, bwd_keys=4,
                   bwd_split=1),
    # the stored dS (dQ from the tiles the dK/dV kernel stored): the GPU's tile, split or not, and odd small ones
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128,
                   bwd_store=1),
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=128,
                   bwd_store=1, bwd_split=1),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=7, bwd_store=1, bwd_split=1),
    AttentionTiles(items=2, rows=2, keys=2, kv_rows=1, vector=8, bwd_tile=2, bwd_items=3, bwd_store=1),
    # the blocked backward storing dS (blocks of the staged tile): the GPU's 32 x 32, and an odd small one, split
    AttentionTiles(items=16, rows=1, keys=16, kv_rows=1, vector=4, stage_kv=True, bwd_tile=32, bwd_items=64,
                   bwd_rows=32, bwd_keys=32, bwd_store=1),
    AttentionTiles(items=4, rows=1, keys=4, kv_rows=1, vector=4, bwd_tile=8, bwd_items=5, bwd_rows=8, bwd_keys=8,
                   bwd_store=1, bwd_split=1),
    # keys as lanes over K and V transposed (CPUs with 16-float SIMD): the default's (8 rows), 4 rows, and 8 lanes,
    # 3 rows, float4
    AttentionTiles(items=1, rows=8, keys=8, kv_rows=16, vector=8, lanes=16),
    AttentionTiles(items=1, rows=4, keys=8, kv_rows=16, vector=8, lanes=16),
    AttentionTiles(items=1, rows=3, keys=4, kv_rows=2, vector=4, lanes=8),
]
LANES = [t for t in TILINGS if t is not None and t.lanes]
TILED = [t for t in TILINGS if t is not None and t.fwd_rows]
TOL = dict(atol=2e-5, rtol=2e-4)


def fitted(device, tiles, head_dim):
    """``tiles``, or where its compiled kernels allow fewer work-items (llvmpipe: 32) or less local memory
    the same tiling with work-groups or staged blocks halved until they fit: tests choose from what fits."""
    while True:
        try:
            op = Attention(device, tiles=tiles)
            op.tiles(head_dim)
            return op
        except KernelLimitError as e:
            if tiles is None:
                raise
            if "local memory" in str(e) and tiles.fwd_rows > 4:  # smaller staged blocks (llvmpipe: 32 KiB)
                tiles = replace(tiles, fwd_rows=tiles.fwd_rows // 2, fwd_keys=max(4, tiles.fwd_keys // 2))
            elif "local memory" in str(e) and tiles.bwd_rows > 4:
                tiles = replace(tiles, bwd_rows=tiles.bwd_rows // 2, bwd_keys=max(4, tiles.bwd_keys // 2),
                                bwd_tile=tiles.bwd_tile // 2 if tiles.bwd_store else tiles.bwd_tile)  # (its blocks)
            elif "local memory" in str(e) and tiles.bwd_tile > 1:
                tiles = replace(tiles, bwd_tile=tiles.bwd_tile // 2)
            elif tiles.items > 1 or tiles.backward_items > 1 or tiles.forward_items > 1:
                tiles = replace(tiles, items=max(1, tiles.items // 2),
                                bwd_items=max(1, tiles.backward_items // 2) if tiles.bwd_tile else 0,
                                fwd_items=max(1, tiles.fwd_items // 2) if tiles.fwd_items else 0)
            else:
                raise


def _tiling_id(t):
    if t is None:
        return "device"
    staged = f"b{t.bwd_tile}w{t.backward_items}" if t.bwd_tile else ""
    staged += f"f{t.fwd_rows}x{t.fwd_keys}w{t.forward_items}" if t.fwd_rows else ""
    staged += f"q{t.bwd_rows}x{t.bwd_keys}" if t.bwd_rows else ""
    staged += "store" if t.bwd_store else ""
    staged += "split" if t.bwd_split else ""
    lanes = f"l{t.lanes}" if t.lanes else ""
    return f"i{t.items}r{t.rows}k{t.keys}kv{t.kv_rows}v{t.vector}{'s' if t.stage_kv else ''}{staged}{lanes}"


def scratch(device, b, s, h, kvh, d, tile=32):
    """Attention's scratch (Attention.scratch_floats, for staged blocks of ``tile``), NaN-filled: the lanes kernels
    (K and V transposed), the split backward (dK and dV partials) and the stored dS must not read a float of it
    they did not write."""
    return device.upload(np.full(Attention.scratch_floats(b, s, h, kvh, d, tile), np.nan, np.float32))


def _qkv(rng, b, sq, sk, h, kvh, d):
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, kvh, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, kvh, d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tiles", TILINGS, ids=_tiling_id)
def test_attention_forward_backward(device, rng, shape, tiles):
    b, s, h, kvh, d = shape
    op = fitted(device, tiles, d)
    q, k, v = _qkv(rng, b, s, s, h, kvh, d)
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    Q, K, V, DO = to_device(device, q, k, v, d_out)
    O, LSE = device.alloc(q.size), device.alloc(b * h * s)
    tile = op.tiles(d).bwd_tile or 32
    KVT = scratch(device, b, s, h, kvh, d, tile)
    op.forward(O, LSE, Q, K, V, b, s, s, 0, h, kvh, d, scratch=KVT)
    out_ref, _ = ref.attention_forward(q, k, v)
    out = from_device(device, O, q)
    assert_close(out, out_ref, **TOL, what="out")
    assert_close(from_device(device, LSE, ((b, h, s), np.float32)), ref.attention_lse(q, k, v), **TOL,
                 what="lse")

    DQ, DK, DV, DSUM = device.alloc(q.size), device.alloc(k.size), device.alloc(v.size), device.alloc(b * h * s)
    op.backward(DQ, DK, DV, DSUM, DO, Q, K, V, O, LSE, b, s, h, kvh, d, scratch=KVT)
    if op.tiles(d).lanes:  # the lanes kernels ran: K and V transposed over the whole scratch (0.0f past seq)
        assert np.isfinite(from_device(device, KVT, ((Attention.transposed_floats(b, s, kvh, d),), np.float32))).all()
    parts = Attention.split_floats(b, s, h, kvh, d) if op.tiles(d).bwd_split else 0
    stored = Attention.store_floats(b, s, h, d, tile) if op.tiles(d).bwd_store else 0
    if parts or stored:  # the split dK/dV and the dS store ran: every partial and every stored tile written
        used = from_device(device, KVT, ((Attention.scratch_floats(b, s, h, kvh, d, tile),), np.float32))
        assert np.isfinite(used[:parts]).all() and np.isfinite(used[Attention.split_floats(b, s, h, kvh, d):][:stored]).all()
    dq, dk, dv = ref.attention_backward(d_out, q, k, v)
    assert_close(from_device(device, DQ, q), dq, **TOL, what="d_q")
    assert_close(from_device(device, DK, k), dk, **TOL, what="d_k")
    assert_close(from_device(device, DV, v), dv, **TOL, what="d_v")
    d_sum = (d_out.astype(np.float64) * out).sum(axis=-1).transpose(0, 2, 1)
    assert_close(from_device(device, DSUM, ((b, h, s), np.float32)), d_sum, **TOL, what="d_sum")


@pytest.mark.parametrize("tiles", TILINGS[:3] + LANES + TILED, ids=_tiling_id)
@pytest.mark.parametrize("head_dim", [10, 64])
def test_attention_kv_cache_matches_full_forward(device, rng, tiles, head_dim):
    """Prompt chunk, then a second chunk, then one token at a time (seq_q < seq_k, q_pos_start > 0):
    each call's rows equal the corresponding rows of a full causal forward. The K/V buffers hold
    a cache of larger capacity than the keys in use, as core.generate's do."""
    s, h, kvh, d, capacity = 45, 6, 2, head_dim, 50
    op = fitted(device, tiles, d)
    q, k, v = _qkv(rng, 1, s, capacity, h, kvh, d)
    out_full, _ = ref.attention_forward(q, k[:, :s], v[:, :s])
    lse_full = ref.attention_lse(q, k[:, :s], v[:, :s])
    K, V = to_device(device, k, v)
    chunks = [(0, 20), (20, 27)] + [(i, i + 1) for i in range(27, s)]
    for start, stop in chunks:
        sq, sk = stop - start, stop
        (Q,) = to_device(device, q[:, start:stop])
        O, LSE = device.alloc(sq * h * d), device.alloc(h * sq)
        op.forward(O, LSE, Q, K, V, 1, sq, sk, start, h, kvh, d, scratch=scratch(device, 1, sk, h, kvh, d))
        assert_close(from_device(device, O, ((1, sq, h, d), np.float32)),
                     out_full[:, start:stop], **TOL, what=f"out rows {start}:{stop}")
        assert_close(from_device(device, LSE, ((1, h, sq), np.float32)),
                     lse_full[:, :, start:stop], **TOL, what=f"lse rows {start}:{stop}")


@pytest.mark.parametrize("tiles", TILINGS[:3] + LANES + TILED, ids=_tiling_id)
def test_attention_fully_masked_rows_are_zero(device, rng, tiles):
    op = fitted(device, tiles, 6)
    q, k, v = _qkv(rng, 1, 5, 4, 2, 1, 6)
    Q, K, V = to_device(device, q, k, v)
    O, LSE = device.alloc(q.size), device.alloc(2 * 5)
    op.forward(O, LSE, Q, K, V, 1, 5, 4, -3, 2, 1, 6, scratch=scratch(device, 1, 4, 2, 1, 6))  # queries 0..2 see no key
    out_ref, _ = ref.attention_forward(q, k, v, q_pos_start=-3)
    out = from_device(device, O, q)
    assert_close(out, out_ref, **TOL, what="out")
    assert not out[:, :3].any()
    lse = from_device(device, LSE, ((1, 2, 5), np.float32))
    assert np.all(lse[:, :, :3] == -np.inf)
    assert_close(lse[:, :, 3:], ref.attention_lse(q, k, v, q_pos_start=-3)[:, :, 3:], **TOL, what="lse")
    op.forward(O, LSE, Q, K, V, 1, 5, 0, 0, 2, 1, 6, scratch=scratch(device, 1, 1, 2, 1, 6))  # no keys at all
    assert not from_device(device, O, q).any()


def test_attention_long_sequence_has_no_seq_squared_buffer(device, rng):
    """A sequence far longer than the old kernels' local-memory limit allowed per work-group row
    still matches numpy; the launcher takes no (seq x seq) buffer."""
    b, s, h, kvh, d = 1, 700, 2, 1, 24
    op = Attention(device)
    q, k, v = _qkv(rng, b, s, s, h, kvh, d)
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    Q, K, V, DO = to_device(device, q, k, v, d_out)
    O, LSE, DSUM = device.alloc(q.size), device.alloc(b * h * s), device.alloc(b * h * s)
    DQ, DK, DV = device.alloc(q.size), device.alloc(k.size), device.alloc(v.size)
    before = device.allocated_bytes
    op.forward(O, LSE, Q, K, V, b, s, s, 0, h, kvh, d)
    op.backward(DQ, DK, DV, DSUM, DO, Q, K, V, O, LSE, b, s, h, kvh, d)
    assert device.allocated_bytes == before  # no scratch of its own
    assert_close(from_device(device, O, q), ref.attention_forward(q, k, v)[0], **TOL, what="out")
    dq, dk, dv = ref.attention_backward(d_out, q, k, v)
    assert_close(from_device(device, DQ, q), dq, **TOL, what="d_q")
    assert_close(from_device(device, DK, k), dk, **TOL, what="d_k")
    assert_close(from_device(device, DV, v), dv, **TOL, what="d_v")


def test_attention_tiles_follow_device_limits(device):
    for head_dim in (6, 64, 128):
        t = default_tiles(device, head_dim)
        assert t.items <= device.max_work_group_size
        assert t.local_mem_bytes(head_dim) <= device.local_mem_size
        assert default_tiles(device, head_dim, max_items=1).items == 1
    assert Attention(device).tiles(24) == default_tiles(device, 24)


def test_attention_bad_arguments_are_refused(device):
    with pytest.raises(ValueError, match="keys"):
        AttentionTiles(items=1, rows=1, keys=3, kv_rows=1)
    with pytest.raises(ValueError, match="vector"):
        AttentionTiles(items=1, rows=1, keys=4, kv_rows=1, vector=2)
    buf = device.alloc(1)
    with pytest.raises(ValueError, match="n_kv_heads"):
        Attention(device).forward(buf, buf, buf, buf, buf, 1, 1, 1, 0, 4, 3, 8)
    huge = AttentionTiles(items=1, rows=1, keys=16, kv_rows=1, stage_kv=True)
    too_long = device.local_mem_size // (2 * 16 * 4) + 4  # head_dim whose staged chunks do not fit
    with pytest.raises(ValueError, match="local memory"):
        Attention(device, tiles=huge).forward(buf, buf, buf, buf, buf, 1, 1, 1, 0, 1, 1, too_long)


def test_attention_reference_matches_finite_differences():
    """Validate the reference backward with central differences of sum(out * d_out), float64,
    and the reference lse against a direct log(sum(exp))."""
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
    kh = np.repeat(k, h // kvh, axis=2)
    for bi, hi, i in np.ndindex(b, h, s):
        scores = [q[bi, i, hi] @ kh[bi, j, hi] / np.sqrt(d) for j in range(i + 1)]
        np.testing.assert_allclose(ref.attention_lse(q, k, v)[bi, hi, i], np.log(np.sum(np.exp(scores))))


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
