"""The Training tab's before/after comparison of a model fine-tuned from a GGUF file with its base."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QHeaderView, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from gui.app_state import AppState
from gui.events import Comparison
from gui.project import checkpoint_meta
from gui.workers import CompareWorker

COMPARE_TEXT = "Compare with the base model"


class ComparePanel(QWidget):
    """A button and a table: the base model's and the tuned model's greedy answers side by side.

    Args:
        state: the app state (device, trained model).
        log: ``log(level, message)``, the tab's log.
        busy: True while the tab trains (no comparison then).
        changed: called when a comparison ends (the tab updates its buttons).
    """

    def __init__(self, state: AppState, log: Callable[[str, str], None], busy: Callable[[], bool],
                 changed: Callable[[], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state, self._log, self._busy, self._changed = state, log, busy, changed
        self._worker: CompareWorker | None = None
        self.button = QPushButton(COMPARE_TEXT)
        self.button.setToolTip("Greedy answers of the base model and the tuned one, side by side, to every "
                               "dataset question and a few general ones: what was learned, what was forgotten")
        self.button.clicked.connect(self.start)
        self.button.hide()
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Question", "Taught", "Base model", "Tuned model"])
        for c in range(4):
            self.table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.button)
        lay.addWidget(self.table, 1)

    def fine_tuned(self) -> bool:
        """True when the project's trained model was fine-tuned from a base file."""
        path = self.app_state.trained_model_path()
        meta = checkpoint_meta(path) if path is not None else None
        return bool(meta is not None and meta.base.get("base_model"))

    def start(self) -> bool:
        """Start the before/after comparison of the trained model with its base (False if not possible)."""
        path = self.app_state.trained_model_path()
        if self._busy() or self._worker is not None or path is None or not self.fine_tuned():
            return False
        w = CompareWorker(self.app_state.device_info(), path)
        w.connect_slots(result=self.show_result, log_line=self._log,
                        failed=lambda kind, msg: self._log("WARNING", f"comparison failed: {msg}"),
                        finished=self._on_finished)
        self._worker = w
        self.button.setEnabled(False)
        self.button.setText("Comparing…")
        w.start()
        return True

    def show_result(self, result: Comparison) -> None:
        """Fill the table with a comparison's answers and show it."""
        self.table.setRowCount(0)
        for r in result.answers:
            i = self.table.rowCount()
            self.table.insertRow(i)
            for c, v in enumerate((r.question, r.taught or "(general question)", r.before, r.after)):
                it = QTableWidgetItem(v)
                it.setToolTip(v)
                self.table.setItem(i, c, it)
        self.table.show()

    def _on_finished(self) -> None:
        self._worker = None
        self.button.setText(COMPARE_TEXT)
        self._changed()

    def running(self) -> bool:
        """True while the comparison runs."""
        return self._worker is not None

    def update_button(self, training: bool) -> None:
        """Shown for a fine-tuned model; enabled when neither training nor comparing."""
        self.button.setVisible(self.fine_tuned())
        self.button.setEnabled(not training and self._worker is None)
