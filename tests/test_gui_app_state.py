"""The application state the tabs share (gui.app_state.AppState), and tabs that live on it alone,
without a main window."""
from __future__ import annotations

from pathlib import Path

from core.dataset import Dataset, Dialogue
from core.device import DeviceInfo
from gui.app_state import AppState
from gui.project import Project


def _device(kind: str, index: int) -> DeviceInfo:
    return DeviceInfo(index=index, platform="Test platform", name=f"Test {kind}", vendor="Test", kind=kind,
                      integrated=kind == "CPU", compute_units=2, global_mem_bytes=2**30, local_mem_bytes=2**15,
                      max_work_group_size=256, opencl_version="OpenCL 3.0", platform_index=0, device_index=index)


def _recorder(signal) -> list:
    seen: list = []
    signal.connect(lambda *args: seen.append(args))
    return seen


def test_state_signals_say_what_changed(qapp, tmp_path):
    state = AppState()
    opened, replaced, edited = (_recorder(s) for s in (state.project_changed, state.dataset_replaced,
                                                       state.dataset_edited))
    project = Project(Path(tmp_path), Dataset(["A fact."], []), {})
    state.set_project(project)
    assert opened == [(project,)] and replaced == [(project.dataset,)] and not edited
    assert state.dataset() is project.dataset and state.trained_model_path() is None
    assert state.checkpoint_dir() == tmp_path / "checkpoint"

    other = Dataset(["Another fact."], [Dialogue([("Q?", "A.")])])
    state.set_dataset(other)
    assert project.dataset is other and replaced[-1] == (other,) and len(edited) == 1
    copy = state.dataset_copy()
    assert copy == other and copy is not other and copy.dialogues[0] is not other.dialogues[0]

    busy = _recorder(state.busy_changed)
    state.set_training(True)
    state.set_training(True)  # no change, no signal
    state.set_exporting(True)
    state.set_training(False)
    assert len(busy) == 3 and state.busy() and state.is_exporting() and not state.is_training()
    state.set_exporting(False)
    assert not state.busy()


def test_device_and_form_decide_whether_training_can_start(qapp):
    state = AppState()
    assert state.train_blocker() == "No OpenCL device: see the Device tab."
    gpu, cpu = _device("GPU", 0), _device("CPU", 1)
    state.set_devices([gpu])
    state.set_device(gpu)
    assert not state.has_cpu_device() and not state.switch_to_cpu() and state.device_info() == gpu
    state.set_hyperparameters(None, "Model ▸ Layers (n_layers): must be at least 1", (512, 64))
    assert state.train_blocker() == "Fix the hyperparameters first: Model ▸ Layers (n_layers): must be at least 1"
    assert state.limits() == (512, 64)

    from core.config import PRESETS
    state.set_hyperparameters(PRESETS["Tiny"], "", (1024, 128))
    assert state.train_blocker() is None and state.configs() == PRESETS["Tiny"]
    changed, messages = _recorder(state.device_changed), _recorder(state.message)
    state.set_devices([gpu, cpu])
    assert state.switch_to_cpu() and state.device_info() == cpu
    assert changed == [(cpu,)] and "Test CPU" in messages[0][0]


def test_tabs_work_on_a_bare_state(qtbot, tmp_path):
    """No main window: the tabs read and change the state only."""
    from gui.dataset_tab import DatasetTab
    from gui.hyper_tab import HyperTab
    from gui.training_tab import TrainingTab

    state = AppState()
    dataset_tab, hyper_tab, training_tab = DatasetTab(state), HyperTab(state), TrainingTab(state)
    for w in (dataset_tab, hyper_tab, training_tab):
        qtbot.addWidget(w)
    assert state.configs() is not None and state.limits() == hyper_tab.limits()  # the Tiny preset
    assert training_tab.start_button.toolTip() == "No OpenCL device: see the Device tab."

    state.set_project(Project(Path(tmp_path), Dataset(["One.", "Two."], []), {}))
    assert dataset_tab.facts.count() == 2
    edited = _recorder(state.dataset_edited)
    model = dataset_tab.facts.source()
    model.setData(model.index(1), "Two, edited.")
    assert state.dataset().facts == ["One.", "Two, edited."] and len(edited) == 1

    hyper_tab.widgets["n_heads"].setValue(3)
    assert state.configs() is None and "n_heads" in state.config_error()
    state.set_device(_device("CPU", 0))
    assert "n_heads" in training_tab.start_button.toolTip() and not training_tab.start_button.isEnabled()
    hyper_tab.set_preset("Tiny")
    assert training_tab.start_button.isEnabled()
    dataset_tab.stop()
    training_tab.stop_and_wait()
