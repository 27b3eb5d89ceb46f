"""Hyperparameters ▸ Start from an existing model: how it is taught — LoRA adapters (Hu et al. 2021: rank,
alpha and the layers that get them, core.lora) on the frozen base, or every parameter (a full fine-tune).

Shown only when a base file is chosen. Every default is core.lora.LoRAConfig's; the widgets cannot hold a
setting LoRAConfig refuses (rank >= 1, alpha > 0, at least one layer), so the choice is always valid.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QHBoxLayout, QLabel, QSpinBox, QWidget

from core.lora import TARGETS, LoRAConfig

LORA = "LoRA (recommended)"
FULL = "Full fine-tune"
METHODS = {LORA: "lora", FULL: "full"}  # the combo's text -> what a project saves
TARGET_TIPS = {"attn_q": "attention queries", "attn_k": "attention keys", "attn_v": "attention values",
               "attn_output": "attention output", "ffn_gate": "feed-forward gate", "ffn_up": "feed-forward up",
               "ffn_down": "feed-forward down"}
"""What each of core.lora.TARGETS is, for its check box's tooltip."""


class LoRAChoice(QWidget):
    """``method`` (LoRA or full), ``rank``, ``alpha`` and one check box per target in ``targets`` (by
    core.lora.TARGETS name); the LoRA fields are shown only while LoRA is chosen."""

    changed = Signal()  # (): the method, the rank, alpha or a target changed

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        defaults = LoRAConfig()
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Fine-tune:"))
        self.method = QComboBox()
        self.method.setObjectName("finetune_method")
        self.method.addItems(list(METHODS))
        self.method.setToolTip("LoRA trains small low-rank adapters on the frozen model (its matrices stay in "
                               "the file's format on the device): far less memory, and the adapter exports on its "
                               "own for llama.cpp (--lora) and Ollama (ADAPTER). A full fine-tune trains every "
                               "parameter in float32")
        row.addWidget(self.method)
        self.rank = QSpinBox()
        self.rank.setObjectName("lora_rank")
        self.rank.setRange(1, 4096)
        self.rank.setValue(defaults.rank)
        self.rank.setToolTip("Inner size r of every adapter: A is r × inputs, B outputs × r")
        self.alpha = QDoubleSpinBox()
        self.alpha.setObjectName("lora_alpha")
        self.alpha.setRange(0.01, 1e6)
        self.alpha.setValue(defaults.alpha)
        self.alpha.setToolTip("The adapters' product is scaled by alpha / rank")
        self.fields: list[QWidget] = [QLabel("Rank:"), self.rank, QLabel("Alpha:"), self.alpha, QLabel("Layers:")]
        self.targets: dict[str, QCheckBox] = {}
        for name in TARGETS:
            box = QCheckBox(name)
            box.setObjectName(f"lora_target_{name}")
            box.setChecked(name in defaults.targets)
            box.setToolTip(f"Adapters on every block's {TARGET_TIPS[name]} matrix")
            self.targets[name] = box
            self.fields.append(box)
        for w in self.fields:
            row.addWidget(w)
        row.addStretch(1)
        for sig in (self.method.currentTextChanged, self.rank.valueChanged, self.alpha.valueChanged,
                    *(b.toggled for b in self.targets.values())):
            sig.connect(self._on_change)
        self._on_change(emit=False)

    def is_lora(self) -> bool:
        """True when LoRA adapters are trained (not every parameter)."""
        return METHODS[self.method.currentText()] == "lora"

    def config(self) -> LoRAConfig | None:
        """The core.lora.LoRAConfig shown, or None for a full fine-tune."""
        if not self.is_lora():
            return None
        return LoRAConfig(rank=self.rank.value(), alpha=float(self.alpha.value()),
                          targets=tuple(n for n, b in self.targets.items() if b.isChecked()))

    def state(self) -> dict:
        """What a project saves: ``{"method": "lora" | "full", "rank", "alpha", "targets"}``."""
        shown = LoRAConfig(rank=self.rank.value(), alpha=float(self.alpha.value()),
                           targets=tuple(n for n, b in self.targets.items() if b.isChecked()))
        return {"method": METHODS[self.method.currentText()], **shown.to_dict()}

    def set_state(self, state: dict | None) -> None:
        """Show a saved :meth:`state` (None, or a field that LoRAConfig refuses: core.lora's default for it);
        emits no ``changed`` (the form that restores it validates once)."""
        state = state if isinstance(state, dict) else {}
        defaults = LoRAConfig()
        try:
            saved = LoRAConfig.from_dict({**defaults.to_dict(), **{k: state[k] for k in ("rank", "alpha", "targets")
                                                                   if k in state}})
        except (ValueError, TypeError):
            saved = defaults
        self.blockSignals(True)
        try:
            self.method.setCurrentText(FULL if state.get("method") == "full" else LORA)
            self.rank.setValue(saved.rank)
            self.alpha.setValue(saved.alpha)
            for name, box in self.targets.items():
                box.setChecked(name in saved.targets)
        finally:
            self.blockSignals(False)
        self._on_change(emit=False)

    def _on_change(self, *_: object, emit: bool = True) -> None:
        """The LoRA fields follow the method; the last checked layer cannot be unchecked (LoRA needs one)."""
        lora = self.is_lora()
        for w in self.fields:
            w.setVisible(lora)
        checked = [b for b in self.targets.values() if b.isChecked()]
        for box in self.targets.values():
            box.setEnabled(not (len(checked) == 1 and box.isChecked()))
        if emit and not self.signalsBlocked():
            self.changed.emit()
