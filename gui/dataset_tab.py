"""Dataset tab: edit facts and multi-turn dialogues, import/export, live validation and counts.

The lists are Qt views on :mod:`gui.dataset_models` over the project's :class:`core.dataset.Dataset`
(edited in place); the search is a :class:`gui.dataset_models.SearchProxy` in front of each list.
Views speak in *source* rows (indexes into ``dataset.facts`` / ``dataset.dialogues``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, QTimer
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QGroupBox, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QListView, QListWidget, QListWidgetItem, QMenu, QPushButton, QSplitter,
                               QStyledItemDelegate, QStyleOptionViewItem, QTableView, QToolButton, QVBoxLayout,
                               QWidget)

from core.dataset import (Dataset, DatasetError, Dialogue, default_dataset, export_jsonl, export_text, load_dataset,
                          save_dataset)
from core.config import ModelConfig
from core.estimates import DatasetStats, dataset_stats
from core.wording import count_words, were
from gui import dialogs
from gui.app_state import AppState
from gui.dataset_models import NEW_TURN, DialoguesModel, FactsModel, SearchProxy, TurnsModel
from gui.dataset_undo import EditHistory
from gui.workers import CallWorker

if TYPE_CHECKING:
    from PySide6.QtGui import QShowEvent

FILE_FILTER = "Datasets (*.json *.txt *.jsonl);;All files (*)"
MAX_LISTED_PROBLEMS = 500  # a list item per problem: 20,000 items would make every check slow


def _button(text: str, tip: str, slot) -> QPushButton:
    b = QPushButton(text)
    b.setToolTip(tip)
    b.clicked.connect(slot)
    # as wide as the text needs (the style's minimum of ~80 px each keeps small windows from fitting)
    b.setMinimumWidth(b.fontMetrics().horizontalAdvance(text) + 24)
    return b


class LiveTextDelegate(QStyledItemDelegate):
    """Writes an entry's text into the dataset while it is typed (after a pause of ``PAUSE_MS``), not
    only when its editor closes, as the system message field does: the checks and the token counts
    follow the fact or turn being typed (they showed the dataset before it, "one edit behind", until
    the editor closed). The writes of one cell merge into one undo step (gui.dataset_models)."""

    PAUSE_MS = 300

    def createEditor(self, parent: QWidget, option: QStyleOptionViewItem, index: QModelIndex) -> QWidget:  # noqa: N802 - Qt API
        editor = super().createEditor(parent, option, index)
        if isinstance(editor, QLineEdit):
            pause = QTimer(editor, singleShot=True, interval=self.PAUSE_MS)
            pause.timeout.connect(lambda: self.commitData.emit(editor))
            editor.textEdited.connect(pause.start)
        return editor

    def setEditorData(self, editor: QWidget, index: QModelIndex) -> None:  # noqa: N802 - Qt API
        """Leave an editor alone when the model holds its text already (its own write): setting it again
        would move the cursor to the end while the user types in the middle."""
        if isinstance(editor, QLineEdit) and editor.text() == index.data(Qt.ItemDataRole.EditRole):
            return
        super().setEditorData(editor, index)


class EntryListView(QListView):
    """A list of facts or dialogues behind a :class:`SearchProxy`; rows are source rows.

    One line per entry, all of the same height (``uniformItemSizes``): the view then lays out
    20,000 rows without measuring each; the full text of a long entry shows in its editor.
    """

    def __init__(self, model: FactsModel | DialoguesModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.proxy = SearchProxy(model, self)
        self.setModel(self.proxy)
        self.setUniformItemSizes(True)
        self.setAlternatingRowColors(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)

    def source(self) -> FactsModel | DialoguesModel:
        """The model over the dataset (FactsModel or DialoguesModel)."""
        return self.proxy.sourceModel()

    def count(self) -> int:
        """Entries in the dataset, shown or not."""
        return self.source().rowCount()

    def view_index(self, row: int) -> QModelIndex:
        """The view's index of source row ``row`` (invalid when the search hides it)."""
        src = self.source()
        return self.proxy.mapFromSource(src.index(row)) if 0 <= row < src.rowCount() else QModelIndex()

    def is_shown(self, row: int) -> bool:
        """True when the search shows source row ``row``."""
        return self.view_index(row).isValid()

    def currentRow(self) -> int:  # noqa: N802 - like QListWidget
        """The selected entry (always one the search shows), or -1."""
        idx = self.currentIndex()
        return self.proxy.mapToSource(idx).row() if idx.isValid() else -1

    def setCurrentRow(self, row: int) -> None:  # noqa: N802 - like QListWidget
        """Select source row ``row``; -1 or a row the search hides selects nothing."""
        idx = self.view_index(row)
        if idx.isValid():
            self.setCurrentIndex(idx)
        else:
            self.clear_current()

    def clear_current(self) -> None:
        """Select nothing."""
        self.selectionModel().setCurrentIndex(QModelIndex(), QItemSelectionModel.SelectionFlag.Clear)

    def neighbour(self, row: int, delta: int) -> int:
        """The nearest source row above (delta -1) or below (+1) ``row`` that the search shows, or -1."""
        idx = self.view_index(row)
        if not idx.isValid():
            return -1
        r = idx.row() + delta
        if not 0 <= r < self.proxy.rowCount():
            return -1
        return self.proxy.mapToSource(self.proxy.index(r, 0)).row()

    def set_needle(self, needle: str) -> None:
        """Filter by ``needle``; a selected entry the search hides is deselected (never moved to a
        neighbour, as Qt would: Remove / Up / Down must not act on an entry the user did not pick)."""
        row = self.currentRow()
        self.proxy.set_needle(needle)
        self.setCurrentRow(row)


class TurnsView(QTableView):
    """The turns of the dialogue being edited (rows are turns, columns User / Assistant)."""

    def __init__(self, model: TurnsModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setModel(model)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.setWordWrap(True)

    def rowCount(self) -> int:  # noqa: N802 - like QTableWidget
        """Turns of the dialogue shown (0 when none is)."""
        return self.model().rowCount()

    def currentRow(self) -> int:  # noqa: N802 - like QTableWidget
        """The selected turn, or -1."""
        idx = self.currentIndex()
        return idx.row() if idx.isValid() else -1

    def setCurrentCell(self, row: int, column: int) -> None:  # noqa: N802 - like QTableWidget
        """Select turn ``row``'s question (column 0) or answer (1)."""
        self.setCurrentIndex(self.model().index(row, column))


class DatasetTab(QWidget):
    """Edits the state's :class:`core.dataset.Dataset` in place and says what is wrong with it, live.

    Args:
        state: the app state: the tab shows ``state.dataset()`` (and each dataset that replaces it),
            reports every edit with ``state.mark_dataset_edited()`` and counts tokens with the
            vocabulary size and context length of ``state.limits()``.
    """

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self._dataset = Dataset()
        self._vocab_size, self._context_length = ModelConfig.vocab_size, ModelConfig.context_length  # the defaults
        self._problems: list = []  # core.dataset.EntryProblem + too-long problems from the stats
        self._too_long: list = []
        self._stats_worker: CallWorker | None = None
        self._stats_pending = False
        self._stopped = False

        self._validate_timer = QTimer(self, singleShot=True, interval=250)
        self._validate_timer.timeout.connect(self.validate_now)
        self._stats_timer = QTimer(self, singleShot=True, interval=700)
        self._stats_timer.timeout.connect(self._start_stats)

        self.fact_model = FactsModel(self)
        self.dialogue_model = DialoguesModel(self)
        self.turn_model = TurnsModel(self)
        self.fact_model.edited.connect(self._edited)
        self.dialogue_model.edited.connect(self._edited)
        self.turn_model.edited.connect(self._on_turns_edited)
        # undo / redo of every edit (the main window's Edit menu shows self.undo_stack)
        self.edits = EditHistory(self)
        self.undo_stack = self.edits.stack
        for m in (self.fact_model, self.dialogue_model, self.turn_model):
            m.history = self.edits
        self.turn_model.show_dialogue = self._show_dialogue_object
        state.project_changed.connect(self.edits.clear)

        # -- top bar
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search facts and dialogues…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._apply_filter)
        top.addWidget(self.search, 1)
        self.import_button = QToolButton()
        self.import_button.setText("Import")
        self.import_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.import_button)
        menu.addAction("Replace with a file…", lambda: self._import_dialog(replace=True))
        menu.addAction("Append a file…", lambda: self._import_dialog(replace=False))
        self.import_button.setMenu(menu)
        top.addWidget(self.import_button)
        top.addWidget(_button("Export…", "Save as the app's JSON, plain text or chat JSONL", self._export_dialog))
        top.addWidget(_button("Reset to example", "Replace everything with the built-in example dataset",
                              self._reset_dialog))

        # -- facts
        facts_box = QGroupBox("Facts (pretraining sentences)")
        fv = QVBoxLayout(facts_box)
        self.facts = EntryListView(self.fact_model)
        self.facts.setItemDelegate(LiveTextDelegate(self.facts))
        self.facts.selectionModel().currentChanged.connect(self._update_buttons)
        fv.addWidget(self.facts, 1)
        fb = QHBoxLayout()
        fb.addWidget(_button("Add", "Add a fact", self.add_fact))
        self.fact_remove = _button("Remove", "Remove the selected fact", self.remove_fact)
        self.fact_up = _button("Up", "Move the selected fact above the previous one shown",
                               lambda: self._move_fact(-1))
        self.fact_down = _button("Down", "Move the selected fact below the next one shown", lambda: self._move_fact(1))
        for b in (self.fact_remove, self.fact_up, self.fact_down):
            fb.addWidget(b)
        fv.addLayout(fb)

        # -- dialogues
        dlg_box = QGroupBox("Dialogues (User / Assistant turns)")
        dv = QVBoxLayout(dlg_box)
        split = QSplitter(Qt.Orientation.Vertical)
        top_part = QWidget()
        tv = QVBoxLayout(top_part)
        tv.setContentsMargins(0, 0, 0, 0)
        self.dialogues = EntryListView(self.dialogue_model)
        self.dialogues.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.dialogues.selectionModel().currentChanged.connect(self._on_dialogue_selected)
        tv.addWidget(self.dialogues, 1)
        db = QHBoxLayout()
        db.addWidget(_button("Add", "Add a dialogue", self.add_dialogue))
        self.dialogue_remove = _button("Remove", "Remove the selected dialogue", self.remove_dialogue)
        self.dialogue_up = _button("Up", "Move the selected dialogue above the previous one shown",
                                   lambda: self._move_dialogue(-1))
        self.dialogue_down = _button("Down", "Move the selected dialogue below the next one shown",
                                     lambda: self._move_dialogue(1))
        for b in (self.dialogue_remove, self.dialogue_up, self.dialogue_down):
            db.addWidget(b)
        tv.addLayout(db)
        split.addWidget(top_part)
        editor = QWidget()
        ev = QVBoxLayout(editor)
        ev.setContentsMargins(0, 0, 0, 0)
        srow = QHBoxLayout()
        srow.addWidget(QLabel("System message:"))
        self.system = QLineEdit()
        self.system.setPlaceholderText("(optional)")
        self.system.textEdited.connect(self._on_system_edited)
        srow.addWidget(self.system, 1)
        ev.addLayout(srow)
        self.turns = TurnsView(self.turn_model)
        self.turns.setItemDelegate(LiveTextDelegate(self.turns))
        self.turns.selectionModel().currentChanged.connect(self._update_buttons)
        ev.addWidget(self.turns, 1)
        tb = QHBoxLayout()
        self.turn_buttons = [
            _button("Add turn", "Add a User/Assistant turn", self.add_turn),
            _button("Remove turn", "Remove the selected turn", self.remove_turn),
            _button("Up", "Move the selected turn up", lambda: self._move_turn(-1)),
            _button("Down", "Move the selected turn down", lambda: self._move_turn(1))]
        for b in self.turn_buttons:
            tb.addWidget(b)
        ev.addLayout(tb)
        split.addWidget(editor)
        split.setSizes([300, 250])
        dv.addWidget(split)

        lists = QSplitter(Qt.Orientation.Horizontal)
        lists.addWidget(facts_box)
        lists.addWidget(dlg_box)
        lists.setSizes([450, 550])

        # -- problems and counts
        bottom = QGroupBox("Check")
        bv = QVBoxLayout(bottom)
        self.stats_label = QLabel("")
        self.stats_label.setWordWrap(True)
        bv.addWidget(self.stats_label)
        self.problem_list = QListWidget()
        self.problem_list.setMaximumHeight(110)
        self.problem_list.setUniformItemSizes(True)
        self.problem_list.itemActivated.connect(self._goto_problem)
        self.problem_list.itemClicked.connect(self._goto_problem)
        bv.addWidget(self.problem_list)

        outer = QSplitter(Qt.Orientation.Vertical)
        outer.addWidget(lists)
        outer.addWidget(bottom)
        outer.setStretchFactor(0, 4)
        outer.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addWidget(outer, 1)
        self.fact_model.touched.connect(lambda row: self._select(self.facts, row))
        self.dialogue_model.touched.connect(lambda row: self._select(self.dialogues, row))
        self._show_dialogue(-1)
        state.dataset_replaced.connect(self._show_dataset)
        state.hyperparameters_changed.connect(self._on_hyperparameters)

    # ----------------------------------------------------------------------------- data in/out
    def set_dataset(self, dataset: Dataset, what: str = "replace the dataset") -> None:
        """Replace the dataset with ``dataset`` (the tab edits this object in place); Edit ▸ Undo brings
        the previous one back."""
        old = self._dataset
        self.app_state.set_dataset(dataset)
        if dataset is not old:
            self.edits.record(what, lambda: self.app_state.set_dataset(old),
                              lambda: self.app_state.set_dataset(dataset))

    def _select(self, view: EntryListView, row: int) -> None:
        """After an undo or redo: show the entry it changed (the search is cleared if it hides it)."""
        if 0 <= row < view.count():
            if not view.is_shown(row):
                self.search.clear()
            view.setCurrentRow(row)
            view.scrollTo(view.view_index(row))
            if view is self.dialogues:
                self._show_dialogue(row)

    def _show_dialogue_object(self, d: Dialogue) -> None:
        """Put dialogue ``d`` (the object) into the editor, for an undo of one of its turns."""
        row = next((i for i, x in enumerate(self._dataset.dialogues) if x is d), -1)
        self._select(self.dialogues, row)

    def _show_dataset(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._too_long = []
        self.fact_model.reset(dataset.facts)
        self.dialogue_model.reset(dataset.dialogues)
        self.facts.set_needle(self.search.text())
        self.dialogues.set_needle(self.search.text())
        self.dialogues.setCurrentRow(0 if dataset.dialogues else -1)
        self._show_dialogue(self.dialogues.currentRow())
        self.validate_now()
        self._stats_timer.start()

    def dataset(self) -> Dataset:
        """The dataset being edited (live object; copy it before handing it to another thread)."""
        return self._dataset

    def dataset_copy(self) -> Dataset:
        """An independent copy of the dataset (for another thread)."""
        return self.app_state.dataset_copy()

    def set_limits(self, vocab_size: int, context_length: int) -> None:
        """Vocabulary size and context length used for token counts and the too-long check."""
        if (vocab_size, context_length) != (self._vocab_size, self._context_length):
            self._vocab_size, self._context_length = vocab_size, context_length
            self._stats_timer.start()

    def _on_hyperparameters(self) -> None:
        self.set_limits(*self.app_state.limits())

    def problems(self) -> list:
        """Current problems (EntryProblem-like objects with kind, index, turn, message)."""
        return list(self._problems)

    def _edited(self) -> None:
        """Something changed through a model: check again soon, count tokens again later (both are
        restarted by every keystroke-sized edit, so typing never waits for them)."""
        self._validate_timer.start()
        self._stats_timer.start()
        self._update_buttons()
        self.app_state.mark_dataset_edited()

    # ----------------------------------------------------------------------------- facts
    def add_fact(self, text: str = "") -> None:
        """Append a fact (empty unless ``text`` is given) and open it for editing, its text selected so that
        typing replaces it."""
        text = text if isinstance(text, str) else ""  # empty until typed: a hint is shown, not content
        self.search.clear()  # the new entry must be visible
        row = len(self._dataset.facts)
        self.fact_model.insert(row, text)
        self.facts.setCurrentRow(row)
        idx = self.facts.view_index(row)
        self.facts.scrollTo(idx)
        self.facts.edit(idx)
        editor = self.facts.indexWidget(idx)
        if isinstance(editor, QLineEdit):
            editor.selectAll()

    def remove_fact(self) -> None:
        """Remove the selected fact (only one the search shows)."""
        row = self.facts.currentRow()
        if row >= 0:
            self.fact_model.remove(row)
            self.app_state.message.emit(f"Removed fact {row + 1} — Edit ▸ Undo (Ctrl+Z) brings it back")

    def _move_fact(self, delta: int) -> None:
        """Swap the selected fact with the nearest one the search shows above (-1) or below (+1)."""
        row = self.facts.currentRow()
        new = self.facts.neighbour(row, delta) if row >= 0 else -1
        if new >= 0:
            self.fact_model.swap(row, new)
            self.facts.setCurrentRow(new)

    # ----------------------------------------------------------------------------- dialogues
    def _current_dialogue(self) -> int:
        """The dialogue shown in the editor: the selected one (always one the search shows), or -1."""
        return self.dialogues.currentRow()

    def add_dialogue(self) -> None:
        """Append a dialogue with one empty turn (its cells show a hint, not content: the checker reports
        it until it is typed), select it and open its question for typing."""
        self.search.clear()  # the new entry must be visible
        row = len(self._dataset.dialogues)
        self.dialogue_model.insert(row, Dialogue([NEW_TURN]))
        self.dialogues.setCurrentRow(row)
        self.dialogues.scrollTo(self.dialogues.view_index(row))
        self.turns.setCurrentCell(0, 0)
        self.turns.edit(self.turn_model.index(0, 0))

    def remove_dialogue(self) -> None:
        """Remove the selected dialogue (only one the search shows)."""
        row = self._current_dialogue()
        if row >= 0:
            self.dialogue_model.remove(row)
            self.app_state.message.emit(f"Removed dialogue {row + 1} — Edit ▸ Undo (Ctrl+Z) brings it back")

    def _move_dialogue(self, delta: int) -> None:
        """Swap the selected dialogue with the nearest one the search shows above (-1) or below (+1)."""
        row = self._current_dialogue()
        new = self.dialogues.neighbour(row, delta) if row >= 0 else -1
        if new >= 0:
            self.dialogue_model.swap(row, new)
            self.dialogues.setCurrentRow(new)
            self._show_dialogue(new)

    def _on_dialogue_selected(self, *_) -> None:
        self._show_dialogue(self._current_dialogue())

    def _show_dialogue(self, row: int) -> None:
        """Put dialogue ``row`` (-1: none) into the editor below the list."""
        valid = 0 <= row < len(self._dataset.dialogues)
        d = self._dataset.dialogues[row] if valid else None
        if d is not self.turn_model.dialogue() or d is None:
            self.turn_model.set_dialogue(d)
        self.system.setEnabled(valid)
        self.turns.setEnabled(valid)
        self.system.setText((d.system or "") if d is not None else "")
        if valid:
            self.turns.resizeRowsToContents()
        self._highlight_turns()
        self._update_buttons()

    def _on_system_edited(self, text: str) -> None:
        row = self._current_dialogue()
        if row >= 0:
            d = self._dataset.dialogues[row]
            old, new = d.system, text if text.strip() else None
            d.system = new
            self._edited()

            def put(value):
                def run():
                    self._show_dialogue_object(d)
                    d.system = value
                    self.system.setText(value or "")
                    self._edited()
                return run
            # typing into the field is one step (merged while the same dialogue's message is edited)
            self.edits.record("edit system message", put(old), put(new), merge_key=("system", id(d)))

    def _on_turns_edited(self) -> None:
        row = self._current_dialogue()
        if row >= 0:
            self.dialogue_model.refresh(row)
        self._edited()

    def add_turn(self) -> None:
        """Append a placeholder turn to the selected dialogue."""
        if self._current_dialogue() < 0:
            return
        t = self.turn_model.add_turn()
        self.turns.resizeRowsToContents()
        self.turns.setCurrentCell(t, 0)

    def remove_turn(self) -> None:
        """Remove the selected turn of the selected dialogue."""
        t = self.turns.currentRow()
        if self._current_dialogue() >= 0 and 0 <= t < self.turns.rowCount():
            self.turn_model.remove_turn(t)

    def _move_turn(self, delta: int) -> None:
        t, n = self.turns.currentRow(), self.turns.rowCount()
        if self._current_dialogue() >= 0 and 0 <= t < n and 0 <= t + delta < n:
            self.turn_model.swap_turns(t, t + delta)
            self.turns.resizeRowsToContents()
            self.turns.setCurrentCell(t + delta, 0)

    # ----------------------------------------------------------------------------- search
    def _apply_filter(self) -> None:
        needle = self.search.text()
        self.facts.set_needle(needle)
        self.dialogues.set_needle(needle)
        self._show_dialogue(self._current_dialogue())

    def _update_buttons(self, *_) -> None:
        """Remove / Up / Down only for a selected, visible entry with a visible neighbour that way."""
        for view, remove, up, down in ((self.facts, self.fact_remove, self.fact_up, self.fact_down),
                                       (self.dialogues, self.dialogue_remove, self.dialogue_up,
                                        self.dialogue_down)):
            row = view.currentRow()
            remove.setEnabled(row >= 0)
            up.setEnabled(row >= 0 and view.neighbour(row, -1) >= 0)
            down.setEnabled(row >= 0 and view.neighbour(row, 1) >= 0)
        has_dialogue = self._current_dialogue() >= 0
        t, n = self.turns.currentRow(), self.turns.rowCount()
        add, remove, up, down = self.turn_buttons
        add.setEnabled(has_dialogue)
        remove.setEnabled(has_dialogue and 0 <= t < n)
        up.setEnabled(has_dialogue and 0 < t < n)
        down.setEnabled(has_dialogue and 0 <= t < n - 1)

    # ----------------------------------------------------------------------------- validation
    def validate_now(self) -> None:
        """Run core validation and highlight every entry at fault."""
        self._validate_timer.stop()
        self._problems = self._dataset.validate()
        self._problems += [p for p in self._too_long
                           if (p.kind == "fact" and p.index < len(self._dataset.facts))
                           or (p.kind == "dialogue" and p.index < len(self._dataset.dialogues))]
        self.problem_list.clear()
        for p in self._problems[:MAX_LISTED_PROBLEMS]:
            it = QListWidgetItem(f"⚠ {p}")
            it.setData(Qt.ItemDataRole.UserRole, (p.kind, p.index, p.turn))
            self.problem_list.addItem(it)
        if len(self._problems) > MAX_LISTED_PROBLEMS:  # all are highlighted in the lists all the same
            self.problem_list.addItem(QListWidgetItem(f"… and {len(self._problems) - MAX_LISTED_PROBLEMS:,} more "
                                                      "problems (fix these first)"))
        if not self._dataset.facts and not self._dataset.dialogues:
            self.problem_list.addItem(QListWidgetItem("⚠ The dataset is empty: add facts or dialogues."))
        elif not self._problems:
            self.problem_list.addItem(QListWidgetItem("No problems found."))
        self._highlight()

    def _highlight(self) -> None:
        facts: dict[int, str] = {}
        dialogues: dict[int, list[str]] = {}
        for p in self._problems:
            if p.kind == "fact":
                facts.setdefault(p.index, str(p))
            elif p.kind == "dialogue":
                dialogues.setdefault(p.index, []).append(str(p))
        self.fact_model.set_problems(facts)
        self.dialogue_model.set_problems({i: "\n".join(ps) for i, ps in dialogues.items()})
        self._highlight_turns()

    def _highlight_turns(self) -> None:
        cur = self._current_dialogue()
        self.turn_model.set_bad_turns({p.turn for p in self._problems
                                       if p.kind == "dialogue" and p.index == cur and p.turn is not None})

    def _goto_problem(self, item: QListWidgetItem) -> None:
        where = item.data(Qt.ItemDataRole.UserRole)
        if not where:
            return
        kind, index, turn = where
        self.search.clear()
        if kind == "fact" and index < self.facts.count():
            self.facts.setCurrentRow(index)
            self.facts.scrollTo(self.facts.view_index(index))
            self.facts.setFocus()
        elif kind == "dialogue" and index < self.dialogues.count():
            self.dialogues.setCurrentRow(index)
            self.dialogues.scrollTo(self.dialogues.view_index(index))
            if turn is not None and turn < self.turns.rowCount():
                self.turns.setCurrentCell(turn, 0)

    # ----------------------------------------------------------------------------- counts
    def _start_stats(self) -> None:
        """Count tokens in a worker thread, on a snapshot of the dataset. Lazy: edits only restart
        the timer that calls this, and a hidden tab waits until it is shown."""
        if self._stopped:
            return
        if not self.isVisible():
            self._stats_pending = True
            return
        if self._stats_worker is not None and self._stats_worker.isRunning():
            self._stats_pending = True
            return
        self._stats_pending = False
        ds = self.dataset_copy()
        if not ds.facts and not ds.dialogues:
            self.stats_label.setText("0 facts, 0 dialogues.")
            return
        w = CallWorker(dataset_stats, ds, self._vocab_size, self._context_length)
        w.connect_slots(done=self._on_stats, failed=self._on_stats_failed, finished=self._on_stats_finished)
        self._stats_worker = w
        w.start()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        if self._stats_pending and not self._stats_timer.isActive():
            self._stats_timer.start()

    def _on_stats(self, s: DatasetStats) -> None:
        n_turns = sum(len(d.turns) for d in self._dataset.dialogues)
        self.stats_label.setText(
            f"{count_words(len(self._dataset.facts), 'fact')}, {count_words(len(self._dataset.dialogues), 'dialogue')} "
            f"({count_words(n_turns, 'turn')}) · "
            f"{s.fact_tokens + s.dialogue_tokens:,} tokens ({s.fact_tokens:,} in facts, "
            f"{s.dialogue_tokens:,} in dialogues) · "
            f"{count_words(s.fact_sequences + s.dialogue_sequences, 'training sequence')} · longest entry {count_words(s.longest, 'token')} (context {self._context_length}) · "
            f"vocabulary {s.vocab_size} tokens")
        self._too_long = list(s.too_long)
        self.validate_now()

    def _on_stats_failed(self, kind: str, message: str) -> None:
        self.stats_label.setText(f"Token counts unavailable: {message}")

    def _on_stats_finished(self) -> None:
        if self._stats_pending:
            self._start_stats()

    def stop(self) -> None:
        """Stop the timers and the counting thread for good (the window closes)."""
        self._stopped = True
        for t in (self._validate_timer, self._stats_timer):
            t.stop()
        if self._stats_worker is not None:
            self._stats_worker.request_stop()
            self._stats_worker.wait()

    # ----------------------------------------------------------------------------- files
    def import_file(self, path: str | Path, replace: bool = True) -> list[str]:
        """Read a dataset file (any core format); returns the problems found (skipped entries).

        Raises:
            core.dataset.DatasetError, OSError: the file cannot be read at all, or holds no entry (the
                dataset is then left as it is).
        """
        ds, problems = load_dataset(path)
        if not ds.facts and not ds.dialogues:
            why = (f"; {count_words(len(problems), 'entry')} could not be read, e.g. {problems[0]}" if problems
                   else "")
            raise DatasetError(f"{path}: no facts or dialogues found{why}. The dataset was not changed.")
        if replace:
            self.set_dataset(ds, "import")
        else:
            target, n_facts, n_dialogues = self._dataset, len(self._dataset.facts), len(self._dataset.dialogues)

            def append():
                target.facts.extend(ds.facts)
                target.dialogues.extend(ds.dialogues)
                self.app_state.set_dataset(target)

            def take_back():
                del target.facts[n_facts:], target.dialogues[n_dialogues:]
                self.app_state.set_dataset(target)
            append()
            self.edits.record("append a file", take_back, append)
        return [str(p) for p in problems]

    def export_file(self, path: str | Path) -> None:
        """Write the dataset; the format follows the extension (.txt, .jsonl, else JSON). Raises OSError."""
        path = Path(path)
        ext = path.suffix.lower()
        if ext == ".txt":
            export_text(self._dataset, path)
        elif ext == ".jsonl":
            export_jsonl(self._dataset, path)
        else:
            save_dataset(self._dataset, path)

    def _import_dialog(self, replace: bool) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a dataset", "", FILE_FILTER)
        if not path:
            return
        try:
            problems = self.import_file(path, replace=replace)
        except (OSError, ValueError) as e:
            dialogs.warn(self, "Import failed", str(e))
            return
        if problems:
            more = f"\n… and {len(problems) - 20} more" if len(problems) > 20 else ""
            dialogs.inform(self, "Import", f"{count_words(len(problems), 'entry')} {were(len(problems))} skipped:\n"
                           + "\n".join(problems[:20]) + more)

    def _export_dialog(self) -> None:
        path, chosen = QFileDialog.getSaveFileName(
            self, "Export the dataset", "dataset.json",
            "App JSON (*.json);;Plain text (*.txt);;Chat JSONL (*.jsonl)")
        if not path:
            return
        if not Path(path).suffix:
            path += {"Plain text (*.txt)": ".txt", "Chat JSONL (*.jsonl)": ".jsonl"}.get(chosen, ".json")
        try:
            self.export_file(path)
        except OSError as e:
            dialogs.warn(self, "Export failed", str(e))

    def _reset_dialog(self) -> None:
        if dialogs.ask(self, "Reset dataset", "Replace the whole dataset with the built-in example?",
                       yes="Replace"):
            self.set_dataset(default_dataset(), "reset to the example")
