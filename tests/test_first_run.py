"""Issue 22 and 24: the faster of several CPU devices is the default (measured, cached), and the plan
counts the one-time costs of a device (tuning, compiling) and says so."""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from core import device as device_mod
from core.device import DeviceInfo, speed_note
from core.estimates import DatasetStats
from core.kernels import attention_autotune, matmul_autotune
from core.plan import LATER_PROGRAMS, first_run_seconds, make_plan


def _info(name: str, kind: str = "CPU", problem: str = "") -> DeviceInfo:
    return DeviceInfo(index=-1, platform=f"{name} platform", name=name, vendor="v", kind=kind, integrated=True,
                      compute_units=2, global_mem_bytes=1 << 30, local_mem_bytes=32768, max_work_group_size=256,
                      opencl_version="OpenCL 3.0", platform_index=0, device_index=0, problem=problem)


def test_the_faster_cpu_device_is_the_default_and_the_slower_says_why(monkeypatch):
    speeds = {"llvmpipe": 0.8, "pocl": 1.8}
    measured = []
    monkeypatch.setattr(device_mod, "device_speed", lambda d: measured.append(d) or speeds[d])
    devices = [_info("llvmpipe"), _info("pocl"), _info("gpu", kind="GPU"), _info("broken", problem="cannot build")]
    ranked = device_mod._rank_by_speed(devices, ["llvmpipe", "pocl", "gpu", "broken"])
    assert [d.name for d in ranked] == ["gpu", "pocl", "llvmpipe", "broken"]
    assert sorted(measured) == ["llvmpipe", "pocl"]  # only competing, usable CPU devices are timed
    assert speed_note(ranked[1], ranked) == "1.8 GFLOP per CPU second at a plain matmul: the fastest CPU device here"
    assert speed_note(ranked[2], ranked) == ("0.8 GFLOP per CPU second at a plain matmul: 2.2x slower than pocl "
                                             "(cpu, pocl platform) (1.8)")
    assert speed_note(ranked[0], ranked) == ""  # a GPU is not timed
    measured.clear()
    alone = device_mod._rank_by_speed([_info("pocl"), _info("gpu", kind="GPU")], ["pocl", "gpu"])
    assert not measured and alone[1].gflops is None and speed_note(alone[1], alone) == ""


def test_device_speed_is_measured_once_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device_mod, "_speed_results", {})
    calls = []
    monkeypatch.setattr(device_mod, "_measure_speed", lambda d: calls.append(d) or 2.5)
    fake = SimpleNamespace(platform=SimpleNamespace(name="P", version="1"), name="D", driver_version="9")
    assert device_mod.device_speed(fake) == 2.5 and device_mod.device_speed(fake) == 2.5
    assert len(calls) == 1
    assert json.loads((tmp_path / device_mod.SPEED_FILE).read_text()) == {"P | 1 | D | 9": 2.5}
    monkeypatch.setattr(device_mod, "_speed_results", {})  # a new process reads the file
    assert device_mod.device_speed(fake) == 2.5 and len(calls) == 1


def test_a_real_device_speed_is_positive(device, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    assert device_mod._measure_speed(device.cl_device) > 0.0


def test_first_run_costs_are_counted_and_said(monkeypatch):
    monkeypatch.setattr(matmul_autotune, "expected_seconds", lambda dev, build_s: 30.0)
    monkeypatch.setattr(attention_autotune, "expected_seconds", lambda dev, build_s: 5.0)
    dev = SimpleNamespace()
    # planning built 10 programs in 20 s: those, the tunings and the programs still to build
    assert first_run_seconds(dev, 10, 20.0) == pytest.approx(20.0 + 30.0 + 5.0 + LATER_PROGRAMS * 2.0)
    monkeypatch.setattr(matmul_autotune, "expected_seconds", lambda dev, build_s: 0.0)
    monkeypatch.setattr(attention_autotune, "expected_seconds", lambda dev, build_s: 0.0)
    assert first_run_seconds(dev, 10, 0.5) == 0.0  # everything cached: programs loaded in 0.05 s each
    plan = make_plan(DatasetStats(600, 470, 400, 25, 13, 51, []), 1e-5)
    assert "first run" not in plan.summary()
    first = replace(plan, first_run_s=95.0)
    assert "first run on this device: +1:35 for tuning and compiling" in first.summary()
    assert first.summary().count("estimated") == 1 and (plan.expected_s + 95.0) > plan.expected_s


def test_the_tuning_estimate_is_bounded_by_the_budgets(device, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "1")
    monkeypatch.setattr(matmul_autotune, "_memo", {})
    # GPUs: plus the first model's per-shape timing, itself bounded by its budget
    shapes = matmul_autotune.SHAPE_BUDGET_S if matmul_autotune.uses_local_tiles(device) else 0.0
    assert 0.0 < matmul_autotune.expected_seconds(device, 1.0) <= matmul_autotune.budget_seconds(device) + shapes
    assert matmul_autotune.expected_seconds(device, 1000.0) == matmul_autotune.budget_seconds(device) + shapes
    with matmul_autotune.untuned():
        assert matmul_autotune.expected_seconds(device, 1.0) == 0.0 and matmul_autotune.tuned_configs(device) == {}
    monkeypatch.setenv("OPENCL_LLM_TUNE_BUDGET_S", "7")
    assert matmul_autotune.budget_seconds(device) == 7.0


def test_the_device_tab_says_why_a_device_is_slow_or_refused(studio_env, qtbot, monkeypatch):
    """Two CPU devices timed (the slower says by how much) and one that cannot build kernels."""
    import core.device
    from gui.main_window import MainWindow

    real = core.device.list_devices()[0]
    fast = replace(real, index=0, gflops=1.8)
    slow = replace(real, index=1, name="llvmpipe", platform="rusticl", gflops=0.8)
    broken = replace(real, index=2, name="broken", problem="its OpenCL compiler cannot build kernels here (test)")
    monkeypatch.setattr(core.device, "list_devices", lambda: [fast, slow, broken])
    w = MainWindow()
    qtbot.addWidget(w)
    tab = w.device_tab
    assert "the fastest CPU device here" in tab.detail_labels["Speed"].text()
    tab.combo.setCurrentIndex(1)
    assert "2.2x slower than" in tab.detail_labels["Speed"].text()
    assert tab.combo.itemData(2, 3) == broken.problem  # Qt.ToolTipRole: why it is refused
    assert "cannot build kernels here" in tab.combo.itemText(2)
    w.close()
