"""Shared fixtures: one OpenCL device per available device (pyopencl's ctx_factory pattern).

CI has PoCL only, so every device test runs on the CPU there; a developer machine with a GPU runs
the same tests on the GPU too. ``OPENCL_LLM_TEST_DEVICE`` (index or name) limits the run to one.
"""
from __future__ import annotations

import os
import sys

# GUI tests (tests/test_gui_*.py) need no display; set before anything imports Qt.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tests must not depend on (or wait for) the first-use matmul tuner: untuned defaults everywhere;
# tests/test_kernel_matmul.py switches it on for its tuner test.
os.environ.setdefault("OPENCL_LLM_MATMUL_TUNE", "0")

import numpy as np
import pytest

from core.device import list_devices, open_device

# Property tests: the same examples on every run (CI must not pass or fail by luck), no time limit
# per example (a loaded 2-core CI machine is slow). HYPOTHESIS_PROFILE=explore draws new examples.
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("repeatable", derandomize=True, deadline=None)
_hyp_settings.register_profile("explore", deadline=None)
_hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def _device_params():
    try:
        devices = list_devices()
    except Exception as e:  # no OpenCL at all: device tests fail loudly, not skip silently
        return [pytest.param(None, id="no-opencl", marks=pytest.mark.xfail(reason=str(e), run=False))]
    want = os.environ.get("OPENCL_LLM_TEST_DEVICE")
    if want:
        from core.device import select_device
        devices = [select_device(want)]
    usable = [d for d in devices if not d.problem]
    if not usable:  # listed, but none can build a kernel: fail loudly with the reasons
        reason = "; ".join(f"{d.label}: {d.problem}" for d in devices)
        return [pytest.param(None, id="no-usable-opencl", marks=pytest.mark.xfail(reason=reason, run=False))]
    return [pytest.param(d, id=_device_id(d)) for d in usable]


_PLATFORM_IDS = {"portable computing language": "pocl", "nvidia cuda": "nvidia"}


def _device_id(d) -> str:
    """A test id naming the device, e.g. ``cpu0-pocl``, ``cpu2-rusticl``, ``gpu0-nvidia``."""
    platform = d.platform.strip().lower()
    short = _PLATFORM_IDS.get(platform) or "".join(ch for ch in platform.split()[0] if ch.isalnum())
    return f"{d.kind.lower()}{d.index}-{short}"


def pytest_report_header(config):
    """The devices the device tests run on, in the header of every run."""
    params = _device_params()
    names = [f"{p.id}: {p.values[0].label}" for p in params if p.values[0] is not None]
    return "OpenCL test devices: " + ("; ".join(names) or params[0].id)


@pytest.fixture(params=_device_params(), scope="session")
def device(request):
    """A :class:`core.device.Device` for each OpenCL device on this machine."""
    return open_device(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ----------------------------------------------------------------------------- GUI (tests/test_gui_*.py)

@pytest.fixture(autouse=True)
def _no_qthread_left_running():
    """Fail any test that leaves a gui.workers QThread running (it is stopped and waited for first)."""
    yield
    workers = sys.modules.get("gui.workers")
    if workers is None:
        return
    left = workers.running_workers()
    if left:
        names = ", ".join(type(w).__name__ for w in left)
        workers.stop_all()
        pytest.fail(f"the test left QThreads running: {names}")


@pytest.fixture(autouse=True)
def _gc_only_in_the_gui_thread(request):
    """In Qt tests, collect garbage only in the GUI thread (as gui.app does in the app).

    Python's cyclic GC runs in whichever thread happens to allocate; when it frees a Qt object
    from a worker thread, Qt and the GIL can deadlock (seen: ~QObject in a ChatWorker waiting for
    the GIL while the GUI thread waited for Qt's signal-slot lock). pyqtgraph's GarbageCollector
    disables automatic GC and collects on a GUI-thread timer instead.
    """
    if not {"qtbot", "qapp"} & set(request.fixturenames):
        yield
        return
    import gc

    from pyqtgraph.util.garbage_collector import GarbageCollector

    collector = GarbageCollector(interval=0.5)
    try:
        yield
    finally:
        collector.timer.stop()
        gc.collect()
        gc.enable()


class DialogRecorder:
    """Stands in for gui.dialogs in GUI tests: records every message; answers questions with
    ``answer`` (None: an unexpected question fails the test instead of blocking it)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.warned: list[tuple[str, str]] = []
        self.informed: list[tuple[str, str]] = []
        self.answer: bool | None = None

    def ask(self, parent, title, text, yes="Yes", no="Cancel") -> bool:
        self.asked.append((title, text))
        if self.answer is None:
            raise AssertionError(f"unexpected question {title!r}: {text}")
        return self.answer

    def warn(self, parent, title, text) -> None:
        self.warned.append((title, text))

    def inform(self, parent, title, text) -> None:
        self.informed.append((title, text))


@pytest.fixture(autouse=True)
def dialogs(request, monkeypatch):
    """In Qt tests, gui.dialogs' message boxes are recorded instead of shown (see DialogRecorder)."""
    if not {"qtbot", "qapp"} & set(request.fixturenames):
        yield None
        return
    import gui.dialogs

    rec = DialogRecorder()
    for name in ("ask", "warn", "inform"):
        monkeypatch.setattr(gui.dialogs, name, getattr(rec, name))
    yield rec


@pytest.fixture
def studio_env(tmp_path, monkeypatch, qapp):
    """Isolated QSettings (an INI file under tmp_path) and app data folder for the GUI."""
    from PySide6.QtCore import QSettings

    from gui.app import set_app_identity

    set_app_identity(qapp)
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    monkeypatch.setenv("OPENCL_LLM_STUDIO_DATA", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def main_window(studio_env, qtbot):
    """The real MainWindow on a fresh untitled project; closed (workers stopped) after the test."""
    from gui.main_window import MainWindow

    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


@pytest.fixture
def wait_plan(qtbot):
    """``wait_plan(hyper_tab)``: wait until the tab's Auto plan (made in a worker thread) has come, and
    return it (gui.hyper_tab.HyperTab.plan; None where Auto has none)."""
    def wait(tab):
        qtbot.waitUntil(lambda: not tab.planning(), timeout=120_000)
        return tab.plan

    return wait


# ----------------------------------------------------------------------------- imported GGUF models
@pytest.fixture(scope="session")
def smollm2_import():
    """SmolLM2-135M-Instruct Q4_1 (downloaded once into the test cache), imported."""
    from core.gguf_import import import_gguf
    from tests.artifacts import smollm2_path

    return import_gguf(smollm2_path())


@pytest.fixture(scope="session")
def smollm2_f32(smollm2_import, tmp_path_factory):
    """The imported SmolLM2 exported as F32 (its dequantized weights, tied): llama.cpp's exact reference."""
    from core.gguf_io import export_gguf

    return export_gguf(smollm2_import, tmp_path_factory.mktemp("smollm2") / "smollm2-f32.gguf", dtype="f32").path
