"""QMatmul (``core/kernels/qmatmul.cl``) against gguf-py's ``gguf.quants.dequantize`` and a float64
numpy product: every format, forward and input gradient, odd n_out, both kernel families and several
work-group sizes, the decode GEMV; the device holds the GGUF bytes unchanged (no float copy)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, quants

from core.kernels import qmatmul_ref as ref
from core.kernels.matmul import PackedConfig
from core.kernels.qmatmul import (FORMATS, QGemvConfig, QMatmul, QTiledConfig, file_matrices, frozen_matrix_bytes,
                                  upload_weight, weight_nbytes, widen_to_q8_0)
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

# name -> QMatmul arguments. Both families run on every device (CI's PoCL covers the GPU kernel).
CONFIGS = {
    "default": {},
    "tiled-auto": {"family": "tiled", "gemv": False},  # the first candidate that fits the kernel's limits
    "tiled-64x64": {"family": "tiled", "tiled": QTiledConfig(64, 64, 16, 4, 4), "gemv": False},
    "tiled-16x8-k8": {"family": "tiled", "tiled": QTiledConfig(16, 8, 8, 2, 1), "gemv": False},
    "tiled-1x1": {"family": "tiled", "tiled": QTiledConfig(1, 1, 1, 1, 1), "gemv": False},
    "packed-5x3x4-wg3": {"family": "packed", "packed": PackedConfig(5, 3, 4, 3, 2, False, kc=64), "gemv": False},
    "packed-6x2x8-pack-a": {"family": "packed", "packed": PackedConfig(6, 2, 8, 1, 4, True), "gemv": False},
}
GEMVS = {"gemv-wg64": QGemvConfig(64, 1), "gemv-wg8-rows3": QGemvConfig(8, 3), "gemv-wg1-rows4": QGemvConfig(1, 4)}
_ops: dict = {}


def _op(device, name, **kw):
    key = (device.info.index, name)
    if key not in _ops:
        _ops[key] = QMatmul(device, **kw)
    return _ops[key]


def random_weight(rng, qtype, n_out, n_in):
    """(GGUF bytes, numpy shape) of a random W: quantized by gguf-py where it can, else random blocks
    (every bit pattern of the quants and scales) with finite, moderate half-precision scales."""
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    if qtype == Q.F32:
        return w, (n_out, n_in)
    if qtype == Q.F16:
        return w.astype(np.float16), (n_out, n_in)
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16):
        return quants.quantize(w, qtype), (n_out, n_in)
    block, size = quants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_out, n_in // block, size), dtype=np.uint8)
    halves = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}[qtype]  # byte offsets of the half scales (d, dmin)
    for off in halves:
        raw[:, :, off:off + 2] = (rng.uniform(0.001, 0.05, raw.shape[:2])
                                  .astype(np.float16)[..., None].view(np.uint8))
    return raw.reshape(n_out, -1), (n_out, n_in)


def _atol(K, scale):
    return (2e-5 * np.sqrt(K) + 1e-6) * scale  # float32 rounding of a K-term sum of products of size ~scale


def _prepare_or_skip(device, op, qtype, M):
    """Build the kernels; a forced configuration that the compiled kernel's limits refuse (rusticl:
    CL_KERNEL_WORK_GROUP_SIZE 32) is skipped with the reason, as issue 22 asks."""
    try:
        op.prepare(qtype, M)
    except ValueError as e:
        if "the kernel allows" in str(e) or "does not fit" in str(e):
            pytest.skip(f"{device.info.name}: {e}")
        raise


def _check(device, op, rng, qtype, M, n_out, n_in, what):
    _prepare_or_skip(device, op, qtype, M)
    data, shape = random_weight(rng, qtype, n_out, n_in)
    wf = ref.dequantize(data, qtype, shape)
    w = upload_weight(device, data, qtype, shape)
    x = rng.standard_normal((M, n_in)).astype(np.float32)
    dy = rng.standard_normal((M, n_out)).astype(np.float32)
    X, DY, Y, DX = to_device(device, x, dy, np.full((M, n_out), np.nan, np.float32),
                             np.full((M, n_in), np.nan, np.float32))  # NaN: must be overwritten
    scale = float(np.abs(wf).max())
    op.forward(Y, X, w, M)
    assert_close(from_device(device, Y, ((M, n_out), np.float32)), ref.qmatmul_forward(x, data, qtype, shape),
                 atol=_atol(n_in, scale), what=f"{what} forward")
    op.input_grad(DX, DY, w, M)
    want_dx = ref.qmatmul_input_grad(dy, data, qtype, shape)
    assert_close(from_device(device, DX, ((M, n_in), np.float32)), want_dx, atol=_atol(n_out, scale),
                 what=f"{what} input_grad")
    op.input_grad(DX, DY, w, M, accumulate=True)
    assert_close(from_device(device, DX, ((M, n_in), np.float32)), 2 * want_dx, atol=2 * _atol(n_out, scale),
                 what=f"{what} input_grad accumulate")


def _block(qtype):
    return max(32, quants.GGML_QUANT_SIZES[qtype][0])


SLOW = pytest.mark.slow  # more sizes of the same kernels: `-m slow` (compiling them takes minutes on PoCL)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("name", ["default", "tiled-auto", pytest.param("tiled-16x8-k8", marks=SLOW),
                                  pytest.param("packed-5x3x4-wg3", marks=SLOW)])
def test_every_format_both_directions(device, rng, qtype, name):
    op = _op(device, name, **CONFIGS[name])
    b = _block(qtype)
    for M, n_out, n_in in [(13, 37, 2 * b), (70, 65, b)]:  # odd n_out, M not a tile multiple
        _check(device, op, rng, qtype, M, n_out, n_in, f"{qtype.name} {name} M={M} {n_out}x{n_in}")


@pytest.mark.parametrize("name", ["tiled-64x64", pytest.param("tiled-1x1", marks=SLOW), "packed-6x2x8-pack-a"])
@pytest.mark.parametrize("qtype", [Q.Q4_1, pytest.param(Q.Q6_K, marks=SLOW)], ids=lambda q: q.name)
def test_work_group_sizes(device, rng, qtype, name):
    op = _op(device, name, **CONFIGS[name])
    _check(device, op, rng, qtype, 67, 129, 512, f"{qtype.name} {name}")


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("gemv", ["default", "gemv-wg64", "gemv-wg8-rows3", pytest.param("gemv-wg1-rows4", marks=SLOW)])
def test_gemv_decode(device, rng, qtype, gemv):
    """The decode GEMV; "default" is the device's own choice (on CPUs cpu_gemv_rows: 2 or 4 rows for M <= 2)."""
    op = _op(device, "default", **CONFIGS["default"]) if gemv == "default" else _op(device, gemv, gemv=GEMVS[gemv])
    b = _block(qtype)
    for M in (1, 8) if gemv == "gemv-wg64" else (1, 2) if gemv == "default" else (3,):  # 8 = GEMV_MAX_M
        _check(device, op, rng, qtype, M, 37, 2 * b, f"{qtype.name} {gemv} M={M}")


def test_the_gpu_source_builds_on_a_cpu_for_every_format(device):
    """CPUs build qmatmul.cl with -DCPU_DEVICE and so never compile its GPU-only lines (vload_half, the float
    GEMV); built here without it, every format's tiled kernel and GEMV (as a GPU builds them) must compile.
    (A macro defined only for CPUs, used by a format's CPU GEMV code, broke the Q8_0 GPU build once.)"""
    from core.device import kernel_source

    if not device.is_cpu:
        pytest.skip("a GPU builds the GPU source in every other test here")
    source = kernel_source("qmatmul")
    tiled = QTiledConfig(16, 16, 16, 2, 2).options()
    for qtype in FORMATS:
        for opts in (("-DFWD", *tiled), tiled, ("-DGEMV_M=2", "-DGEMV_WG=8", "-DGEMV_ROWS=3")):
            options = ["-cl-std=CL1.2", "-w", f"-DQTYPE_{qtype.name}", *opts]
            device.cl.Program(device.context, source).build(options=options)  # raises with the build log


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("name", ["default", "tiled-auto"])
def test_every_half_scale(device, rng, name, qtype):
    """Rows whose scale d (Q4_1: and min m, in another order) takes every finite half value (zero,
    subnormals, negatives, 65504): the kernels' half conversion (bit arithmetic on CPUs; the CPU GEMV
    decodes four rows' halves at once) against numpy's, one row each, relative error."""
    d = np.arange(1 << 16, dtype=np.uint16)
    d = d[(d & 0x7C00) != 0x7C00]  # no inf / nan
    size = quants.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (d.size, size), dtype=np.uint8)
    raw[:, :2] = d.view(np.uint8).reshape(-1, 2)
    if qtype == Q.Q4_1:
        raw[:, 2:4] = rng.permutation(d).view(np.uint8).reshape(-1, 2)
    op, shape = _op(device, name, **CONFIGS[name]), (d.size, 32)
    _prepare_or_skip(device, op, qtype, 2)
    w = upload_weight(device, raw, qtype, shape)
    for M in (2, 9):  # GEMV, GEMM
        x = rng.standard_normal((M, 32)).astype(np.float32)
        (X,), Y = to_device(device, x), device.alloc(M * d.size)
        op.forward(Y, X, w, M)
        want = ref.qmatmul_forward(x, raw, qtype, shape)
        bound = np.abs(x).astype(np.float64) @ np.abs(ref.dequantize(raw, qtype, shape)).T  # sum |x * w|
        err = np.abs(from_device(device, Y, ((M, d.size), np.float32)) - want)
        worst = np.unravel_index(np.argmax(err - 1e-5 * bound), err.shape)
        assert np.all(err <= 1e-5 * bound), \
            f"{name} {qtype.name} M={M}: row {worst[1]} (d bits {d[worst[1]]:#06x}) off by {err[worst]:.3g}"


def test_float_formats_any_n_in(device, rng):
    """F16/BF16/F32 rows need not be multiples of 32 (the GEMV's chunk tail)."""
    for name in ("default", "tiled-auto"):
        op = _op(device, name, **CONFIGS[name])
        for qtype in (Q.F16, Q.BF16, Q.F32):
            for M in (1, 20):
                _check(device, op, rng, qtype, M, 9, 45, f"{qtype.name} {name} M={M} n_in=45")


def test_offsets_and_accumulate_forward(device, rng):
    op = _op(device, "default", **CONFIGS["default"])
    data, shape = random_weight(rng, Q.Q4_1, 33, 64)
    w = upload_weight(device, data, Q.Q4_1, shape)
    for M in (1, 11):
        x = rng.standard_normal((M + 2, 64)).astype(np.float32)
        y0 = rng.standard_normal((M + 1, 33)).astype(np.float32)
        X, Y = to_device(device, x, y0)
        op.forward(Y, X, w, M, accumulate=True, x_offset=2 * 64, y_offset=33)
        want = y0.copy()
        want[1:] += ref.qmatmul_forward(x[2:], data, Q.Q4_1, shape)
        assert_close(from_device(device, Y, y0), want, atol=_atol(64, 1.0), what=f"offsets M={M}")


def test_device_holds_the_gguf_bytes(device):
    """The weights of SmolLM2's file on the device are the file's bytes, and nothing float-sized is kept."""
    from tests.artifacts import smollm2_path

    reader = GGUFReader(str(smollm2_path()))
    picked = {}
    for t in reader.tensors:  # one matrix of each format of the file
        if len(t.shape) == 2 and Q(t.tensor_type) not in picked:
            picked[Q(t.tensor_type)] = t
    assert Q.Q4_1 in picked, sorted(q.name for q in picked)
    op = QMatmul(device)
    for qtype, t in picked.items():
        shape = tuple(int(n) for n in reversed(t.shape))
        before = device.allocated_bytes
        w = upload_weight(device, t.data, qtype, shape)
        assert device.allocated_bytes - before == -(-t.n_bytes // 4) * 4
        raw = np.empty(w.nbytes, np.uint8)
        device.cl.enqueue_copy(device.queue, raw, w.buf, is_blocking=True)
        assert raw.tobytes() == np.ascontiguousarray(t.data).tobytes(), t.name
        M = 4 if shape[0] <= 4096 else 1
        x = np.random.default_rng(0).standard_normal((M, shape[1])).astype(np.float32)
        (X,), Y = to_device(device, x), device.alloc(M * shape[0])
        op.forward(Y, X, w, M)
        want = ref.qmatmul_forward(x, t.data, qtype, shape)
        assert_close(from_device(device, Y, ((M, shape[0]), np.float32)), want, atol=_atol(shape[1], 1.0), what=t.name)
        dy = np.random.default_rng(1).standard_normal((4, shape[0])).astype(np.float32)
        (DY,), DX = to_device(device, dy), device.alloc(4 * shape[1])
        op.input_grad(DX, DY, w, 4)
        want = ref.qmatmul_input_grad(dy, t.data, qtype, shape)
        assert_close(from_device(device, DX, ((4, shape[1]), np.float32)), want, atol=_atol(shape[0], 1.0),
                     what=f"{t.name} input_grad")
        assert op.scratch_bytes() < 4 * shape[0] * shape[1]  # (CPUs) one K chunk of panels, not W as floats


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0], ids=lambda q: q.name)
def test_widening_to_q8_0_is_lossless(rng, qtype):
    """Every block of random bytes (every 4/5-bit pattern, every finite half d) dequantizes by gguf-py to the same
    floats as the Q8_0 it is widened to; bytes that are no whole number of blocks are refused."""
    size = quants.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (4096, size), dtype=np.uint8)
    raw[:, :2] = rng.uniform(-2.0, 2.0, 4096).astype(np.float16)[:, None].view(np.uint8)
    wide = widen_to_q8_0(raw, qtype).reshape(4096, 34)
    assert np.array_equal(quants.dequantize(wide, Q.Q8_0), quants.dequantize(raw, qtype))
    with pytest.raises(ValueError, match="cannot widen Q5_0"):
        widen_to_q8_0(np.zeros(23, np.uint8), Q.Q5_0)
    with pytest.raises(ValueError, match="cannot widen Q4_1"):
        widen_to_q8_0(np.zeros(20, np.uint8), Q.Q4_1)


def test_memory_figure_and_bad_input(device, rng):
    tensors = [("a", Q.Q4_1, (576, 1536)), ("b", Q.Q8_0, (49152, 576)), ("norm", Q.F32, (576,))]
    quant, f32 = frozen_matrix_bytes(tensors)
    assert quant == 576 * 48 * 20 + 49152 * 18 * 34 and f32 == 4 * (576 * 1536 + 49152 * 576)
    assert weight_nbytes(Q.Q6_K, (3, 512)) == 3 * 2 * 210
    with pytest.raises(ValueError, match="multiple of Q4_K's block of 256"):
        weight_nbytes(Q.Q4_K, (3, 32))
    with pytest.raises(ValueError, match="Q5_K is not read"):
        upload_weight(device, np.zeros(176, np.uint8), Q.Q5_K, (1, 256))
    with pytest.raises(ValueError, match="takes 20 bytes, the data has 18"):
        upload_weight(device, np.zeros(18, np.uint8), Q.Q4_1, (1, 32))


def test_file_matrices_of_smollm2():
    from tests.artifacts import smollm2_path

    tensors = file_matrices(str(smollm2_path()))
    quant, f32 = frozen_matrix_bytes(tensors)
    assert len(tensors) == 272 and 0.1 < quant / f32 < 0.25, (len(tensors), quant, f32)


def test_selfcheck(device):
    """The op's launches as ``ref.selfcheck`` makes them (small shapes, for a device check) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))
