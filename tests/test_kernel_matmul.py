"""Matmul against the float64 numpy reference: every kernel family, all transposes, ragged sizes,
accumulate, offsets, the GEMV path, every tuner candidate, and the tuner's cache."""
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from core.device import KernelLimitError, KernelLimits
from core.kernels import matmul, matmul_autotune
from core.kernels.matmul import (GEMV_MAX_M, GemmKernel, GemvConfig, GemvKernel, Matmul, PackedConfig,
                                 TiledConfig, config_from_dict, config_to_dict)
from core.kernels import matmul_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

NT = (False, True)  # (trans_a, trans_b) of a linear layer's forward
VARIANTS = [(False, False), (False, True), (True, False), (True, True)]
# name -> configs override (None: the device's own choice). Both kernel families run on every
# device, so CI (PoCL) also covers the GPU kernel and a GPU run covers the CPU one.
CONFIGS = {
    "default": None,
    "tiled-64x64-dbuf": TiledConfig(64, 64, 16, 4, 4, 4, 4, 1),
    "tiled-32x16-k8-prefetch": TiledConfig(32, 16, 8, 4, 2, 2, 2, 2),  # next K tile through registers
    "tiled-16x32-k8-vw2": TiledConfig(16, 32, 8, 2, 8, 2, 2, 1),
    "tiled-8x8-single": TiledConfig(8, 8, 4, 4, 4, 4, 0, 0),
    "tiled-1x1": TiledConfig(1, 1, 1, 1, 1, 1, 0, 0),
    "packed-8x2x16": PackedConfig(8, 2, 16, 1, 16, True),
    "packed-5x3x4-wg3-unpacked-a": PackedConfig(5, 3, 4, 3, 2, False),
    "packed-3x1x8-wg2": PackedConfig(3, 1, 8, 2, 1, True),
    "packed-6x4x16-k-chunks-of-16": PackedConfig(6, 4, 16, 2, 3, True, kc=16),  # K in several launches
}
SHAPES = [(1, 1, 1), (9, 7, 33), (7, 1, 257), (33, 257, 7), (257, 33, 65), (64, 64, 64), (70, 130, 9)]
_ops: dict = {}


def fitted(device, cfg, variant):
    """``cfg``, or where its compiled kernel allows fewer work-items (llvmpipe, iGPUs under register
    pressure) the same tiling with C tiles halved until it fits: tests choose from what fits."""
    while True:
        try:
            GemmKernel(device, cfg, *variant)
            return cfg
        except KernelLimitError as e:
            if not isinstance(cfg, TiledConfig) or cfg.items == 1:
                raise
            assert "work-items" in str(e) or "local memory" in str(e), e  # refused with the reason
            cfg = replace(cfg, tsm=max(cfg.wptm, cfg.tsm // 2), tsn=max(cfg.wptn, cfg.tsn // 2))


def _op(device, name):
    """One Matmul per (device, config) for the whole run: each builds four programs."""
    key = (device.info.index, name)
    if key not in _ops:
        cfg = CONFIGS[name]
        configs = None if cfg is None else {v: fitted(device, cfg, v) for v in VARIANTS}
        _ops[key] = Matmul(device, configs=configs, gemv=False)
    return _ops[key]


def _inputs(rng, M, N, K, trans_a, trans_b):
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    return a, b


def _atol(K):
    return 2e-5 * np.sqrt(K) + 1e-6  # float32 rounding of a K-term sum of O(1) products


def _launcher(kernel):
    """A GemmKernel/GemvKernel called like Matmul (the transposes are built into the kernel)."""
    def call(c, a, b, M, N, K, trans_a=False, trans_b=False, accumulate=False):
        kernel(c, a, b, M, N, K, accumulate, 0, 0, 0)
    return call


def _check_overwrite_then_accumulate(device, rng, op, M, N, K, trans_a, trans_b, what):
    a, b = _inputs(rng, M, N, K, trans_a, trans_b)
    A, B, C = to_device(device, a, b, np.full((M, N), np.nan, np.float32))  # NaN: must be overwritten
    op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b)
    want = ref.matmul_forward(a, b, trans_a, trans_b)
    assert_close(from_device(device, C, want), want, atol=_atol(K), what=f"C {what}")
    op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b, accumulate=True)
    assert_close(from_device(device, C, want), ref.matmul_forward(a, b, trans_a, trans_b, c=want),
                 atol=2 * _atol(K), what=f"C += A @ B {what}")


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_matmul_overwrite_then_accumulate(device, rng, config, trans_a, trans_b, M, N, K):
    op = _op(device, config)
    _check_overwrite_then_accumulate(device, rng, op, M, N, K, trans_a, trans_b, op.config(trans_a, trans_b))


@pytest.mark.parametrize("config", ["tiled-64x64-dbuf", "tiled-32x16-k8-prefetch", "tiled-16x32-k8-vw2", "tiled-1x1"])
@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_matmul_split_k(device, rng, monkeypatch, config, trans_a, trans_b):
    """Tiled products with K split over work-groups (as a GPU does for few tiles of C): parts of
    the K tile's multiple, a short last part, overwrite, accumulate and offsets."""
    monkeypatch.setattr(matmul, "SPLIT_WAVES", 10_000)
    monkeypatch.setattr(matmul, "SPLIT_MIN_K", 16)
    monkeypatch.setattr(matmul, "SPLIT_DEEP_K", 16)
    op = _op(device, config)
    for M, N, K in [(9, 7, 65), (70, 33, 130), (1, 1, 40)]:
        kernel = op._variants[(trans_a, trans_b)]
        parts, k_split = kernel.splits(M, N, K)
        assert parts > 1 and k_split % kernel.cfg.tsk == 0 and (parts - 1) * k_split < K <= parts * k_split
        _check_overwrite_then_accumulate(device, rng, op, M, N, K, trans_a, trans_b, f"split {parts} x {k_split}")
    a, b = _inputs(rng, 20, 30, 100, trans_a, trans_b)
    pad = [np.full(5, 7.0, np.float32)]
    A, B, C = to_device(device, np.concatenate(pad + [a.ravel()]), np.concatenate(pad * 2 + [b.ravel()]),
                        np.full(3 + 600, np.nan, np.float32))
    op(C, A, B, 20, 30, 100, trans_a=trans_a, trans_b=trans_b, a_offset=5, b_offset=10, c_offset=3)
    got = from_device(device, C, ((603,), np.float32))[3:].reshape(20, 30)
    assert_close(got, ref.matmul_forward(a, b, trans_a, trans_b), atol=_atol(100), what="split K with offsets")


@pytest.mark.parametrize("config", ["tiled-64x64-dbuf", "tiled-32x16-k8-prefetch", "tiled-16x32-k8-vw2"])
@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_matmul_split_k_into_measured_parts(device, rng, config, trans_a, trans_b):
    """A per-shape choice of K parts (``shape_configs``: 1 .. 8, the launcher's rule aside): at most that many,
    each at least SPLIT_MIN_K deep and a multiple of the K tile; the product is exact in each, overwritten and
    accumulated, and a nearby shorter K (a padded batch) takes fewer parts where it is too shallow."""
    op = _op(device, config)
    kernel = op._variants[(trans_a, trans_b)]
    M, N, K = 9, 21, 7 * matmul.SPLIT_MIN_K + 5
    try:
        for parts in (1, 2, 3, 5, 7, 8):
            got, k_split = kernel.splits(M, N, K, parts)
            assert got == min(parts, K // matmul.SPLIT_MIN_K) and (got == 1 or k_split % kernel.cfg.tsk == 0), parts
            assert got == 1 or (got - 1) * k_split < K <= got * k_split
            op.use_shape_configs({(M, N, K, trans_a, trans_b): (kernel.cfg, parts)})
            assert op.shape_config(M, N, K, trans_a, trans_b) == (kernel.cfg, parts)
            _check_overwrite_then_accumulate(device, rng, op, M, N, K, trans_a, trans_b, f"{parts} parts")
    finally:
        op.use_shape_configs({})  # the Matmul is shared by the module's tests
    assert kernel.splits(M, N, 2 * matmul.SPLIT_MIN_K + 3, 8)[0] == 2
    assert kernel.splits(M, N, matmul.SPLIT_MIN_K - 1, 8) == (1, matmul.SPLIT_MIN_K - 1)


@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_matmul_split_k_first_part_goes_into_c(device, rng, monkeypatch, trans_a, trans_b):
    """Split K's first part is summed straight into C, so scratch holds the other parts only: with room for two
    M x N slices a product splits into three parts, exact when overwriting and accumulating."""
    op = _op(device, "tiled-32x16-k8-prefetch")
    kernel = op._variants[(trans_a, trans_b)]
    M, N, K = 13, 22, 3 * matmul.SPLIT_MIN_K + 9
    monkeypatch.setattr(matmul, "SCRATCH_FLOATS", 2 * M * N)
    assert kernel.splits(M, N, K, 4)[0] == 3 and kernel.scratch_floats(M, N, K, 4) == {"splits": 2 * M * N}
    try:
        op.use_shape_configs({(M, N, K, trans_a, trans_b): (kernel.cfg, 4)})
        _check_overwrite_then_accumulate(device, rng, op, M, N, K, trans_a, trans_b, "3 parts, 2 in scratch")
    finally:
        op.use_shape_configs({})  # the Matmul is shared by the module's tests


@pytest.mark.parametrize("config", ["default", "tiled-16x32-k8-vw2", "packed-5x3x4-wg3-unpacked-a",
                                    "packed-6x4x16-k-chunks-of-16"])
@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
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


def test_matmul_k_zero_gives_zeros_or_keeps_c(device, rng):
    for name in ("default", "tiled-8x8-single", "packed-8x2x16"):
        op = _op(device, name)
        c0 = rng.standard_normal((5, 6)).astype(np.float32)
        C = device.upload(np.full((5, 6), np.nan, np.float32))
        op(C, C, C, 5, 6, 0)
        assert np.all(from_device(device, C, c0) == 0.0), name
        device.upload(c0, C)
        op(C, C, C, 5, 6, 0, trans_b=True, accumulate=True)
        assert np.all(from_device(device, C, c0) == c0), name


@pytest.mark.parametrize("local", [1, 4, 16, 64])
def test_matmul_local_size_caps_work_group(device, rng, local):
    op = Matmul(device, local_size=local)
    M, N, K = 45, 67, 89
    assert op.gemv_config.items <= local
    for trans_a, trans_b in [(False, False), NT, (True, False)]:
        assert op.config(trans_a, trans_b).items <= local
        a, b = _inputs(rng, M, N, K, trans_a, trans_b)
        A, B, C = to_device(device, a, b, np.zeros((M, N), np.float32))
        op(C, A, B, M, N, K, trans_a=trans_a, trans_b=trans_b)
        want = ref.matmul_forward(a, b, trans_a, trans_b)
        assert_close(from_device(device, C, want), want, atol=_atol(K), what=f"C local={local}")


def test_matmul_linear_layer_and_its_backward(device, rng):
    """The three products of a linear layer y = x @ W.T as the model calls them (architecture.md)."""
    op = Matmul(device)
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


def test_matmul_scratch_grows_and_shrinking_calls_stay_right(device, rng):
    """The packed path keeps its scratch panels between calls: a large call after a small one
    (buffer regrown) and a small one after it (stale data beyond) must both be exact."""
    op = _op(device, "packed-3x1x8-wg2")
    for M, N, K in [(5, 9, 4), (40, 70, 90), (6, 5, 3)]:
        _check_overwrite_then_accumulate(device, rng, op, M, N, K, True, False, f"{M}x{N}x{K}")


@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_matmul_packs_large_operands_in_k_chunks(device, rng, monkeypatch, trans_a, trans_b):
    """Scratch bounded: with a tiny SCRATCH_FLOATS the packed kernel packs and multiplies K in
    several rounds (accumulating), and stays exact."""
    from core.kernels import matmul as matmul_module

    monkeypatch.setattr(matmul_module, "SCRATCH_FLOATS", 600)
    cfg = CONFIGS["packed-3x1x8-wg2"]
    kernel = GemmKernel(device, cfg, trans_a, trans_b)
    M, N, K = 50, 30, 77
    assert 1 < kernel.chunk(M, N, K) < K
    _check_overwrite_then_accumulate(device, rng, _launcher(kernel), M, N, K, trans_a, trans_b, "in K chunks")


@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_matmul_packs_deep_k_in_cache_sized_rounds(device, rng, monkeypatch, trans_a, trans_b):
    """A packed configuration without its own kc packs a K deeper than PACKED_DEEP_K in equal rounds of at
    most PACKED_DEEP_KC (the tied logits' input gradient, K = vocab: 2.2x faster on PoCL), and stays exact;
    a shallower K stays one round."""
    from core.kernels import matmul as matmul_module

    cfg = CONFIGS["packed-3x1x8-wg2"]
    assert cfg.kc == 0
    kernel = GemmKernel(device, cfg, trans_a, trans_b)
    assert kernel.chunk(256, 576, 49152) == 2048 and kernel.chunk(256, 576, 4096) == 4096
    assert kernel.chunk(8, 8, 5000) == 1667  # three equal rounds, not 2048 + 2048 + 904
    monkeypatch.setattr(matmul_module, "PACKED_DEEP_K", 40)
    monkeypatch.setattr(matmul_module, "PACKED_DEEP_KC", 16)
    M, N, K = 13, 30, 77
    assert kernel.chunk(M, N, K) == 16 and kernel.chunk(M, N, 40) == 40
    _check_overwrite_then_accumulate(device, rng, _launcher(kernel), M, N, K, trans_a, trans_b, "deep K")


def test_packed_matmul_sums_deep_k_in_blocks(device, rng):
    """matmul_packed adds its registers into the block's total every SUM_KB terms: over K = 4096 positive
    products (one packing round) its error stays near that of blocked summation, at least 4x below a
    plain float32 running sum's (measured: SmolLM2's logits 1.5e-4 -> 4.5e-5 from float64)."""
    M, N, K = 7, 33, 4096
    a = rng.uniform(0.5, 1.0, (M, K)).astype(np.float32)
    b = rng.uniform(0.5, 1.0, (K, N)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    running = np.zeros((M, N), np.float32)  # sequential float32 sums, as one accumulator would make them
    for k in range(K):
        running += a[:, k:k + 1] * b[k:k + 1, :]
    kernel = GemmKernel(device, CONFIGS["packed-5x3x4-wg3-unpacked-a"], False, False)
    assert kernel.chunk(M, N, K) == K  # one round: the blocks are the kernel's own
    A, B, C = to_device(device, a, b, np.zeros((M, N), np.float32))
    kernel(C, A, B, M, N, K, False, 0, 0, 0)
    got = from_device(device, C, np.zeros((M, N), np.float32))
    err_ours, err_running = np.abs(got - exact).max(), np.abs(running - exact).max()
    assert err_ours * 4 < err_running, (err_ours, err_running)


def test_matmul_empty_is_a_no_op(device):
    op = Matmul(device)
    C = device.upload(np.full(4, 3.0, np.float32))
    op(C, C, C, 0, 4, 4)
    op(C, C, C, 4, 0, 4)
    op(C, C, C, 0, 4, 4, trans_b=True)
    assert np.all(from_device(device, C, np.zeros(4, np.float32)) == 3.0)


def test_matmul_configs_are_validated(device):
    with pytest.raises(ValueError):
        TiledConfig(64, 64, 16, 3, 4, 1)  # 64 not a multiple of 3
    with pytest.raises(ValueError):
        TiledConfig(64, 64, 16, 4, 4, 4, pad=2)  # padding must keep vector alignment
    with pytest.raises(ValueError):
        PackedConfig(4, 1, vw=3)
    with pytest.raises(ValueError):
        GemvConfig(wg=3)
    with pytest.raises(ValueError):  # more work-items than any device allows
        Matmul(device, configs=TiledConfig(256, 256, 16, 1, 1, 1), gemv=False)
    with pytest.raises(ValueError):
        config_from_dict({"kernel": "matmul_nonsense"})
    for cfg in (TiledConfig(), PackedConfig(), GemvConfig()):
        assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


# ----------------------------------------------------------------------------- GEMV (decode)

GEMV_CONFIGS = [GemvConfig(1, 1, 4), GemvConfig(1, 4, 16), GemvConfig(4, 3, 8), GemvConfig(64, 1, 4),
                GemvConfig(16, 2, 1)]


def fitted_gemv(device, cfg):
    """``cfg``, or with fewer work-items where its compiled kernel allows fewer (see :func:`fitted`)."""
    while True:
        try:
            return GemvKernel(device, cfg)
        except KernelLimitError:
            if cfg.wg == 1:
                raise
            cfg = replace(cfg, wg=cfg.wg // 2)


@pytest.mark.parametrize("cfg", GEMV_CONFIGS, ids=lambda g: f"wg{g.wg}-rows{g.rows}-vw{g.vw}")
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (1, 37, 129), (3, 130, 64), (8, 5, 1000), (2, 64, 3)])
def test_gemv_against_numpy(device, rng, cfg, M, N, K):
    """matmul_gemv for x (M,K) @ W.T, W (N,K): overwrite, accumulate and offsets."""
    op = fitted_gemv(device, cfg)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    X, W, C = to_device(device, np.concatenate([np.zeros(3, np.float32), x.ravel()]),
                        np.concatenate([np.zeros(5, np.float32), w.ravel()]), np.full((M, N), np.nan, np.float32))
    op(C, X, W, M, N, K, False, 3, 5, 0)
    want = ref.matmul_forward(x, w, False, True)
    assert_close(from_device(device, C, want), want, atol=_atol(K), what=f"gemv {cfg}")
    device.upload(c0, C)
    op(C, X, W, M, N, K, True, 3, 5, 0)
    assert_close(from_device(device, C, want), ref.matmul_forward(x, w, False, True, c=c0),
                 atol=2 * _atol(K), what=f"gemv += {cfg}")


def test_matmul_uses_gemv_for_few_rows_only(device, rng):
    """The launcher routes M <= GEMV_MAX_M with b transposed to the GEMV kernel, and is right on
    both sides of the threshold (the GEMV kernel is made distinguishable by its configuration)."""
    op = Matmul(device, configs=PackedConfig(4, 1, 4, 1, 4, True), gemv=GemvConfig(4, 2, 4))
    assert op.gemv_config == GemvConfig(4, 2, 4)
    for M in (1, GEMV_MAX_M, GEMV_MAX_M + 1):
        _check_overwrite_then_accumulate(device, rng, op, M, 77, 50, False, True, f"M={M}")
    assert sorted(op._gemv._kernels) == [1, GEMV_MAX_M]  # built for the two small M, not for 9
    _check_overwrite_then_accumulate(device, rng, op, 2, 7, 5, False, False, "NN, small M: no GEMV")
    assert 2 not in op._gemv._kernels


@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_narrow_products_get_narrow_panels_and_read_a_in_place(device, rng, trans_a, trans_b):
    """A product whose N fills fewer vectors than a B panel (LoRA's rank-16 products) runs a configuration
    with panels of just enough vectors, reading A in place when B is one panel; wide products keep the
    configuration. Both stay right against numpy, overwrite and accumulate."""
    op = Matmul(device, configs=PackedConfig(5, 4, 4, 1, 3, True), gemv=False)  # panels of 16 columns
    for N, nb in ((3, 1), (4, 1), (9, 3), (12, 3), (13, 4), (40, 4)):
        kernel = op._kernel(11, N, trans_a, trans_b)
        assert kernel.cfg.nb == nb, (N, kernel.cfg)
        panels = -(-N // kernel.cfg.nr)  # A is packed for 2+ panels when stored (K,M), never when (M,K)
        assert ("a" in kernel.scratch_floats(11, N, 19)) == (trans_a and panels >= 2), N
        assert "a" not in kernel.scratch_floats(1000, 1000, 19) or trans_a
        _check_overwrite_then_accumulate(device, rng, op, 11, N, 19, trans_a, trans_b, f"N={N}")

@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
def test_narrow_products_take_the_narrow_tiled_configurations(device, rng, trans_a, trans_b):
    """On a tiled launcher a product whose N (else M) is at most NARROW_MAX runs the "narrow_n" ("narrow_m")
    configuration, others the variant's own; all right against numpy, overwrite and accumulate (the narrow
    tiles are given here so that every device, PoCL included, runs them)."""
    v = (trans_a, trans_b)  # tilings the other tests build too (their programs are cached: llvmpipe compiles slowly)
    narrow = {"narrow_n": fitted(device, CONFIGS["tiled-16x32-k8-vw2"], v),
              "narrow_m": fitted(device, CONFIGS["tiled-32x16-k8-prefetch"], v)}
    op = Matmul(device, configs=fitted(device, CONFIGS["tiled-64x64-dbuf"], v), gemv=False, narrow=narrow)
    n_max = matmul.NARROW_MAX
    for M, N, want in ((200, 48, "narrow_n"), (48, 48, "narrow_n"), (n_max + 1, n_max, "narrow_n"),
                       (48, 200, "narrow_m"), (n_max, n_max + 1, "narrow_m"), (n_max + 1, n_max + 1, None)):
        cfg = op._kernel(M, N, trans_a, trans_b).cfg
        assert cfg == (narrow[want] if want else op.config(*v)), (M, N, cfg)
        _check_overwrite_then_accumulate(device, rng, op, M, N, 37, trans_a, trans_b, f"{M}x{N} {want}")
    assert Matmul(device, configs=PackedConfig(4, 1, 4, 1, 4, True)).narrow_config("narrow_n") is None  # forced


# ----------------------------------------------------------------------------- tuner

@pytest.mark.parametrize("variant", matmul_autotune.MODEL_VARIANTS)
def test_every_tuner_candidate_is_correct(device, rng, variant):
    """Every configuration the tuner may pick on this device on a tiny ragged shape, for each
    transpose case it serves. On a CPU the GPU grid runs too (for NT, the linear layers' forward;
    the other transposes of the tiled kernel run in test_matmul_overwrite_then_accumulate), so CI
    on PoCL checks what a GPU may pick; its big register tiles are slow to compile there."""
    cands = matmul_autotune.candidates(device, variant)
    if not matmul_autotune.uses_local_tiles(device) and variant == NT:
        cands += [c for c in matmul_autotune.GPU_GRID if matmul_autotune.fits(device, c)]
    if variant == NT:  # the narrow products' tiles, which serve every variant
        cands += [c for c in matmul_autotune.NARROW_GRID if matmul_autotune.fits(device, c) and c not in cands]
    ran = 0
    for cfg in cands:
        for v in ([variant, (True, True)] if variant == (True, False) else [variant]):
            try:
                kernel = GemmKernel(device, cfg, *v)
            except KernelLimitError as e:  # the tuner skips it alike (its compiled kernel allows fewer items)
                assert "allows" in str(e) or "local memory" in str(e), e
                continue
            _check_overwrite_then_accumulate(device, rng, _launcher(kernel), 19, 37, 23, *v, cfg)
            ran += 1
    assert ran >= 1


def test_every_gemv_candidate_is_correct(device, rng):
    for cfg in matmul_autotune.gemv_candidates(device):
        _check_overwrite_then_accumulate(device, rng, _launcher(GemvKernel(device, cfg)), 2, 37, 45, False, True, cfg)


def test_tuner_picks_caches_and_reloads(device, rng, tmp_path, monkeypatch):
    """A tiny grid: an impossible candidate is skipped, the winner is a correct configuration, it
    is written to the cache file under this device's key, reloaded by a fresh process's lookup,
    and used by Matmul; OPENCL_LLM_MATMUL_TUNE=0 ignores it."""
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "1")
    monkeypatch.setattr(matmul_autotune, "_memo", {})
    impossible = TiledConfig(256, 256, 16, 1, 1, 1)  # 65536 work-items: never fits
    good = [PackedConfig(4, 1, 4, 1, 4, True), TiledConfig(8, 8, 4, 2, 2, 2, 0, 1)]
    grid = {NT: [impossible, *good], (True, False): [good[1], impossible]}
    shape_table = {NT: [(9, 10, 11), (20, 30, 40)], (True, False): [(9, 10, 11)]}
    seen = []
    narrow = [TiledConfig(8, 4, 4, 2, 2, 2, 0, 1), TiledConfig(4, 8, 4, 2, 2, 2, 0, 0)]
    kwargs = dict(grid=grid, shape_table=shape_table, gemv_grid=[GemvConfig(1, 2, 4), GemvConfig(2, 1, 4)],
                  gemv_shapes=[(1, 10, 20)], narrow_grid={"narrow_n": narrow}, min_s=0.001)
    monkeypatch.setattr(matmul_autotune, "NARROW_SHAPES", {"narrow_n": (NT, [(20, 6, 30)])})
    result = matmul_autotune.tuned_configs(device, progress=lambda f, m: seen.append((f, m)), **kwargs)
    assert result[NT] in good and result[(True, False)] == good[1] and result[(True, True)] == good[1]
    assert result["narrow_n"] in narrow and "narrow_m" not in result
    assert result["gemv"] in kwargs["gemv_grid"] and result["gflops"]["nt"] > 0
    assert seen[-1][0] == 1.0 and all("matmul" in m for _, m in seen)
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)

    data = json.loads((tmp_path / matmul_autotune.CACHE_FILE).read_text())
    assert list(data) == [matmul_autotune.device_key(device)]
    monkeypatch.setattr(matmul_autotune, "_memo", {})  # as a new process would: read the file
    reloaded = matmul_autotune.tuned_configs(device, progress=lambda f, m: pytest.fail("tuned again"))
    assert {k: v for k, v in reloaded.items() if k not in ("gflops", "seconds")} == \
        {k: v for k, v in result.items() if k not in ("gflops", "seconds")}
    op = Matmul(device, tuned=reloaded)
    assert op.config(*NT) == result[NT] and op.gemv_config == result["gemv"]
    assert op.narrow_config("narrow_n") == result["narrow_n"]
    _check_overwrite_then_accumulate(device, rng, op, 21, 13, 17, False, True, "tuned NT")

    monkeypatch.setenv(matmul_autotune.ENV_VAR, "0")
    assert matmul_autotune.tuned_configs(device) == {}
    assert Matmul(device, tuned=matmul_autotune.tuned_configs(device)).config(*NT) == \
        matmul_autotune.default_configs(device)[0]


def test_tuner_survives_a_damaged_cache(device, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_autotune, "_memo", {})
    (tmp_path / matmul_autotune.CACHE_FILE).write_text("{not json")
    assert matmul_autotune.load_cached(device) is None
    (tmp_path / matmul_autotune.CACHE_FILE).write_text(json.dumps({matmul_autotune.device_key(device): {"nn": 3}}))
    assert matmul_autotune.load_cached(device) is None
    result = {v: PackedConfig() for v in VARIANTS} | {"gemv": GemvConfig(), "seconds": 1.0, "gflops": {}}
    matmul_autotune.save(device, result)
    assert matmul_autotune.load_cached(device)[NT] == PackedConfig()


# ----------------------------------------------------------------------------- compiled kernels' limits

def _limit_kernels(monkeypatch, device, names, max_items=None, extra_local=0):
    """Make the compiled kernels ``names`` report at most ``max_items`` work-items (an iGPU under
    register pressure; llvmpipe) or ``extra_local`` bytes of local memory beyond the device's."""
    real = type(device).kernel_limits

    def limited(self, kernel):
        lim = real(self, kernel)
        if lim.name not in names:
            return lim
        over = lim.device_local_mem_bytes + extra_local if extra_local else 0
        return replace(lim, max_items=min(lim.max_items, max_items or lim.max_items),
                       local_mem_bytes=lim.local_mem_bytes + over)

    monkeypatch.setattr(type(device), "kernel_limits", limited)


def test_compiled_kernel_limits_refuse_with_the_reason(device, monkeypatch):
    _limit_kernels(monkeypatch, device, {"matmul_tiled", "matmul_gemv"}, max_items=32)
    big = TiledConfig(64, 64, 16, 4, 4, 4, 4, 1)  # 256 work-items
    with pytest.raises(KernelLimitError, match="needs 256 work-items per group; the compiled kernel matmul_tiled "
                                               "allows 32"):
        GemmKernel(device, big, False, True)
    with pytest.raises(KernelLimitError, match="allows 32"):
        Matmul(device, configs=big)  # a configuration given is refused, not replaced
    with pytest.raises(KernelLimitError, match="needs 64 work-items"):
        GemvKernel(device, GemvConfig(64, 1, 4))
    assert isinstance(KernelLimitError("x"), ValueError)  # callers that catch ValueError keep working
    lim = KernelLimits("k", 32, 40_000, 32_768)
    assert "needs 40000 bytes of local memory; the device has 32768" in lim.problem(1)
    _limit_kernels(monkeypatch, device, {"matmul_tiled"}, extra_local=1)
    with pytest.raises(KernelLimitError, match="bytes of local memory"):
        GemmKernel(device, TiledConfig(8, 8, 4, 2, 2, 2, 0, 1), False, False)


def test_matmul_falls_back_to_what_the_compiled_kernels_allow(device, rng, monkeypatch):
    """A tuned (or default) configuration whose compiled kernel allows fewer work-items is replaced by
    the first default that fits, and the products stay right."""
    _limit_kernels(monkeypatch, device, {"matmul_tiled", "matmul_gemv"}, max_items=32)
    big = TiledConfig(64, 64, 16, 4, 4, 4, 4, 1)
    op = Matmul(device, tuned={**{v: big for v in VARIANTS}, "gemv": GemvConfig(64, 1, 4)})
    for v in VARIANTS:
        assert op.config(*v).items <= 32 and op.config(*v) != big
    assert op.gemv_config.items <= 32
    _check_overwrite_then_accumulate(device, rng, op, 21, 13, 17, False, True, "fallback NT")
    _check_overwrite_then_accumulate(device, rng, op, 3, 13, 17, False, True, "fallback GEMV")


def test_tuner_skips_what_does_not_fit_and_never_keeps_a_wrong_result(device, monkeypatch, caplog):
    _limit_kernels(monkeypatch, device, {"matmul_tiled", "matmul_gemv"}, max_items=32)
    small, big = TiledConfig(8, 8, 4, 2, 2, 2, 0, 1), TiledConfig(64, 64, 16, 4, 4, 4, 4, 1)
    kwargs = dict(shape_table={NT: [(9, 10, 11)]}, gemv_shapes=[(1, 10, 20)], min_s=0.001)
    with caplog.at_level("INFO", logger="core.kernels.matmul_autotune"):
        result = matmul_autotune.tune(device, grid={NT: [small, big]},
                                  gemv_grid=[GemvConfig(1, 2, 4), GemvConfig(64, 1, 4)], **kwargs)
    assert result[NT] == small and result["gemv"] == GemvConfig(1, 2, 4) and not result["defaulted"]
    assert "allows 32" in caplog.text
    # every candidate wrong (as a miscompiled kernel would be): no "best 0.0", the safe default instead
    monkeypatch.setattr(matmul_autotune, "_score", lambda *a, **k: 0.0)
    seen = []
    result = matmul_autotune.tune(device, progress=lambda f, m: seen.append(m), grid={NT: [small]},
                              gemv_grid=[GemvConfig(1, 2, 4)], **kwargs)
    gemm_defaults, gemv_defaults = matmul.fallback_configs(device)
    assert result[NT] in gemm_defaults and result["gemv"] in gemv_defaults
    assert result["defaulted"] == ["nt", "gemv"] and result["gflops"] == {}
    assert not any("0.0 GFLOP/s" in m for m in seen) and "none right yet" in seen[-1]


def test_tuner_keeps_to_its_budget(device):
    """With no budget left only each group's first candidate (the default) runs; the rest are counted."""
    grid = {NT: [PackedConfig(4, 1, 4, 1, 4, True), PackedConfig(3, 1, 8, 2, 1, True),
                 PackedConfig(5, 3, 4, 3, 2, False)]}
    seen = []
    result = matmul_autotune.tune(device, progress=lambda f, m: seen.append(m), budget_s=0.0, grid=grid,
                              shape_table={NT: [(9, 10, 11)]}, gemv_grid=[GemvConfig(1, 2, 4), GemvConfig(1, 4, 4)],
                              gemv_shapes=[(1, 10, 20)], min_s=0.001)
    assert result[NT] == grid[NT][0] and result["gemv"] == GemvConfig(1, 2, 4)
    assert result["skipped"] == 3 and "budget spent" in seen[-1] and "of at most 0 s" in seen[-1]


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))


@pytest.mark.parametrize("trans_a,trans_b", VARIANTS)
@pytest.mark.parametrize("split", [False, True])
def test_tiled_matmul_aligned_program_only_where_every_tile_read_is_aligned(device, rng, monkeypatch, split,
                                                                            trans_a, trans_b):
    """Tiled products whose offsets and stored row lengths are multiples of the vector width take the
    ALIGNED program (one vector load per tile read, GPUs); one misaligned offset or row length keeps the
    plain one. Both exact, with offsets, ragged edges and (``split``) K split over work-groups."""
    if split:
        monkeypatch.setattr(matmul, "SPLIT_WAVES", 10_000)
        monkeypatch.setattr(matmul, "SPLIT_MIN_K", 16)
        monkeypatch.setattr(matmul, "SPLIT_DEEP_K", 16)
    cfg = fitted(device, TiledConfig(32, 16, 8, 4, 2, 2, 2, 2), (trans_a, trans_b))
    kernel = GemmKernel(device, cfg, trans_a, trans_b)
    vw = cfg.vw
    assert device.base_align_bytes >= 4 * vw
    cases = [((38, 26, 70), (2, 4, 6), True), ((37, 26, 70), (2, 4, 6), not trans_a),
             ((38, 25, 70), (2, 4, 6), trans_b), ((38, 26, 71), (2, 4, 6), trans_a and not trans_b),
             ((38, 26, 70), (1, 4, 6), False), ((38, 26, 70), (2, 3, 6), False), ((38, 26, 70), (2, 4, 3), True)]
    for (M, N, K), (ao, bo, co), aligned in cases:
        assert kernel.aligned(M, N, K, ao, bo) == aligned, (M, N, K, ao, bo)
        assert (kernel.splits(M, N, K)[0] > 1) == split
        a, b = _inputs(rng, M, N, K, trans_a, trans_b)
        pad = lambda x, n: np.concatenate([np.full(n, -7.0, np.float32), x.ravel(), np.full(5, -7.0, np.float32)])  # noqa: E731
        A, B, C = to_device(device, pad(a, ao), pad(b, bo), np.full(co + M * N + 5, np.nan, np.float32))
        kernel(C, A, B, M, N, K, False, ao, bo, co)
        got = from_device(device, C, ((co + M * N + 5,), np.float32))[co:co + M * N].reshape(M, N)
        assert_close(got, ref.matmul_forward(a, b, trans_a, trans_b), atol=_atol(K), what=f"{M}x{N}x{K} {ao},{bo}")
    assert kernel._aligned is not None and kernel._aligned is not kernel._main


def _shape_tuning(monkeypatch, tmp_path, grid):
    """shape_configs as on a GPU, on this device: tuning on, a fresh cache folder, ``grid`` as SHAPE_GRID and no
    tuned variant configurations; returns the list that records every timed (config, M, N, K, split)."""
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "1")
    monkeypatch.setattr(matmul_autotune, "_shape_memo", {})
    monkeypatch.setattr(matmul_autotune, "uses_local_tiles", lambda dev: True)
    monkeypatch.setattr(matmul_autotune, "tuned_configs", lambda dev: {})
    monkeypatch.setattr(matmul_autotune, "SHAPE_GRID", tuple(grid))
    monkeypatch.setattr(matmul, "SPLIT_WAVES", 10_000)  # the deep products split K: both ways are timed
    monkeypatch.setattr(matmul, "SPLIT_MIN_K", 64)
    monkeypatch.setattr(matmul, "SPLIT_DEEP_K", 64)
    timed = []
    seconds = matmul_autotune.best_seconds

    def recording(dev, launch, min_s, rounds=3):
        s = seconds(dev, launch, 0.0, 1)
        timed.append(s)
        return s
    monkeypatch.setattr(matmul_autotune, "best_seconds", recording)
    return timed


def test_shape_configs_time_each_product_once_per_device_and_route_it(device, rng, tmp_path, monkeypatch):
    """GPUs time each product of a model's step on every per-shape candidate (split K and not) once, cache the
    fastest per device, and Matmul then runs that shape with it, exactly; GEMV and narrow products are left to
    their own kernels."""
    grid = [fitted(device, TiledConfig(32, 32, 8, 4, 4, 4, 4, 2), v) for v in [(False, False)]]
    grid.append(fitted(device, TiledConfig(16, 32, 8, 2, 4, 2, 2, 1), (False, False)))
    timed = _shape_tuning(monkeypatch, tmp_path, grid)
    shapes = [(72, 80, 300, False, True), (96, 68, 260, True, False), (72, 80, 300, False, True),
              (4, 80, 300, False, True), (72, 16, 300, False, False)]  # a repeat, a GEMV and a narrow product
    chosen = matmul_autotune.shape_configs(device, shapes)
    assert set(chosen) == {(72, 80, 300, False, True), (96, 68, 260, True, False)}
    assert all(cfg in grid and type(parts) is int and parts >= 1 for cfg, parts in chosen.values())
    assert len(timed) == 2 * 2 * 4  # two shapes x two candidates x K in 1, 2, 3 and 4 parts (at least 64 deep)
    cache = json.loads((tmp_path / matmul_autotune.SHAPE_FILE).read_text())
    assert set(cache[matmul_autotune.device_key(device)]) == {"nt 72x80x300", "tn 96x68x260"}
    monkeypatch.setattr(matmul_autotune, "_shape_memo", {})  # a new process: read from the file, time nothing
    assert matmul_autotune.shape_configs(device, shapes) == chosen and len(timed) == 16

    op = Matmul(device, gemv=False)
    forced = {(72, 80, 300, False, True): (grid[1], 1), (96, 68, 260, True, False): (grid[0], 3)}
    op.use_shape_configs(forced)
    assert op.shape_config(72, 80, 300, False, True) == (grid[1], 1) and op.shape_config(72, 80, 301) is None
    assert op.reserve([(96, 68, 260, True, False)]) >= 4 * 68 * 96 * 2  # 3 K parts: the 2 after the first in scratch
    for (M, N, K, ta, tb) in forced:
        _check_overwrite_then_accumulate(device, rng, op, M, N, K, ta, tb, f"per-shape {M}x{N}x{K}")


def test_products_near_a_measured_shape_take_its_choice(device, rng):
    """A batch padded shorter than the longest one: a product of a measured one's variant that differs from it in
    one size by at most NEAR_SHAPE_RATIO takes its choice (the nearest), and computes right with it; one further
    off, of another variant, differing in two sizes, or narrow keeps the transpose variant's configuration."""
    small = fitted(device, TiledConfig(16, 32, 8, 2, 4, 2, 2, 1), (False, True))
    small_tn = fitted(device, TiledConfig(16, 32, 8, 2, 4, 2, 2, 1), (True, False))
    other = fitted(device, TiledConfig(32, 32, 8, 4, 4, 4, 4, 2), (True, False))
    op = Matmul(device, gemv=False)
    op.use_shape_configs({(144, 80, 300, False, True): (small, 1), (96, 68, 260, True, False): (other, 2),
                          (96, 68, 200, True, False): (small_tn, 1)})
    assert op.shape_config(100, 80, 300, False, True) == (small, 1)  # M 144 -> 100
    assert op.shape_config(96, 68, 140, True, False) == (small_tn, 1)  # K: 200 is nearer than 260
    assert op.shape_config(96, 68, 250, True, False) == (other, 2)
    assert op.shape_config(96, 68, 230, True, False) == (other, 2)  # 260/230 < 230/200
    for far in [(70, 80, 300, False, True), (100, 80, 300, False, False), (100, 90, 300, False, True),
                (40, 80, 300, False, True), (96, 68, 90, True, False), (96, 68, 120, True, False)]:
        assert op.shape_config(*far) is None, far
    for M, N, K, ta, tb in [(100, 80, 300, False, True), (96, 68, 140, True, False), (70, 80, 300, False, True)]:
        _check_overwrite_then_accumulate(device, rng, op, M, N, K, ta, tb, f"near {M}x{N}x{K}")
    op.near_shape_ratio = 1.0  # measured shapes only: earlier answers are forgotten
    assert op.shape_config(100, 80, 300, False, True) is None
    assert op.shape_config(144, 80, 300, False, True) == (small, 1)


def test_shape_configs_never_choose_a_wrong_candidate(device, tmp_path, monkeypatch):
    bad, good = TiledConfig(16, 16, 8, 4, 4, 4, 4, 1), TiledConfig(8, 8, 4, 4, 4, 4, 0, 0)
    _shape_tuning(monkeypatch, tmp_path, [bad, good])
    correct = matmul_autotune._Operands.correct
    monkeypatch.setattr(matmul_autotune._Operands, "correct", lambda self, k: k.cfg != bad and correct(self, k))
    chosen = matmul_autotune.shape_configs(device, [(80, 72, 100, False, False)])
    assert chosen == {(80, 72, 100, False, False): (good, chosen[(80, 72, 100, False, False)][1])}


def test_shape_configs_retime_what_a_damaged_cache_holds(device, tmp_path, monkeypatch):
    """Unreadable entries of matmul-shapes.json (hand-edited: no config, a packed one, a float size and a count of
    parts that is text, not a dict; an entry of before the K parts were timed, with a split flag; a device entry that
    is no dict) count as untimed: timed again and overwritten; a file that is no JSON is ignored."""
    cfg = TiledConfig(16, 16, 8, 4, 4, 4, 4, 1)
    timed = _shape_tuning(monkeypatch, tmp_path, [cfg])
    key = matmul_autotune.device_key(device)
    shapes = [(80, 72, 100, False, False), (80, 72, 104, False, False), (80, 72, 108, False, False),
              (80, 72, 112, False, False), (80, 72, 116, False, False), (80, 72, 120, False, False)]
    names = [matmul_autotune._shape_name(*s) for s in shapes]
    bad = [{"parts": 1}, {"config": config_to_dict(PackedConfig()), "parts": 1},
           {"config": {**config_to_dict(cfg), "tsm": 16.0}, "parts": 1},
           {"config": config_to_dict(cfg), "parts": "2"}, [1, 2], {"config": config_to_dict(cfg), "split": True}]
    (tmp_path / matmul_autotune.SHAPE_FILE).write_text(json.dumps({key: dict(zip(names, bad))}))
    chosen = matmul_autotune.shape_configs(device, shapes)
    assert set(chosen) == set(shapes) and len(timed) == 6  # K < 128: one part only
    assert all(c == cfg and parts == 1 for c, parts in chosen.values())
    assert all("parts" in e and "split" not in e for e in
               json.loads((tmp_path / matmul_autotune.SHAPE_FILE).read_text())[key].values())
    (tmp_path / matmul_autotune.SHAPE_FILE).write_text(json.dumps({key: "not a dict"}))
    monkeypatch.setattr(matmul_autotune, "_shape_memo", {})
    assert set(matmul_autotune.shape_configs(device, shapes[1:2])) == set(shapes[1:2]) and len(timed) == 7
    (tmp_path / matmul_autotune.SHAPE_FILE).write_text("{not json")
    monkeypatch.setattr(matmul_autotune, "_shape_memo", {})
    assert set(matmul_autotune.shape_configs(device, shapes[:1])) == set(shapes[:1]) and len(timed) == 8


def test_shape_configs_from_two_threads_time_each_shape_once(device, tmp_path, monkeypatch):
    import threading

    timed = _shape_tuning(monkeypatch, tmp_path, [TiledConfig(16, 16, 8, 4, 4, 4, 4, 1)])
    a = [(80, 72, 100, False, False), (80, 72, 104, False, False), (80, 72, 108, False, False)]
    b = [(80, 72, 104, False, False), (80, 72, 108, False, False), (80, 72, 112, False, False)]
    out = {}
    threads = [threading.Thread(target=lambda n, s: out.__setitem__(n, matmul_autotune.shape_configs(device, s)),
                                args=(n, s)) for n, s in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(out["a"]) == set(a) and set(out["b"]) == set(b) and len(timed) == 4


def test_scratch_bound_covers_every_split_a_gpu_may_choose(device):
    """memory_bytes counts scratch_bound_floats of a step's products before any kernel is built; on a GPU the
    scratch is split K's partial products, in the launcher's rule's parts or in any count shape_configs may have
    measured fastest (its _part_counts): for model shapes from 0.7M to 349M parameters, rows of 512-4096 and 20-132
    compute units, none holds more than the bound, and Matmul.reserve of a measured count stays within it."""
    import types

    from core.config import PRESETS, ModelConfig
    from core.model import step_matmuls

    def kernel(cfg, cu):  # splits() of a tiled kernel on a device of cu compute units
        k = types.SimpleNamespace(cfg=cfg, dev=types.SimpleNamespace(info=types.SimpleNamespace(compute_units=cu)))
        k.splits = lambda M, N, K, parts=0: GemmKernel.splits(k, M, N, K, parts)
        return k

    models = [mc for mc, _ in PRESETS.values()] + [
        ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536),
        ModelConfig(vocab_size=32000, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=8, ffn_dim=2816)] + [
        ModelConfig(vocab_size=8192, d_model=d, n_heads=8, n_kv_heads=8, ffn_dim=f, context_length=512)
        for d, f in [(128, 384), (512, 1536), (768, 2048)]]
    for mc in models:
        for rows in (512, 4096):
            shapes = step_matmuls(mc, rows, True)
            bound = matmul.scratch_bound_floats(shapes)
            for M, N, K, ta, tb in shapes:
                if (tb and not ta and M <= matmul.GEMV_MAX_M) or matmul.narrow_kind(M, N) is not None:
                    continue
                for cfg, cu in itertools.product(matmul_autotune.SHAPE_GRID, (20, 60, 132)):
                    k = kernel(cfg, cu)
                    for parts in [0, *matmul_autotune._part_counts(k, M, N, K)]:
                        n = k.splits(M, N, K, parts)[0]
                        assert n == 1 or (n - 1) * M * N <= bound, (mc.d_model, rows, (M, N, K), cfg, cu, parts)

    c = ModelConfig(vocab_size=8192, d_model=512, n_heads=8, n_kv_heads=8, ffn_dim=1536, context_length=512)
    products = step_matmuls(c, 512, True)
    cfg = fitted(device, TiledConfig(32, 16, 8, 4, 2, 2, 2, 2), (False, True))
    logits = (512, 8192, 512, False, True)  # the loss head's forward product, measured fastest in 4 K parts
    op = Matmul(device, configs=cfg, gemv=False)
    op.use_shape_configs({logits: (cfg, 4)})
    assert op._variants[(False, True)].splits(*logits[:3], 4)[0] == 4
    assert op.reserve(products) <= 4 * matmul.scratch_bound_floats(products)
