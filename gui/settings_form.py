"""The Hyperparameters tab's fields: one widget per config field (by its key, e.g. "pretrain.lr"), in groups
under the folded "Advanced" section; the form's values to configs and back.

The fields' labels and tooltips are data: resources/form_fields.json.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import NamedTuple

from PySide6.QtWidgets import QFormLayout, QGridLayout, QGroupBox, QLineEdit, QSpinBox, QWidget
from superqt import QCollapsible

from core.config import PRESETS, ConfigError, ModelConfig, StageConfig, TrainConfig
from core.stages import STAGES
from core.tokenizer import MIN_VOCAB_SIZE

BAD_STYLE = "background-color: #ffcdcd;"


class Field(NamedTuple):
    """One setting: ``key`` is the config field (as ConfigError names it), ``type`` int or float."""

    key: str
    label: str
    type: type
    tip: str


def _fields() -> dict[str, list[Field]]:
    data = json.loads(resources.files("resources").joinpath("form_fields.json").read_text("utf-8"))
    types = {"int": int, "float": float}
    return {group: [Field(f["key"], f["label"], types[f["type"]], f["tip"].format(MIN_VOCAB_SIZE=MIN_VOCAB_SIZE))
                    for f in rows] for group, rows in data.items() if not group.startswith("_")}


_FIELDS = _fields()
MODEL_FIELDS, STAGE_FIELDS = _FIELDS["model"], _FIELDS["stage"]
OPTIMIZER_FIELDS, DATA_FIELDS = _FIELDS["optimizer"], _FIELDS["data"]
TRAIN_FIELDS = OPTIMIZER_FIELDS + DATA_FIELDS
# the training fields that TrainConfig takes as int, whatever number the form (or a caller of build) gives
INT_TRAIN_FIELDS = ("seed", "grad_accum", "fact_questions", "conversation_every", "heldout", "pack_facts", "check_sample")


def fmt(v: object) -> str:
    """A value as its field shows it (floats in %g)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def config_values(mc: ModelConfig, tc: TrainConfig) -> dict:
    """The form's values (by field key) of a pair of configs."""
    out = {f.key: getattr(mc, f.key) for f in MODEL_FIELDS if f.key != "vocab_size"}
    out["vocab_size"] = tc.vocab_size
    for stage in STAGES:
        sc = getattr(tc, stage.value)
        out.update({f"{stage.value}.{f.key}": getattr(sc, f.key) for f in STAGE_FIELDS})
    out.update({f.key: getattr(tc, f.key) for f in TRAIN_FIELDS})
    return out


def preset_values(name: str) -> dict:
    """The form's values of a core.config preset."""
    return config_values(*PRESETS[name])


def base_values(base: ModelConfig, lora: bool) -> dict:
    """The form's values of a fine-tune of ``base`` (its architecture; vocab_size left out: the file's):
    core.from_base's training defaults as ``opencl-llm train --base`` takes them (with ``lora``, as
    ``--lora``: its learning rate core.from_base.LORA_LR), the context at most core.from_base's."""
    from core.from_base import DEFAULTS, LORA_LR, default_train_config

    values = config_values(base, default_train_config(lr=LORA_LR if lora else None))
    values["context_length"] = min(base.context_length, DEFAULTS["context_length"])
    del values["vocab_size"]  # the file's: the form's target vocabulary is not used
    return values


def build_configs(v: dict, base: ModelConfig | None, freeze: bool) -> tuple[ModelConfig, TrainConfig]:
    """The configs of the form's values ``v`` (numbers by field key); ``base``: the architecture of the file
    a fine-tune starts from (its context is the form's). Raises ConfigError naming the first bad field."""
    for key, val in v.items():
        if isinstance(val, str):
            raise ConfigError(key, f"not a number: {val!r}")
    if base is not None:
        if v["context_length"] > base.context_length:
            raise ConfigError("context_length", f"at most the model's {base.context_length}")
        mc = ModelConfig(**{**base.to_dict(), "context_length": v["context_length"]})
    else:
        mc = ModelConfig(**{f.key: v[f.key] for f in MODEL_FIELDS})
    stages = {s.value: StageConfig(**{f.key: v[f"{s.value}.{f.key}"] for f in STAGE_FIELDS}) for s in STAGES}
    tc = TrainConfig(**stages, vocab_size=v["vocab_size"] if base is None else TrainConfig().vocab_size,
                     freeze_embeddings=freeze,
                     **{f.key: int(v[f.key]) if f.key in INT_TRAIN_FIELDS else v[f.key] for f in TRAIN_FIELDS})
    return mc, tc


class SettingsForm:
    """The field widgets (``widgets``, ``types``, ``labels`` by key) in the ``advanced`` fold.

    Args:
        on_edit: connected to every field's change.
    """

    def __init__(self, on_edit: Callable[..., None]) -> None:
        self._on_edit = on_edit
        self.widgets: dict[str, QWidget] = {}
        self.types: dict[str, type] = {}
        self.labels: dict[str, str] = {"base_path": "Start from"}  # field key -> "Group ▸ Label" for messages
        self.advanced = self._build_fold()

    def _build_fold(self) -> QCollapsible:
        """Every field of the configs, in groups, folded (collapsed until opened)."""
        fields = QWidget()
        grid = QGridLayout(fields)
        grid.setContentsMargins(0, 0, 0, 0)
        stage_groups = tuple((s.label, STAGE_FIELDS, f"{s.value}.") for s in STAGES)
        for col, groups in enumerate(((("Model", MODEL_FIELDS, ""), ("Optimizer", OPTIMIZER_FIELDS, "")),
                                      stage_groups, (("Data mix and recall checks", DATA_FIELDS, ""),))):
            for row, group in enumerate(groups):
                grid.addWidget(self._group(*group), row, col, 1 if len(groups) > 1 else 2, 1)
        n = len(MODEL_FIELDS) + len(STAGES) * len(STAGE_FIELDS) + len(TRAIN_FIELDS)
        fold = QCollapsible(f"Advanced: {n} settings of the model's shape, the two stages, the optimizer, "
                            "the data mix and the recall checks (Auto fills them in)",
                            expandedIcon="▾", collapsedIcon="▸")
        fold.setObjectName("advanced")
        fold.addWidget(fields)
        # the fold animates its maximum height only: open, it holds its fields' height, so that the tab
        # scrolls (gui.main_window.ScrollingTabs) instead of squeezing them
        fold.setDuration(0)
        fold.toggled.connect(lambda on: fold.content().setMinimumHeight(
            fold.content().sizeHint().height() if on else 0))
        return fold

    def _group(self, title: str, fields: list[Field], prefix: str) -> QGroupBox:
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
            self.labels[full] = f"{title.split(':')[0]} ▸ {label}"
            form.addRow(label + ":", w)
        return box

    def fill(self, values: dict) -> None:
        """Show ``values`` (unknown keys and values a spin box cannot take are ignored)."""
        for key, v in values.items():
            w = self.widgets.get(key)
            if isinstance(w, QSpinBox):
                try:
                    w.setValue(int(v))
                except (TypeError, ValueError):
                    pass
            elif w is not None:
                w.setText(fmt(v))

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

    def message(self, e: ConfigError) -> str:
        """"Group ▸ Label (field): what is wrong" of a ConfigError, as the form names the field."""
        text = str(e)
        detail = text[len(e.field) + 2:] if text.startswith(e.field + ": ") else text
        return f"{self.labels.get(e.field, e.field)} ({e.field}): {detail}"

    def limits(self) -> tuple[int, int]:
        """(vocab_size, context_length) as far as the form is readable (for dataset counts)."""
        v = self.values()
        ok = isinstance(v["vocab_size"], int) and v["vocab_size"] >= MIN_VOCAB_SIZE
        vocab = v["vocab_size"] if ok else ModelConfig.vocab_size  # the default's
        ctx = v["context_length"] if isinstance(v["context_length"], int) and v["context_length"] >= 2 \
            else ModelConfig.context_length
        return vocab, ctx
