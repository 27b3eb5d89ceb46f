"""Dataset tab: edit facts and multi-turn dialogues, import/export, live validation and counts.

The lists are Qt views on :mod:`gui.dataset_models` over the project's :class:`core.dataset.Dataset`
(edited in place); the search is a :class:`gui.dataset_models.SearchProxy` in front of each list.
Views speak in *source* rows (indexes into ``dataset.facts`` / ``dataset.dialogues``). The parts: the
lists and their buttons (gui/dataset_views.py), the dialogue editor (gui/dialogue_editor.py), the
problems and counts (gui/dataset_check.py), the files (gui/dataset_files.py).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QGroupBox, QLineEdit, QListWidgetItem, QSplitter, QVBoxLayout, QWidget

from core.dataset import Dataset, Dialogue, default_dataset
from gui.app_state import AppState
from gui.dataset_check import MAX_LISTED_PROBLEMS, DatasetCheck
from gui.dataset_files import DatasetFileButtons, read_import, write_dataset
from gui.dataset_models import NEW_TURN, DialoguesModel, FactsModel, TurnsModel
from gui.dataset_undo import EditHistory
from gui.dataset_views import EntryListBox, EntryListView, LiveTextDelegate
from gui.dialogue_editor import DialogueEditor
from gui.workers import CallWorker

__all__ = ["MAX_LISTED_PROBLEMS", "DatasetTab"]


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
        self.check = DatasetCheck(self.dataset, self.dataset_copy, self._highlight, self._goto_problem)
        self.stats_label, self.problem_list, self._stats_timer = (self.check.stats_label, self.check.problem_list,
                                                                  self.check.stats_timer)
        self.problems, self.validate_now, self.set_limits = (self.check.problems, self.check.validate_now,
                                                             self.check.set_limits)
        self._start_stats, self.stop = self.check.start_stats, self.check.stop
        self.files = DatasetFileButtons(self, self.import_file, self.export_file,
                                        lambda: self.set_dataset(default_dataset(), "reset to the example"))
        self._import_dialog = self.files.import_dialog
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search facts and dialogues…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._apply_filter)
        self.files.insertWidget(0, self.search, 1)
        outer = QSplitter(Qt.Orientation.Vertical)
        outer.addWidget(self._build_lists())
        outer.addWidget(self.check)
        outer.setStretchFactor(0, 4)
        outer.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(self.files)
        lay.addWidget(outer, 1)
        self.fact_model.touched.connect(lambda row: self._select(self.facts, row))
        self.dialogue_model.touched.connect(lambda row: self._select(self.dialogues, row))
        self._show_dialogue(-1)
        state.dataset_replaced.connect(self._show_dataset)
        state.hyperparameters_changed.connect(lambda *_: self.set_limits(*self.app_state.limits()))

    def _build_lists(self) -> QSplitter:
        """The facts box beside the dialogues box (the list over the editor of the selected dialogue)."""
        message = self.app_state.message.emit
        facts_box = EntryListBox("Facts (pretraining sentences)", "fact", self.fact_model, self.add_fact, message)
        self.facts = facts_box.view
        self.facts.setItemDelegate(LiveTextDelegate(self.facts))
        self.fact_remove, self.fact_up, self.fact_down = facts_box.remove_button, facts_box.up_button, facts_box.down_button
        self.remove_fact, self._move_fact = facts_box.remove, facts_box.move
        dialogue_list = EntryListBox("", "dialogue", self.dialogue_model, self.add_dialogue, message,
                                     moved=self._show_dialogue)
        self.dialogues = dialogue_list.view
        self.dialogues.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.dialogues.selectionModel().currentChanged.connect(lambda *_: self._show_dialogue(self.dialogues.currentRow()))
        self.dialogue_remove, self.dialogue_up = dialogue_list.remove_button, dialogue_list.up_button
        self.dialogue_down = dialogue_list.down_button
        self.remove_dialogue, self._move_dialogue = dialogue_list.remove, dialogue_list.move
        self.editor = DialogueEditor(self.turn_model, self.edits, self._edited, self._show_dialogue_object)
        self.system, self.turns, self.turn_buttons = self.editor.system, self.editor.turns, self.editor.turn_buttons
        self.add_turn, self.remove_turn = self.editor.add_turn, self.editor.remove_turn
        for view in (self.facts, self.turns):
            view.selectionModel().currentChanged.connect(self._update_buttons)
        self._boxes = (facts_box, dialogue_list)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(dialogue_list)
        split.addWidget(self.editor)
        split.setSizes([300, 250])
        dlg_box = QGroupBox("Dialogues (User / Assistant turns)")
        QVBoxLayout(dlg_box).addWidget(split)
        lists = QSplitter(Qt.Orientation.Horizontal)
        lists.addWidget(facts_box)
        lists.addWidget(dlg_box)
        lists.setSizes([450, 550])
        return lists

    @property
    def _stats_worker(self) -> CallWorker | None:
        """The token-counting worker (None before the first count)."""
        return self.check.stats_worker

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
        self.fact_model.reset(dataset.facts)
        self.dialogue_model.reset(dataset.dialogues)
        self.facts.set_needle(self.search.text())
        self.dialogues.set_needle(self.search.text())
        self.dialogues.setCurrentRow(0 if dataset.dialogues else -1)
        self._show_dialogue(self.dialogues.currentRow())
        self.check.replaced()

    def dataset(self) -> Dataset:
        """The dataset being edited (live object; copy it before handing it to another thread)."""
        return self._dataset

    def dataset_copy(self) -> Dataset:
        """An independent copy of the dataset (for another thread)."""
        return self.app_state.dataset_copy()

    def _edited(self) -> None:
        """Something changed through a model: check again soon, count tokens again later."""
        self.check.edited()
        self._update_buttons()
        self.app_state.mark_dataset_edited()

    # ----------------------------------------------------------------------------- entries
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

    def _show_dialogue(self, row: int) -> None:
        """Put dialogue ``row`` (-1: none) into the editor below the list."""
        valid = 0 <= row < len(self._dataset.dialogues)
        self.editor.show_dialogue(self._dataset.dialogues[row] if valid else None)
        self._highlight_turns()
        self._update_buttons()

    def _on_turns_edited(self) -> None:
        row = self.dialogues.currentRow()
        if row >= 0:
            self.dialogue_model.refresh(row)
        self._edited()

    def _apply_filter(self) -> None:
        needle = self.search.text()
        self.facts.set_needle(needle)
        self.dialogues.set_needle(needle)
        self._show_dialogue(self.dialogues.currentRow())

    def _update_buttons(self, *_) -> None:
        for box in self._boxes:
            box.update_buttons()
        self.editor.update_buttons()

    # ----------------------------------------------------------------------------- problems
    def _highlight(self, problems: list) -> None:
        """Mark every entry at fault (its problems as its tooltip)."""
        facts: dict[int, str] = {}
        dialogues: dict[int, list[str]] = {}
        for p in problems:
            if p.kind == "fact":
                facts.setdefault(p.index, str(p))
            elif p.kind == "dialogue":
                dialogues.setdefault(p.index, []).append(str(p))
        self.fact_model.set_problems(facts)
        self.dialogue_model.set_problems({i: "\n".join(ps) for i, ps in dialogues.items()})
        self._highlight_turns()

    def _highlight_turns(self) -> None:
        cur = self.dialogues.currentRow()
        self.turn_model.set_bad_turns({p.turn for p in self.check.problems()
                                       if p.kind == "dialogue" and p.index == cur and p.turn is not None})

    def _goto_problem(self, item: QListWidgetItem) -> None:
        """Select the entry (and turn) of the problem the user clicked in the problem list."""
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

    # ----------------------------------------------------------------------------- files
    def import_file(self, path: str | Path, replace: bool = True) -> tuple[list[str], list[str]]:
        """Read a dataset file (any core format); returns the problems found (skipped entries) and the notes on
        how it was read (gui.dataset_files.read_import).

        Raises:
            core.dataset.DatasetError, OSError: the file cannot be read at all, or holds no entry (the
                dataset is then left as it is).
        """
        ds, problems, notes = read_import(path)
        if replace:
            self.set_dataset(ds, "import")
            return problems, notes
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
        return problems, notes

    def export_file(self, path: str | Path) -> None:
        """Write the dataset; the format follows the extension (.txt, .jsonl, else JSON). Raises OSError."""
        write_dataset(self._dataset, path)
