"""The Hyperparameters tab's "Plan" box: the plan in plain words, a memory warning, what is invalid."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGroupBox, QLabel, QVBoxLayout, QWidget

from gui.plan_view import Line, to_html

if TYPE_CHECKING:
    from core.config import ModelConfig, TrainConfig
    from core.device import DeviceInfo
    from core.lora import LoRAConfig

WARNING_STYLE = "color: #b00020; font-weight: bold;"


class PlanBox(QGroupBox):
    """``plan_label`` (gui.plan_view's lines), ``memory_label`` (shown when training would not fit the
    device) and ``error_label`` (the invalid settings)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Plan", parent)
        lay = QVBoxLayout(self)
        self.plan_label = QLabel()  # model, time, steps, what is checked (gui.plan_view)
        self.plan_label.setWordWrap(True)
        self.plan_label.setObjectName("plan_label")
        self.plan_label.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.plan_label)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        self.memory_label.setStyleSheet(WARNING_STYLE)
        self.memory_label.hide()
        lay.addWidget(self.memory_label)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(WARNING_STYLE)
        lay.addWidget(self.error_label)

    def show_plan(self, lines: list[Line], mc: ModelConfig, tc: TrainConfig, device: DeviceInfo | None,
                  lora: LoRAConfig | None = None, base_types: dict[str, str] | None = None) -> None:
        """A valid form: its plan, and a warning when training ``mc`` with ``tc`` (LoRA adapters ``lora`` on a
        base of ``base_types``, core.estimates.training_memory_problem) would not fit ``device``."""
        from core.estimates import training_memory_problem

        self.error_label.setText("")
        batch = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
        problem = None if device is None else training_memory_problem(
            mc, batch, tc.grad_accum, tc.freeze_embeddings, device.global_mem_bytes, device.max_alloc_bytes,
            device.label, lora, base_types)
        self.memory_label.setText(f"⚠ {problem[0].upper()}{problem[1:]}; or choose another device." if problem else "")
        self.memory_label.setVisible(bool(problem))
        self.plan_label.setText(to_html(lines))

    def show_errors(self, messages: list[str]) -> None:
        """An invalid form: no plan, every bad setting listed."""
        self.plan_label.setText("")
        self.memory_label.hide()
        self.error_label.setText(f"Invalid setting — {messages[0]}" if len(messages) == 1 else
                                 f"{len(messages)} invalid settings:\n" + "\n".join(f"• {m}" for m in messages))
