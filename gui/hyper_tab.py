"""Hyperparameters tab: model architecture and per-stage training settings, presets, live validation.

Every value goes through core.config (ModelConfig, TrainConfig); a ConfigError names the field, and
that field is highlighted. Sizes come from core.estimates. The fields are gui/settings_form.py's, the
"Plan" box gui/plan_box.py's.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from core.config import PRESETS, ConfigError, ModelConfig, TrainConfig, config_errors
from core.plan import AUTO, plan_on
from core.stages import upgrade_keys
from gui.app_state import AppState
from gui.lora_choice import LoRAChoice
from gui.plan_box import PlanBox
from gui.plan_view import form_lines
from gui.settings_form import BAD_STYLE, SettingsForm, base_values, build_configs, config_values, preset_values
from gui.workers import CallWorker, call_worker

if TYPE_CHECKING:
    from core.device import DeviceInfo
    from core.plan import Plan

__all__ = ["BAD_STYLE", "EXISTING", "NEW_MODEL", "HyperTab"]

CUSTOM = "Custom"
PLANNING = "Auto is planning the run for this dataset and device (token counts, a speed measurement)…"
NEW_MODEL = "New model"
EXISTING = "Existing GGUF file..."
# Fields the base file fixes when training starts from an existing model (context_length stays: the
# training context, at most the file's).
BASE_FIXED = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "rope_theta", "norm_eps")


class HyperTab(QWidget):
    """The model and training settings form.

    Args:
        state: the app state: after every check the tab publishes the configs (or what is wrong) and
            the token-count limits there, and it checks the memory estimate against the state's device.
    """

    changed = Signal()  # (): any value changed (the project saves the form)

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self._filling = False
        self._valid = True
        self._error_field: str | None = None
        self._error_fields: list[str] = []
        self._error_message = ""
        self._device: DeviceInfo | None = None  # the memory rule is checked against it
        self.plan = None  # core.plan.Plan of the Auto preset (None: not planned)
        self._replan_timer = QTimer(self, singleShot=True, interval=400)
        self._replan_timer.timeout.connect(self._replan_if_auto)
        self.plan_worker: CallWorker | None = None  # plans in a thread or child process (apply_plan)
        self._plan_running = False  # from the worker's start until its last signal has been handled
        self._plan_pending = False  # a plan was asked for while one was being made
        self._stopped = False  # the window closes: no new plan (stop)
        self._dataset_edits = 0  # counts the dataset's edits and replacements: a plan is of one version
        self._base: str | None = None
        self._base_config: ModelConfig | None = None
        self._base_error = ""
        self._base_name: str | None = None  # the base model's general.name (or its file name)
        self._base_types: dict[str, str] | None = None  # its tensors' GGUF types (a LoRA run keeps them)
        self._no_plan = ""  # why Auto has no plan now ("" when it has one)
        self.form = SettingsForm(self._on_edit)
        self.widgets, self.types, self.advanced = self.form.widgets, self.form.types, self.form.advanced
        self.values, self.limits = self.form.values, self.form.limits
        self.plan_box = PlanBox()
        self.plan_label, self.memory_label, self.error_label = (self.plan_box.plan_label, self.plan_box.memory_label,
                                                                self.plan_box.error_label)
        lay = QVBoxLayout(self)
        lay.addLayout(self._top_row())
        self.lora_choice = LoRAChoice()  # LoRA or full, shown once a base file is chosen
        self.lora_choice.changed.connect(self._on_start_from)
        lay.addWidget(self.lora_choice)
        # the plan in plain words first (gui.plan_view: every number from core), then the expert fields, folded
        lay.addWidget(self.plan_box)
        lay.addWidget(self.advanced)
        lay.addStretch(1)
        state.device_changed.connect(self.set_device)
        state.project_changed.connect(lambda project: self.set_state(project.settings.get("hyperparameters")))
        for sig in (state.dataset_replaced, state.dataset_edited, state.device_changed):
            sig.connect(self._plan_outdated)
        for sig in (state.dataset_replaced, state.dataset_edited):  # (a project opened emits only the first)
            sig.connect(self._count_edit)
        state.busy_changed.connect(self._after_a_run)
        self.set_preset(AUTO)
        self._show_base_widgets()

    def _top_row(self) -> QHBoxLayout:
        """Preset, Start from (new model or a GGUF file), Freeze embeddings."""
        top = QHBoxLayout()
        top.addWidget(QLabel("Preset:"))
        self.preset = QComboBox()
        self.preset.addItems([AUTO, *PRESETS.keys(), CUSTOM])
        self.preset.setToolTip(f"{AUTO}: a model size and passes planned from your dataset and this device's "
                               "measured speed, trained until learned. Tiny trains in seconds on a CPU; Larger "
                               "needs a GPU")
        self.preset.currentTextChanged.connect(self._on_preset)
        top.addWidget(self.preset)
        top.addSpacing(24)
        top.addWidget(QLabel("Start from:"))
        self.start_from = QComboBox()
        self.start_from.addItems([NEW_MODEL, EXISTING])
        self.start_from.setToolTip("Train a new model from scratch, or teach an existing llama-architecture "
                                   "GGUF model (e.g. SmolLM2) your facts and dialogues")
        self.start_from.currentTextChanged.connect(self._on_start_from)
        top.addWidget(self.start_from)
        self.base_edit = QLineEdit()
        self.base_edit.setPlaceholderText("path of a .gguf file")
        self.base_edit.setObjectName("base_path")
        self.base_edit.editingFinished.connect(lambda: self.set_base(self.base_edit.text().strip() or None))
        top.addWidget(self.base_edit, 1)
        self.base_browse = QPushButton("Browse...")
        self.base_browse.clicked.connect(self._browse_base)
        top.addWidget(self.base_browse)
        self.freeze = QCheckBox("Freeze embeddings")
        self.freeze.setToolTip("Do not train the token embeddings: saves three copies of them in device memory")
        self.freeze.toggled.connect(self._on_edit)
        top.addWidget(self.freeze)
        top.addStretch(1)
        return top

    # ----------------------------------------------------------------------------- start from
    def _show_base_widgets(self) -> None:
        existing = self.start_from.currentText() == EXISTING
        for w in (self.base_edit, self.base_browse):
            w.setVisible(existing)
        self.lora_choice.setVisible(existing and self._base is not None)
        for key in BASE_FIXED:
            self.widgets[key].setEnabled(not (existing and self._base_config is not None))

    def _on_start_from(self, *_: object) -> None:
        """Start from changed, or how the base is taught (LoRA or full): Auto takes that method's defaults."""
        if self.start_from.currentText() == NEW_MODEL:
            self.set_base(None)
        elif self.preset.currentText() == AUTO and self._base_config is not None:
            self._apply_base_defaults()
        else:
            self._show_base_widgets()
            self.validate()
            self.changed.emit()

    def _browse_base(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Start from an existing model", "", "GGUF models (*.gguf)")
        if path:
            self.set_base(path)

    def base_path(self) -> str | None:
        """The GGUF file training starts from, or None for a new model."""
        return self._base if self.start_from.currentText() == EXISTING else None

    def set_base(self, path: str | None) -> None:
        """Start from ``path`` (a llama GGUF file; None: a new model). Reads only the file's header: the
        architecture fields show the file's values and are locked, the training fields core.from_base's
        defaults (Auto) and the plan describes the fine-tune; a file the engine cannot use is explained
        (naming the key) and blocks Start. Back to a new model, Auto plans again."""
        from core.gguf_import import GGUFError, check_tokenizer, read_config, read_tensor_types

        self._base, self._base_config, self._base_error, self._base_name = path, None, "", None
        self._base_types = None
        self._filling = True
        self.start_from.setCurrentText(EXISTING if path else NEW_MODEL)
        self.base_edit.setText(path or "")
        self._filling = False
        for name in PRESETS:  # the presets suit only a new model (their learning rates would wreck a trained one)
            self.preset.model().item(self.preset.findText(name)).setEnabled(not path)
        if path:
            try:
                mc, _notes, kv = read_config(path)
                check_tokenizer(kv, path)  # refuses a tokenizer we do not support, by name
                self._base_types = read_tensor_types(path)
                self._base_config = mc
                self._base_name = str(kv.get("general.name") or Path(path).name)
                self._apply_base_defaults()
            except (GGUFError, ValueError, OSError) as e:
                self._base_error = str(e)
        elif self.preset.currentText() == AUTO:
            self.apply_plan()
        self._show_base_widgets()
        self.validate()
        self.changed.emit()

    def _apply_base_defaults(self) -> None:
        """The form of a fine-tune of the base: its architecture, core.from_base's training defaults (as
        ``opencl-llm train --base``, with LoRA as ``--lora``), the decay ending at each stage's last step."""
        self.plan = None
        self.set_values(base_values(self._base_config, self.lora_choice.is_lora()), preset=AUTO)

    # ----------------------------------------------------------------------------- values
    def set_preset(self, name: str) -> None:
        self.preset.setCurrentText(name)
        self._on_preset(name)

    def _on_preset(self, name: str) -> None:
        if self._filling:
            return
        if name == AUTO and self.base_path() is not None:
            if self._base_config is not None:
                self._apply_base_defaults()
        elif name == AUTO:
            self.apply_plan()
        elif name in PRESETS:
            self.plan = None
            self.set_values(preset_values(name), preset=name)

    def _after_a_run(self) -> None:
        """A run has paid the plan's one-time costs of this device (tuning, compiling: Plan.first_run_s):
        Auto plans again, so that the next run's time is not said to include them."""
        if not self.app_state.is_training() and self.plan is not None and self.plan.first_run_s:
            self._replan_timer.start()

    def _plan_outdated(self, *_) -> None:
        """The dataset or the device changed: Auto plans again 400 ms after the last such change (a burst
        of edits plans once), and training waits from now, not from then (:meth:`planning`): the plan of
        the dataset before would train meanwhile."""
        was_planning = self.planning()
        self._replan_timer.start()
        if not was_planning and self.preset.currentText() == AUTO and self.base_path() is None:
            self.validate()  # once per burst: the blocker and the form's note

    def _replan_if_auto(self) -> None:
        if self.preset.currentText() == AUTO and self.base_path() is None:
            self.apply_plan()
        else:
            self.validate()  # the passes follow the dataset

    def _count_edit(self, *_) -> None:
        self._dataset_edits += 1

    def _budget(self) -> float:
        """The form's time budget in seconds (0.0: none, or not a number yet)."""
        budget = self.values().get("time_budget_s")
        return budget if isinstance(budget, float) else 0.0

    def _plan_key(self) -> tuple:
        """What a plan is of: the dataset's version, the device and the time budget."""
        return self._dataset_edits, self.app_state.device_info(), self._budget()

    def _small_until_planned(self, why: str) -> None:
        """No Auto plan (``why``): the Small preset's settings, the budget kept."""
        self.plan = None
        self._no_plan = f"{AUTO}: {why}; the Small preset's settings until then."
        self.set_values({**preset_values("Small"), "time_budget_s": self._budget()}, preset=AUTO)

    def planning(self) -> bool:
        """True while Auto's plan is due or being made (training waits for it: AppState.train_blocker)."""
        return self._plan_running or self._plan_pending or self._replan_timer.isActive()

    def apply_plan(self) -> None:
        """Plan the run for the dataset and device (core.plan.plan_for: token counts and the device's
        measured training speed, cached per device) and fill the form with it.

        The plan is made in a worker on a copy of the dataset (seconds with 20,000 entries or a device not
        measured yet: in a child process from gui.workers.CHILD_MIN_ENTRIES entries; the window stays responsive) and applied only if the dataset, device,
        budget and Auto are still what it was made for; otherwise it plans again. Until then training
        waits (:meth:`planning`)."""
        if self._stopped:
            return  # a plan's result or a signal handled after stop(): no thread starts after the window closed
        dataset, info = self.app_state.dataset(), self.app_state.device_info()
        if info is None or info.problem or not (dataset.facts or dataset.dialogues):
            self._small_until_planned(f"{info.label} cannot be used ({info.problem})" if info is not None
                                      and info.problem else "choose a device and add data to get a plan")
            return
        if self._plan_running:
            self._plan_pending = True  # planned again when this one ends
            self.validate()
            return
        self._plan_pending = False
        key = self._plan_key()
        dataset = self.app_state.dataset_copy()
        w = call_worker(plan_on, dataset, info, self._budget(), entries=len(dataset.facts) + len(dataset.dialogues))
        w.connect_slots(done=lambda plan: self._on_plan(plan, key), failed=self._on_plan_failed,
                        finished=self._on_plan_finished)
        self.plan_worker, self._plan_running = w, True
        w.start()
        self.validate()

    def _on_plan(self, plan: Plan, key: tuple) -> None:
        if key != self._plan_key():
            self._plan_pending = True  # made for a dataset, device or budget since changed
            return
        if self.preset.currentText() != AUTO or self.base_path() is not None:
            return  # the user chose something else meanwhile
        self._plan_pending = False  # a plan asked for meanwhile would be this one
        self._no_plan = ""
        self.plan = plan
        self.set_values(config_values(plan.model_config, plan.train_config), preset=AUTO)

    def _on_plan_failed(self, _kind: str, message: str) -> None:
        if self.preset.currentText() == AUTO and self.base_path() is None:
            self._small_until_planned(f"no plan ({message})")

    def _on_plan_finished(self) -> None:
        self._plan_running = False
        if self._plan_pending and not self._stopped and self.preset.currentText() == AUTO and self.base_path() is None:
            self.apply_plan()
        else:
            self._plan_pending = False
            self.validate()

    def stop(self) -> None:
        """Stop planning for good (the window closes): the timer, and the planning thread waited for."""
        self._stopped = True
        self._replan_timer.stop()
        self._plan_pending = False
        if self.plan_worker is not None:
            self.plan_worker.request_stop()
            self.plan_worker.wait()

    def set_values(self, values: dict, preset: str | None = None) -> None:
        """Fill the form (unknown keys are ignored) and validate."""
        self._filling = True
        self.form.fill(values)
        if preset is not None:
            self.preset.setCurrentText(preset)
        self._filling = False
        self.validate()
        self.changed.emit()

    def state(self) -> dict:
        """What a project saves: preset name, form values, the base model file, frozen embeddings and the
        fine-tune's method (gui.lora_choice)."""
        return {"preset": self.preset.currentText(), "values": self.values(), "base": self.base_path(),
                "freeze_embeddings": self.freeze.isChecked(), "lora": self.lora_choice.state()}

    def set_state(self, state: dict | None) -> None:
        """Show a project's saved form (``state()``'s dict; one without values changes nothing); None or
        another non-dict (a project that saved none): the Auto preset."""
        if not isinstance(state, dict):
            self.set_preset(AUTO)
            return
        values = state.get("values")
        if isinstance(values, dict):
            # a project saved before LoRA was offered fine-tuned every parameter
            self.lora_choice.set_state(state.get("lora", {"method": "full"} if state.get("base") else None))
            if isinstance(state.get("base"), str):
                self.set_base(state["base"])
            self.freeze.setChecked(bool(state.get("freeze_embeddings")))
            self.set_values(upgrade_keys(values), preset=state.get("preset", CUSTOM))  # an older project's keys too

    def build(self, values: dict | None = None) -> tuple[ModelConfig, TrainConfig]:
        """The configs the form describes (or ``values``, the form's fields by key).

        Raises:
            ConfigError: with ``field`` naming the first bad field.
        """
        v = self.values() if values is None else values
        if self.base_path() is not None and not any(isinstance(val, str) for val in v.values()):
            if self._base_error:
                raise ConfigError("base_path", self._base_error)
            if self._base_config is None:
                raise ConfigError("base_path", "choose the .gguf file to start from")
        return build_configs(v, self._base_config if self.base_path() is not None else None, self.freeze.isChecked())

    # ----------------------------------------------------------------------------- validation
    def _on_edit(self, *_) -> None:
        if self._filling:
            return
        if self.preset.currentText() == AUTO and self.sender() is self.widgets.get("time_budget_s"):
            self._replan_timer.start()  # a new budget: plan again, still Auto
            return
        if self.preset.currentText() != CUSTOM:
            self._filling = True
            self.preset.setCurrentText(CUSTOM)
            self._filling = False
        self.validate()
        self.changed.emit()

    def is_valid(self) -> bool:
        return self._valid

    def error_field(self) -> str | None:
        """The key of the field at fault, or None."""
        return self._error_field

    def error_fields(self) -> list[str]:
        """The keys of every field at fault, in the order found ([] when the form is valid)."""
        return list(self._error_fields)

    def error_message(self) -> str:
        """What is wrong, naming the field as the form shows it ("" when the form is valid)."""
        return self._error_message

    def set_device(self, info: DeviceInfo | None) -> None:
        """The chosen core.device.DeviceInfo (or None): the memory estimate is checked against it."""
        self._device = info
        self.validate()

    def validate(self) -> bool:
        """Check the form; highlight the bad field and explain; update the plan in plain words."""
        for w in [*self.widgets.values(), self.base_edit]:
            w.setStyleSheet("")
        auto = self.preset.currentText() == AUTO and self.plan is not None and self.base_path() is None
        planning = self.preset.currentText() == AUTO and self.base_path() is None and self.planning()
        # a fine-tune's LoRA adapters (None: every parameter), with the file's formats its base keeps
        base = (self.lora_choice.config(), self._base_types) if self.base_path() is not None else (None, None)
        try:
            mc, tc = self.build()
        except ConfigError:
            self._show_errors(config_errors(self.build, self.values(), config_values(ModelConfig(), TrainConfig())))
            ok = False
        else:
            self._error_fields, self._error_field, self._error_message = [], None, ""
            memory = (self.plan.model_config, self.plan.train_config) if auto else (mc, tc)
            lines = form_lines(mc, tc, self.preset.currentText(), self.plan, self.app_state.dataset(),
                               self._base_name if self.base_path() is not None else None, self._no_plan, *base)
            if planning:
                lines.append(("Note", PLANNING))
            self.plan_box.show_plan(lines, *memory, self._device, *base)
            ok = True
        self.app_state.set_hyperparameters((mc, tc) if ok else None, self._error_message, self.limits(),
                                           self.base_path(), self.plan if ok and auto else None, base[0],
                                           planning=planning)
        self._valid = ok
        return ok

    def _show_errors(self, errors: list[ConfigError]) -> None:
        """Every bad field (core.config.config_errors) highlighted and listed; the Advanced fold opens
        to show them."""
        for e in errors:
            w = self.widgets.get(e.field) or (self.base_edit if e.field == "base_path" else None)
            if w is not None:
                w.setStyleSheet(BAD_STYLE)
        messages = [self.form.message(e) for e in errors]
        self._error_field = errors[0].field
        self._error_fields = [e.field for e in errors]
        self._error_message = "; ".join(messages)
        self.plan_box.show_errors(messages)
        if any(f in self.widgets for f in self._error_fields) and not self.advanced.isExpanded():
            self.advanced.expand(animate=False)
