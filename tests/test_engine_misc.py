"""Device layer, configuration validation and sampling."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core import device as device_mod
from core.config import ConfigError, ModelConfig, StageConfig, TrainConfig, lr_at
from core.generate import SamplingSettings, sample_token

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- device layer
def test_list_devices_orders_integrated_gpu_first():
    devices = device_mod.list_devices()
    assert [d.index for d in devices] == list(range(len(devices)))
    assert [d.rank() for d in devices] == sorted(d.rank() for d in devices)
    for d in devices:
        assert d.max_work_group_size >= 1 and d.local_mem_bytes > 0 and d.compute_units >= 1


@pytest.mark.parametrize("width, version, expected", [
    (16, "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", 8),  # pip's PoCL on an AMD Zen 4
    (16, "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-skylake-avx512", 16),
    (16, "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver4", 16),
    (8, "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", 8),
    (16, "OpenCL 3.0 CUDA", 16),  # no HSTR: the device's word
    (1, "OpenCL 3.0 (Mesa)", 1),
])
def test_simd_width_is_that_of_the_cpu_pocl_compiles_for(width, version, expected):
    import pyopencl as cl
    from types import SimpleNamespace

    from core.kernels._launch import simd_width
    from core.kernels.attention import default_tiles
    from core.kernels.matmul import cpu_vector_width

    dev = SimpleNamespace(cl=cl, cl_device=SimpleNamespace(preferred_vector_width_float=width, version=version,
                                                           type=cl.device_type.CPU))
    assert simd_width(dev) == expected
    assert cpu_vector_width(dev) == (expected if expected in (4, 8, 16) else 4)
    # the CPU attention's keys-as-lanes kernels only where the compiled code has 16-float registers
    assert bool(default_tiles(dev, 64).lanes) == (expected >= 16)


def test_select_device_by_index_name_and_errors():
    first = device_mod.list_devices()[0]
    assert device_mod.select_device(0) == first
    assert device_mod.select_device("0") == first
    assert device_mod.select_device(first.name[:5].lower()) == first
    with pytest.raises(ValueError, match="out of range"):
        device_mod.select_device(99)
    with pytest.raises(ValueError, match="no OpenCL device matches"):
        device_mod.select_device("no-such-device-xyz")


def test_a_device_that_cannot_build_kernels_goes_last_and_is_never_chosen(monkeypatch, capsys):
    """pip's PoCL (LLVM 14) lists AMD Zen 5 CPUs but fails every build ("unknown target CPU 'generic'")."""
    import pyopencl as cl

    from core.cli import main

    assert not device_mod.list_devices()[0].problem  # the real probe: this machine has a usable device

    def failing_build(self, *args, **kwargs):
        raise cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed\n\n"
                              "Build on <pyopencl.Device>:\n\nerror: unknown target CPU 'generic'\n")

    monkeypatch.setattr(device_mod, "_probe_results", {})
    monkeypatch.setattr(cl.Program, "build", failing_build)
    devices = device_mod.list_devices()
    assert devices and all("unknown target CPU 'generic'" in d.problem for d in devices)
    assert all(d.rank() == 4 for d in devices)
    with pytest.raises(device_mod.OpenCLUnavailableError, match="cannot build kernels"):
        device_mod.select_device()
    with pytest.raises(device_mod.OpenCLUnavailableError, match="cannot build kernels"):
        device_mod.open_device(devices[0])
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "(default)" not in out and "unusable: its OpenCL compiler cannot build kernels" in out
    assert "To fix: the PoCL that pip installs" in out  # said only when no device works


def test_no_platform_gives_a_clear_message(monkeypatch):
    import pyopencl as cl

    def boom():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", boom)
    with pytest.raises(device_mod.OpenCLUnavailableError) as e:
        device_mod.list_devices()
    msg = str(e.value)
    assert "OpenCL loader used:" in msg and "PoCL" in msg and "driver" in msg


def test_cli_devices_without_opencl_prints_help_not_traceback(monkeypatch, capsys):
    import pyopencl as cl

    from core.cli import main

    def none():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", none)
    assert main(["devices"]) == 1
    err = capsys.readouterr().err
    assert "No OpenCL device found" in err and "OpenCL loader used: " in err and "libOpenCL" in err


def test_kernel_build_failure_shows_the_build_log(device):
    with pytest.raises(device_mod.KernelBuildError) as e:
        device.build_source("broken.cl", "__kernel void k(__global float* x) { x[0] = undefined_name; }")
    assert "broken.cl" in str(e.value) and "undefined_name" in str(e.value)


def test_a_build_log_of_a_successful_build_prints_nothing(device, tmp_path):
    """A kernel that builds with a warning (PoCL's float16 ABI note on AVX2-only CPUs, here a #warning) prints no
    warning: pyopencl's "Non-empty compiler output" lines and PoCL's "1 warning generated." once came before the
    app's and every CLI error's output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    code = ("import sys\nfrom core.device import open_device\n"
            "d = open_device(sys.argv[1])\n"
            "d.build_source('warned.cl', '#warning a warning\\n__kernel void k(__global float* x) { x[0] = 1.0f; }')\n"
            "print('built')\n")
    r = subprocess.run([sys.executable, "-c", code, device.info.name], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "built", r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr  # neither pyopencl's nor the compiler's own "1 warning generated."


@pytest.mark.parametrize("case", ["no-home", "read-only-home"])
def test_cache_dir_is_writable_without_a_usable_home(tmp_path, case):
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "OPENCL_LLM_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    if case == "read-only-home":
        home = tmp_path / "home"
        home.mkdir()
        home.chmod(0o500)
        env["HOME"] = str(home)
    code = ("from core.device import user_cache_dir, open_device\n"
            "from core.kernels.swiglu import SwiGLU\n"
            "d = user_cache_dir(); print(d); SwiGLU(open_device())\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.is_dir()
    if os.geteuid() != 0 and case == "read-only-home":  # root may write anywhere
        assert not str(path).startswith(str(tmp_path / "home"))


def test_programs_are_built_once_per_device(device):
    a = device.program("swiglu")
    b = device.program("swiglu")
    assert a is b


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs,field", [
    (dict(d_model=130, n_heads=4), "n_heads"),        # not divisible
    (dict(d_model=12, n_heads=4), "n_heads"),         # head_dim 3 is odd
    (dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(n_layers=0), "n_layers"),
    (dict(context_length=1), "context_length"),
    (dict(rope_theta=-1.0), "rope_theta"),
    (dict(vocab_size=2.5), "vocab_size"),
])
def test_model_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ConfigError) as e:
        ModelConfig(**kwargs)
    assert e.value.field == field and field in str(e.value)


def test_train_config_names_the_bad_field():
    with pytest.raises(ConfigError) as e:
        TrainConfig(dialogues=StageConfig(lr=0.0))
    assert e.value.field == "dialogues.lr"
    with pytest.raises(ConfigError) as e:
        TrainConfig(replay_share=1.5)
    assert e.value.field == "replay_share"


def test_config_round_trips_through_dicts():
    tc = TrainConfig(seed=7, dialogues=StageConfig(steps=3))
    assert TrainConfig.from_dict(tc.to_dict()) == tc
    mc = ModelConfig(d_model=64, n_kv_heads=2)
    assert ModelConfig.from_dict(mc.to_dict()) == mc
    assert mc.n_params() == sum(int(np.prod(s)) for _, s in mc.param_shapes())


def test_lr_schedule_warmup_then_cosine():
    s = StageConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(s, 0) == pytest.approx(0.1)
    assert lr_at(s, 9) == pytest.approx(1.0)
    assert lr_at(s, 10) == pytest.approx(1.0)
    assert lr_at(s, 60) == pytest.approx(0.55)
    assert lr_at(s, 110) == pytest.approx(0.1)
    lrs = [lr_at(s, i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


# ----------------------------------------------------------------------------- sampling
def test_greedy_picks_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    tok, p = sample_token(logits, SamplingSettings(), [], np.random.default_rng(0))
    assert tok == 1
    assert p.sum() == pytest.approx(1.0)


def test_top_k_and_top_p_restrict_the_choice():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    k2 = {sample_token(logits, SamplingSettings(temperature=1.0, top_k=2), [], rng)[0] for _ in range(300)}
    assert k2 == {0, 1}
    p = {sample_token(logits, SamplingSettings(temperature=1.0, top_p=0.7), [], rng)[0] for _ in range(300)}
    assert p == {0, 1}
    allowed = {sample_token(logits, SamplingSettings(temperature=1.0), [], rng)[0] for _ in range(2000)}
    assert allowed == {0, 1, 2, 3}


def test_temperature_and_repetition_penalty():
    logits = np.array([2.0, 1.0, -1.0])
    _, p1 = sample_token(logits, SamplingSettings(temperature=1.0), [], np.random.default_rng(0))
    _, p2 = sample_token(logits, SamplingSettings(temperature=0.5), [], np.random.default_rng(0))
    assert p2[0] > p1[0]
    np.testing.assert_allclose(p1, np.exp(logits) / np.exp(logits).sum())
    tok, pr = sample_token(logits, SamplingSettings(repetition_penalty=4.0), [0, 2], np.random.default_rng(0))
    assert tok == 1  # 2.0/4 = 0.5 < 1.0
    z = np.array([0.5, 1.0, -4.0])
    np.testing.assert_allclose(pr, np.exp(z) / np.exp(z).sum())


def test_sampling_is_seeded():
    logits = np.zeros(50)
    s = SamplingSettings(temperature=1.0, seed=3)
    a = [sample_token(logits, s, [], np.random.default_rng(3))[0] for _ in range(5)]
    b = [sample_token(logits, s, [], np.random.default_rng(3))[0] for _ in range(5)]
    assert a == b


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(max_tokens=0),
                                    dict(repetition_penalty=0)])
def test_bad_sampling_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingSettings(**kwargs)


def test_pocl_without_a_linker_is_a_clear_error(monkeypatch):
    pocl = [d for d in device_mod.list_devices() if "portable computing language" in d.platform.lower()]
    if not pocl:
        pytest.skip("no PoCL device here")
    monkeypatch.setattr(device_mod.shutil, "which", lambda name: None)
    with pytest.raises(device_mod.OpenCLUnavailableError, match="binutils"):
        device_mod.Device(pocl[0])


@pytest.mark.parametrize("rows, cols, src_ld, dst_ld, src_col, dst_col", [
    (1, 5, 5, 13, 0, 8), (7, 3, 11, 9, 8, 0), (4, 64, 64, 192, 0, 128), (5, 1, 1, 2, 0, 1)])
def test_copy_columns_copies_a_block_between_row_strides(device, rows, cols, src_ld, dst_ld, src_col, dst_col):
    rng = np.random.default_rng(rows * 100 + cols)
    src = rng.standard_normal((rows, src_ld)).astype(np.float32)
    dst = rng.standard_normal((rows, dst_ld)).astype(np.float32)
    bs, bd = device.upload(src), device.upload(dst)
    device.copy_columns(bd, bs, rows, cols, dst_ld=dst_ld, src_ld=src_ld, dst_col=dst_col, src_col=src_col)
    want = dst.copy()
    want[:, dst_col:dst_col + cols] = src[:, src_col:src_col + cols]
    assert np.array_equal(device.download(bd, dst.shape), want)  # the other columns untouched too
    with pytest.raises(ValueError, match="copy_columns"):
        device.copy_columns(bd, bs, rows, cols, dst_ld=dst_ld, src_ld=src_ld, dst_col=dst_ld - cols + 1)


def test_a_program_whose_kernels_the_driver_cache_lost_is_built_again(device, monkeypatch):
    """A compiler crash at a kernel's first launch left PoCL's cached program without kernels (pip's PoCL on a
    Zen 4): INVALID_KERNEL_NAME in every later process. The program is built again under another cache key."""
    real = device.cl
    lost = device.program("sums")  # the cached build that lost its kernels

    class Driver:
        def __getattr__(self, name):
            return getattr(real, name)

        def Kernel(self, prg, name):  # noqa: N802 (pyopencl's name)
            if prg is lost:
                raise real.LogicError("clCreateKernel failed: INVALID_KERNEL_NAME")
            return real.Kernel(prg, name)

    monkeypatch.setattr(device, "cl", Driver())
    knl = device.kernel("sums", "sum_final")
    assert knl.function_name == "sum_final" and knl.program.int_ptr != lost.int_ptr
    with pytest.raises(real.LogicError, match="INVALID_KERNEL_NAME"):  # a name the file does not define: no retry
        device.kernel("sums", "sum_nothing")


def test_kernel_profiling_records_every_launch(device):
    """Device.start_profiling: launches through Device.launch and through the kernel object are
    recorded with their names and device time; stop_profiling returns to a plain queue."""
    import numpy as np

    from core.kernels import swiglu_ref
    from core.kernels.swiglu import SwiGLU

    before = SwiGLU(device, rows_per_item=True)  # fetched before profiling: works, not recorded
    device.start_profiling()
    try:
        rows, units = SwiGLU(device, rows_per_item=True), SwiGLU(device, rows_per_item=False)
        gu = device.upload(np.arange(10, dtype=np.float32))  # one [gate | up] row of ffn_dim 5
        out = device.alloc(5)
        rows.forward_fused(out, gu, 1, 5)
        units.forward_fused(out, gu, 1, 5)
        before.forward_fused(out, gu, 1, 5)
        rows._fused_fwd(device.queue, (16,), (16,), out, gu, np.int32(1), np.int32(5), np.int32(1))  # pyopencl's path
    finally:
        records = device.stop_profiling()
    assert [n for n, _ in records] == ["swiglu_fused_forward_rows", "swiglu_fused_forward", "swiglu_fused_forward_rows"]
    assert all(t >= 0 for _, t in records)
    assert not device.profiling and device.stop_profiling() == []
    again = SwiGLU(device, rows_per_item=True)
    again.forward_fused(out, gu, 1, 5)
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_allclose(device.download(out, (5,)), swiglu_ref.swiglu_forward(x[:5], x[5:]), rtol=1e-5)


def test_counts_are_worded_for_one_and_many():
    from core.wording import count_words, plural, were

    assert count_words(1, "entry") == "1 entry" and count_words(2, "entry") == "2 entries"
    assert count_words(0, "fact") == "0 facts" and count_words(2000, "fact") == "2,000 facts"
    assert count_words(1, "day") == "1 day" and count_words(3, "day") == "3 days"  # a vowel before y: +s
    assert count_words(1.2, "pass", "passes", 0) == "1 pass" and count_words(1.0, "pass", "passes", 1) == "1.0 passes"
    assert plural(1, "was", "were") == "was" and were(1) == "was" and were(5) == "were"


def test_device_check_compares_the_launches_training_makes(device):
    """The Device tab's self-check (core.selftest) passes, and it checks the fused launches the model
    runs (QKV split/join, SwiGLU on [gate | up] rows, the norm after the residual add), backward too."""
    from core.selftest import check_device

    check = check_device(device, matmul_size=64, budget_s=0.05)
    assert check.ok, [(c.name, c.max_abs_err, c.error) for c in check.checks if not c.ok] or check.build_errors
    names = {c.name for c in check.checks}
    assert {"RoPE (QKV split)", "RoPE backward (QKV join)", "SwiGLU", "SwiGLU backward",
            "RMSNorm after the residual add", "RMSNorm backward", "cross-entropy with its gradient"} <= names
