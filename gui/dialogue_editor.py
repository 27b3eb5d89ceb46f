"""The Dataset tab's editor of one dialogue: its system message and its turns (User / Assistant)."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from core.dataset import Dialogue
from gui.dataset_models import TurnsModel
from gui.dataset_undo import EditHistory
from gui.dataset_views import LiveTextDelegate, TurnsView, small_button


class DialogueEditor(QWidget):
    """``system`` (the system message field), ``turns`` (a TurnsView on ``turn_model``) and the turn buttons.

    Args:
        turn_model: the turns of the dialogue shown.
        edits: the tab's undo history (a system message edit is one step per dialogue while typed).
        edited: called after every change (the tab checks and counts again).
        show: puts a dialogue (the object) back into the editor, for an undo.
    """

    def __init__(self, turn_model: TurnsModel, edits: EditHistory, edited: Callable[[], None],
                 show: Callable[[Dialogue], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.turn_model, self._edits, self._edited, self._show = turn_model, edits, edited, show
        self._dialogue: Dialogue | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        srow = QHBoxLayout()
        srow.addWidget(QLabel("System message:"))
        self.system = QLineEdit()
        self.system.setPlaceholderText("(optional)")
        self.system.textEdited.connect(self._on_system_edited)
        srow.addWidget(self.system, 1)
        lay.addLayout(srow)
        self.turns = TurnsView(turn_model)
        self.turns.setItemDelegate(LiveTextDelegate(self.turns))
        lay.addWidget(self.turns, 1)
        tb = QHBoxLayout()
        self.turn_buttons = [
            small_button("Add turn", "Add a User/Assistant turn", self.add_turn),
            small_button("Remove turn", "Remove the selected turn", self.remove_turn),
            small_button("Up", "Move the selected turn up", lambda: self._move_turn(-1)),
            small_button("Down", "Move the selected turn down", lambda: self._move_turn(1))]
        for b in self.turn_buttons:
            tb.addWidget(b)
        lay.addLayout(tb)

    def show_dialogue(self, d: Dialogue | None) -> None:
        """Edit dialogue ``d`` (None: none; the editor is disabled)."""
        self._dialogue = d
        if d is not self.turn_model.dialogue() or d is None:
            self.turn_model.set_dialogue(d)
        self.system.setEnabled(d is not None)
        self.turns.setEnabled(d is not None)
        self.system.setText((d.system or "") if d is not None else "")
        if d is not None:
            self.turns.resizeRowsToContents()

    def _on_system_edited(self, text: str) -> None:
        d = self._dialogue
        if d is None:
            return
        old, new = d.system, text if text.strip() else None
        d.system = new
        self._edited()

        def put(value):
            def run():
                self._show(d)
                d.system = value
                self.system.setText(value or "")
                self._edited()
            return run
        # typing into the field is one step (merged while the same dialogue's message is edited)
        self._edits.record("edit system message", put(old), put(new), merge_key=("system", id(d)))

    def add_turn(self) -> None:
        """Append a placeholder turn to the dialogue shown."""
        if self._dialogue is None:
            return
        t = self.turn_model.add_turn()
        self.turns.resizeRowsToContents()
        self.turns.setCurrentCell(t, 0)

    def remove_turn(self) -> None:
        """Remove the selected turn of the dialogue shown."""
        t = self.turns.currentRow()
        if self._dialogue is not None and 0 <= t < self.turns.rowCount():
            self.turn_model.remove_turn(t)

    def _move_turn(self, delta: int) -> None:
        t, n = self.turns.currentRow(), self.turns.rowCount()
        if self._dialogue is not None and 0 <= t < n and 0 <= t + delta < n:
            self.turn_model.swap_turns(t, t + delta)
            self.turns.resizeRowsToContents()
            self.turns.setCurrentCell(t + delta, 0)

    def update_buttons(self) -> None:
        """Add turn with a dialogue shown; Remove / Up / Down for a selected turn that can go that way."""
        has_dialogue = self._dialogue is not None
        t, n = self.turns.currentRow(), self.turns.rowCount()
        add, remove, up, down = self.turn_buttons
        add.setEnabled(has_dialogue)
        remove.setEnabled(has_dialogue and 0 <= t < n)
        up.setEnabled(has_dialogue and 0 < t < n)
        down.setEnabled(has_dialogue and 0 <= t < n - 1)
