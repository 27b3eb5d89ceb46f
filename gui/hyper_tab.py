"""Hyperparameters tab: model architecture and per-stage training settings, presets, live validation.

Every value goes through core.config (ModelConfig, TrainConfig); a ConfigError names the field, and
that field is highlighted. Sizes come from core.estimates.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGridLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget)
from superqt import QCollapsible

from core.config import PRESETS, ConfigError, ModelConfig, StageConfig, TrainConfig, config_errors
from core.batches import stage_passes
from core.plan import AUTO
from core.tokenizer import MIN_VOCAB_SIZE
from gui.app_state import AppState
from gui.plan_view import config_lines, plan_lines, to_html

if TYPE_CHECKING:
    from core.device import DeviceInfo

BAD_STYLE = "background-color: #ffcdcd;"
CUSTOM = "Custom"
NEW_MODEL = "New model"
EXISTING = "Existing GGUF file..."
# Fields the base file fixes when training starts from an existing model (context_length stays: the
# training context, at most the file's).
BASE_FIXED = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "rope_theta", "norm_eps")

# (key, label, type, tooltip); key is the ConfigError field name.
MODEL_FIELDS = [
    ("d_model", "Width (d_model)", int, "Width of the residual stream"),
    ("n_layers", "Layers", int, "Transformer blocks"),
    ("n_heads", "Attention heads", int, "Query heads; d_model / heads must be even"),
    ("n_kv_heads", "Key/value heads", int, "Grouped-query attention: must divide the number of heads"),
    ("ffn_dim", "Feed-forward width", int, "Hidden width of the SwiGLU feed-forward block"),
    ("context_length", "Context length (tokens)", int, "Longest sequence the model sees"),
    ("vocab_size", "Vocabulary size (target)", int, f"Tokens the BPE tokenizer may learn (at least {MIN_VOCAB_SIZE})"),
    ("rope_theta", "RoPE base", float, "Rotary position embedding base frequency"),
    ("norm_eps", "RMSNorm epsilon", float, "Added inside the square root of RMSNorm"),
]
STAGE_FIELDS = [
    ("steps", "Most steps", int, "Optimizer steps in this stage (0 skips it); with recall checks a stage ends "
     "sooner once everything is learned"),
    ("lr", "Learning rate", float, "Peak learning rate"),
    ("batch_size", "Batch size", int, "Sequences per step"),
    ("warmup_steps", "Warmup steps", int, "Linear warmup from 0 to the learning rate"),
    ("min_lr_ratio", "Final lr / peak lr", float, "Cosine decay ends at this fraction of the learning rate"),
    ("decay_steps", "Decay ends at step", int, "The cosine decay ends here (0: at the last step); later steps "
     "keep the final lr"),
]
OPTIMIZER_FIELDS = [
    ("grad_clip", "Clip gradient norm at", float, "Largest global gradient norm (0 disables clipping)"),
    ("weight_decay", "Weight decay", float, "AdamW decoupled weight decay on matrices"),
    ("seed", "Seed", int, "Seeds the initial weights and the batch order"),
    ("grad_accum", "Micro-batches per step", int, "Gradient accumulation: each batch runs in this many parts "
     "(less device memory, the same step)"),
    ("beta1", "Adam beta1", float, "First-moment decay"),
    ("beta2", "Adam beta2", float, "Second-moment decay"),
    ("adam_eps", "Adam epsilon", float, "Added to the denominator of the Adam update"),
]
DATA_FIELDS = [
    ("replay_share", "Fact replay share", float, "Fraction of each tuning batch drawn from the facts (0..1)"),
    ("check_every", "Check recall every (steps)", int, "Train until learned: each stage checks recall this "
     "often and ends when everything is reproduced (0: only at the end; steps are then exact)"),
    ("patience", "Patience (checks)", int, "End a stage after this many checks without better recall (0: never)"),
    ("learned_after", "Learned not before", float, "Share of a stage's planned steps trained before a check "
     "may end it learned (0..1)"),
    ("time_budget_s", "Time budget (s, 0 = none)", float, "Longest run in seconds, checks included; Auto plans "
     "its steps to fit"),
    ("mix_share", "Questions in pretraining", float, "Share of each pretraining batch from dialogues and fact "
     "questions: facts learned while being asked about (0..1)"),
    ("fact_questions", "Questions per unasked fact", int, "Questions written for each fact without a dialogue, "
     "in your dialogues' own patterns (0: none)"),
    ("fact_question_share", "Fact question share", float, "Share of the questions in a batch that are such "
     "fact questions (0..1)"),
    ("conversation_every", "Conversation batch every", int, "Every this many tuning steps, a batch of "
     "several dialogues in one conversation (0: none)"),
    ("heldout", "Held-out fact questions", int, "Fact questions kept out of training to measure answers "
     "about facts without a dialogue (0: none)"),
    ("pack_facts", "Facts per pretraining row", int, "Facts one after another in each row of facts: a batch is "
     "padded to its longest row, and a question is about as long as two facts"),
    ("check_sample", "Items per recall check", int, "Checks during a stage look at this many items of each "
     "kind (0: all); the end of a stage checks all"),
]
TRAIN_FIELDS = OPTIMIZER_FIELDS + DATA_FIELDS


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _preset_values(name: str) -> dict:
    return _config_values(*PRESETS[name])


def _config_values(mc: ModelConfig, tc: TrainConfig) -> dict:
    out = {k: getattr(mc, k) for k, *_ in MODEL_FIELDS if k != "vocab_size"}
    out["vocab_size"] = tc.vocab_size
    for stage in ("pretrain", "tune"):
        sc = getattr(tc, stage)
        out.update({f"{stage}.{k}": getattr(sc, k) for k, *_ in STAGE_FIELDS})
    out.update({k: getattr(tc, k) for k, *_ in TRAIN_FIELDS})
    return out


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
        self.widgets: dict[str, QWidget] = {}
        self.types: dict[str, type] = {}
        self._filling = False
        self._valid = True
        self._error_field: str | None = None
        self._error_fields: list[str] = []
        self._error_message = ""
        self._labels: dict[str, str] = {}  # field key -> "Group ▸ Label" for messages
        self._device: DeviceInfo | None = None  # the memory rule is checked against it
        self.plan = None  # core.plan.Plan of the Auto preset (None: not planned)
        self._replan_timer = QTimer(self, singleShot=True, interval=400)
        self._replan_timer.timeout.connect(self._replan_if_auto)
        self._base: str | None = None
        self._base_config: ModelConfig | None = None
        self._base_error = ""
        self._base_name: str | None = None  # the base model's general.name (or its file name)
        self._no_plan = ""  # why Auto has no plan now ("" when it has one)
        self._labels["base_path"] = "Start from"

        lay = QVBoxLayout(self)
        lay.addLayout(self._top_row())
        # the plan in plain words first (gui.plan_view: every number from core), then the expert fields, folded
        lay.addWidget(self._plan_box())
        lay.addWidget(self._advanced_fold())
        lay.addStretch(1)
        state.device_changed.connect(self.set_device)
        state.project_changed.connect(self._on_project)
        for sig in (state.dataset_replaced, state.dataset_edited, state.device_changed):
            sig.connect(self._replan_timer.start)
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

    def _plan_box(self) -> QGroupBox:
        """The plan in plain words (model, time, steps, checks), a memory warning, what is invalid."""
        info = QGroupBox("Plan")
        iv = QVBoxLayout(info)
        self.plan_label = QLabel()  # model, time, steps, what is checked (gui.plan_view)
        self.plan_label.setWordWrap(True)
        self.plan_label.setObjectName("plan_label")
        self.plan_label.setTextFormat(Qt.TextFormat.RichText)
        iv.addWidget(self.plan_label)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        self.memory_label.setStyleSheet("color: #b00020; font-weight: bold;")
        self.memory_label.hide()
        iv.addWidget(self.memory_label)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #b00020; font-weight: bold;")
        iv.addWidget(self.error_label)
        return info

    def _advanced_fold(self) -> QCollapsible:
        """Every field of the configs, in groups, folded (collapsed until opened)."""
        fields = QWidget()
        grid = QGridLayout(fields)
        grid.setContentsMargins(0, 0, 0, 0)
        for col, groups in enumerate(((("Model", MODEL_FIELDS, ""), ("Optimizer", OPTIMIZER_FIELDS, "")),
                                      (("Stage 1: pretraining on facts", STAGE_FIELDS, "pretrain."),
                                       ("Stage 2: tuning on dialogues", STAGE_FIELDS, "tune.")),
                                      (("Data mix and recall checks", DATA_FIELDS, ""),))):
            for row, group in enumerate(groups):
                grid.addWidget(self._group(*group), row, col, 1 if len(groups) > 1 else 2, 1)
        n = len(MODEL_FIELDS) + 2 * len(STAGE_FIELDS) + len(TRAIN_FIELDS)
        self.advanced = QCollapsible(f"Advanced: {n} settings of the model's shape, the two stages, the optimizer, "
                                     "the data mix and the recall checks (Auto fills them in)",
                                     expandedIcon="▾", collapsedIcon="▸")
        self.advanced.setObjectName("advanced")
        self.advanced.addWidget(fields)
        # the fold animates its maximum height only: open, it holds its fields' height, so that the tab
        # scrolls (gui.main_window.ScrollingTabs) instead of squeezing them
        self.advanced.setDuration(0)
        self.advanced.toggled.connect(lambda on: self.advanced.content().setMinimumHeight(
            self.advanced.content().sizeHint().height() if on else 0))
        return self.advanced

    # ----------------------------------------------------------------------------- start from
    def _show_base_widgets(self) -> None:
        existing = self.start_from.currentText() == EXISTING
        for w in (self.base_edit, self.base_browse):
            w.setVisible(existing)
        for key in BASE_FIXED:
            self.widgets[key].setEnabled(not (existing and self._base_config is not None))

    def _on_start_from(self, text: str) -> None:
        if text == NEW_MODEL:
            self.set_base(None)
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
        architecture fields show the file's values and are locked, the training fields core.finetune's
        defaults (Auto) and the plan describes the fine-tune; a file the engine cannot use is explained
        (naming the key) and blocks Start. Back to a new model, Auto plans again."""
        from core.gguf_import import GGUFError, check_tokenizer, read_config

        self._base, self._base_config, self._base_error, self._base_name = path, None, "", None
        self._filling = True
        self.start_from.setCurrentText(EXISTING if path else NEW_MODEL)
        self.base_edit.setText(path or "")
        self._filling = False
        self._enable_presets(not path)
        if path:
            try:
                mc, _notes, kv = read_config(path)
                check_tokenizer(kv, path)  # refuses a tokenizer we do not support, by name
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
        """The form of a fine-tune of the base: its architecture, core.finetune's training defaults (as
        ``opencl-llm train --base``), the decay ending at each stage's last step."""
        from core.finetune import DEFAULTS, default_train_config

        mc = self._base_config
        values = _config_values(mc, default_train_config())
        values["context_length"] = min(mc.context_length, DEFAULTS["context_length"])
        del values["vocab_size"]  # the file's: the form's target vocabulary is not used
        self.plan = None
        self.set_values(values, preset=AUTO)

    def _enable_presets(self, on: bool) -> None:
        """The model presets make sense only for a new model (their learning rates would wreck a trained one)."""
        model = self.preset.model()
        for name in PRESETS:
            model.item(self.preset.findText(name)).setEnabled(on)

    def _group(self, title: str, fields, prefix: str) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for key, label, typ, tip in fields:
            full = prefix + key
            if typ is int:
                w = QSpinBox()
                w.setRange(0, 1_000_000_000)
                if key == "decay_steps":  # 0: the decay follows the stage's steps
                    w.setSpecialValueText("the last step")
                w.valueChanged.connect(self._on_edit)
            else:
                w = QLineEdit()
                w.textChanged.connect(self._on_edit)
            w.setToolTip(tip)
            w.setObjectName(full)
            self.widgets[full] = w
            self.types[full] = typ
            self._labels[full] = f"{title.split(':')[0]} ▸ {label}"
            form.addRow(label + ":", w)
        return box

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
            self.set_values(_preset_values(name), preset=name)

    def _after_a_run(self) -> None:
        """A run has paid the plan's one-time costs of this device (tuning, compiling: Plan.first_run_s):
        Auto plans again, so that the next run's time is not said to include them."""
        if not self.app_state.is_training() and self.plan is not None and self.plan.first_run_s:
            self._replan_timer.start()

    def _replan_if_auto(self) -> None:
        if self.preset.currentText() == AUTO and self.base_path() is None:
            self.apply_plan()
        else:
            self.validate()  # the passes follow the dataset

    def apply_plan(self) -> None:
        """Plan the run for the dataset and device (core.plan.plan_for: token counts and the device's
        measured training speed, cached per device) and fill the form with it."""
        from core.plan import plan_for

        dataset, info = self.app_state.dataset(), self.app_state.device_info()
        v = self.values()
        budget = v.get("time_budget_s") if isinstance(v.get("time_budget_s"), float) else 0.0
        if info is None or info.problem or not (dataset.facts or dataset.dialogues):
            self.plan = None
            why = f"{info.label} cannot be used ({info.problem})" if info is not None and info.problem else \
                "choose a device and add data to get a plan"
            self._no_plan = f"{AUTO}: {why}; the Small preset's settings until then."
            self.set_values({**_preset_values("Small"), "time_budget_s": budget}, preset=AUTO)
            return
        from core.device import open_device

        self._no_plan = ""
        self.plan, _ = plan_for(dataset, open_device(info), budget or 0.0)
        self.set_values(_config_values(self.plan.model_config, self.plan.train_config), preset=AUTO)

    def set_values(self, values: dict, preset: str | None = None) -> None:
        """Fill the form (unknown keys are ignored) and validate."""
        self._filling = True
        for key, v in values.items():
            w = self.widgets.get(key)
            if w is None:
                continue
            if isinstance(w, QSpinBox):
                try:
                    w.setValue(int(v))
                except (TypeError, ValueError):
                    pass
            else:
                w.setText(_fmt(v))
        if preset is not None:
            self.preset.setCurrentText(preset)
        self._filling = False
        self.validate()
        self.changed.emit()

    def values(self) -> dict:
        """Form values: int for integer fields, float where the text parses, else the raw text."""
        out = {}
        for key, w in self.widgets.items():
            if isinstance(w, QSpinBox):
                out[key] = w.value()
            else:
                text = w.text().strip()
                try:
                    out[key] = float(text)
                except ValueError:
                    out[key] = text
        return out

    def state(self) -> dict:
        """What a project saves: preset name, form values, the base model file and frozen embeddings."""
        return {"preset": self.preset.currentText(), "values": self.values(), "base": self.base_path(),
                "freeze_embeddings": self.freeze.isChecked()}

    def set_state(self, state: dict) -> None:
        values = state.get("values") if isinstance(state, dict) else None
        if isinstance(values, dict):
            if isinstance(state.get("base"), str):
                self.set_base(state["base"])
            self.freeze.setChecked(bool(state.get("freeze_embeddings")))
            self.set_values(values, preset=state.get("preset", CUSTOM))

    def _on_project(self, project) -> None:
        """A project was opened: show its saved form, or the Auto preset."""
        hyper = project.settings.get("hyperparameters")
        if isinstance(hyper, dict):
            self.set_state(hyper)
        else:
            self.set_preset(AUTO)

    def build(self, values: dict | None = None) -> tuple[ModelConfig, TrainConfig]:
        """The configs the form describes (or ``values``, the form's fields by key).

        Raises:
            ConfigError: with ``field`` naming the first bad field.
        """
        v = self.values() if values is None else values
        for key, val in v.items():
            if isinstance(val, str):
                raise ConfigError(key, f"not a number: {val!r}")
        if self.base_path() is not None:
            if self._base_error:
                raise ConfigError("base_path", self._base_error)
            if self._base_config is None:
                raise ConfigError("base_path", "choose the .gguf file to start from")
            if v["context_length"] > self._base_config.context_length:
                raise ConfigError("context_length", f"at most the model's {self._base_config.context_length}")
            mc = ModelConfig(**{**self._base_config.to_dict(), "context_length": v["context_length"]})
        else:
            m = {k: v[k] for k, *_ in MODEL_FIELDS}
            mc = ModelConfig(**m)
        stages = {s: StageConfig(**{k: v[f"{s}.{k}"] for k, *_ in STAGE_FIELDS}) for s in ("pretrain", "tune")}
        tc = TrainConfig(pretrain=stages["pretrain"], tune=stages["tune"],
                         vocab_size=v["vocab_size"] if self.base_path() is None else TrainConfig().vocab_size,
                         freeze_embeddings=self.freeze.isChecked(),
                         **{k: (int(v[k]) if k in ("seed", "grad_accum", "fact_questions", "conversation_every", "heldout",
                                          "pack_facts", "check_sample")
                            else v[k]) for k, *_ in TRAIN_FIELDS})
        return mc, tc

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
        try:
            mc, tc = self.build()
        except ConfigError:
            self._show_errors()
            self.plan_label.setText("")
            self.memory_label.hide()
            ok = False
        else:
            self._error_fields, self._error_field, self._error_message = [], None, ""
            self.error_label.setText("")
            auto = self.preset.currentText() == AUTO and self.plan is not None and self.base_path() is None
            self._show_memory_problem(*((self.plan.model_config, self.plan.train_config) if auto else (mc, tc)))
            self.plan_label.setText(to_html(self.summary_lines(mc, tc)))
            ok = True
        planned = ok and self.preset.currentText() == AUTO and self.plan is not None and self.base_path() is None
        self.app_state.set_hyperparameters((mc, tc) if ok else None, self._error_message, self.limits(),
                                           self.base_path(), self.plan if planned else None)
        self._valid = ok
        return ok

    def _show_errors(self) -> None:
        """Every bad field (core.config.config_errors) highlighted and listed; the Advanced fold opens
        to show them."""
        defaults = _config_values(ModelConfig(), TrainConfig())
        errors = config_errors(self.build, self.values(), defaults)
        messages = []
        for e in errors:
            w = self.widgets.get(e.field) or (self.base_edit if e.field == "base_path" else None)
            if w is not None:
                w.setStyleSheet(BAD_STYLE)
            text = str(e)
            detail = text[len(e.field) + 2:] if text.startswith(e.field + ": ") else text
            messages.append(f"{self._labels.get(e.field, e.field)} ({e.field}): {detail}")
        self._error_field = errors[0].field
        self._error_fields = [e.field for e in errors]
        self._error_message = "; ".join(messages)
        self.error_label.setText(f"Invalid setting — {messages[0]}" if len(messages) == 1 else
                                 f"{len(messages)} invalid settings:\n" + "\n".join(f"• {m}" for m in messages))
        if any(f in self.widgets for f in self._error_fields) and not self.advanced.isExpanded():
            self.advanced.expand(animate=False)

    def _show_memory_problem(self, mc: ModelConfig, tc: TrainConfig) -> None:
        from core.estimates import training_memory_problem

        batch = max(tc.pretrain.batch_size, tc.tune.batch_size)
        dev = self._device
        problem = None if dev is None else training_memory_problem(
            mc, batch, tc.grad_accum, tc.freeze_embeddings, dev.global_mem_bytes, dev.max_alloc_bytes, dev.label)
        self.memory_label.setText(f"⚠ {problem[0].upper()}{problem[1:]}; or choose another device." if problem else "")
        self.memory_label.setVisible(bool(problem))

    def summary_lines(self, mc: ModelConfig, tc: TrainConfig) -> list[tuple[str, str]]:
        """The plan in plain words (gui.plan_view) for the form's configs: the Auto plan's own numbers
        while the form shows it, else the configs' (a base model's when one is chosen)."""
        if self.base_path() is not None:
            return config_lines(mc, tc, self.preset.currentText(), self._stage_passes(tc), self._base_name)
        if self.preset.currentText() == AUTO and self.plan is not None:
            return plan_lines(self.plan)
        lines = config_lines(mc, tc, self.preset.currentText(), self._stage_passes(tc))
        return lines + ([("Note", self._no_plan)] if self.preset.currentText() == AUTO and self._no_plan else [])

    def _stage_passes(self, tc: TrainConfig) -> tuple[float, float]:
        """Passes over the facts and over the dialogues of the stages' steps, in the run's data mix
        (core.batches.stage_passes; 0 without such data)."""
        ds = self.app_state.dataset()
        questions = bool(tc.fact_questions and ds.facts and ds.dialogues)
        conversations = bool(tc.conversation_every and ds.dialogues)
        return tuple(stage_passes(tc, i, st.steps, len(ds.facts), len(ds.dialogues), questions, conversations)
                     for i, st in enumerate((tc.pretrain, tc.tune)))

    def limits(self) -> tuple[int, int]:
        """(vocab_size, context_length) as far as the form is readable (for dataset counts)."""
        v = self.values()
        ok = isinstance(v["vocab_size"], int) and v["vocab_size"] >= MIN_VOCAB_SIZE
        vocab = v["vocab_size"] if ok else ModelConfig.vocab_size  # the default's
        ctx = v["context_length"] if isinstance(v["context_length"], int) and v["context_length"] >= 2 \
            else ModelConfig.context_length
        return vocab, ctx
