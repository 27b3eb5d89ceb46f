"""Dataset tab: edit facts and multi-turn dialogues, import/export, live validation and counts."""
from __future__ import annotations

import copy
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QFileDialog, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QListWidget, QListWidgetItem, QMenu, QPushButton, QSplitter,
                               QTableWidget, QTableWidgetItem, QToolButton, QVBoxLayout, QWidget)

from core.dataset import (Dataset, DatasetError, Dialogue, default_dataset, export_jsonl, export_text, load_dataset,
                          save_dataset)
from gui import dialogs
from gui.workers import CallWorker

BAD = QBrush(QColor(255, 205, 205))
FILE_FILTER = "Datasets (*.json *.txt *.jsonl);;All files (*)"


def _button(text: str, tip: str, slot) -> QPushButton:
    b = QPushButton(text)
    b.setToolTip(tip)
    b.clicked.connect(slot)
    # as wide as the text needs (the style's minimum of ~80 px each keeps small windows from fitting)
    b.setMinimumWidth(b.fontMetrics().horizontalAdvance(text) + 24)
    return b


def _selected_row(view: QListWidget) -> int:
    """The current row when the search shows it, else -1."""
    row = view.currentRow()
    item = view.item(row) if row >= 0 else None
    return row if item is not None and not item.isHidden() else -1


def _visible_neighbour(view: QListWidget, row: int, delta: int) -> int:
    """The nearest row above (delta -1) or below (+1) ``row`` that the search shows, or -1."""
    r = row + delta
    while 0 <= r < view.count():
        if not view.item(r).isHidden():
            return r
        r += delta
    return -1


def _mark(item, bad: bool, tooltip: str | None) -> None:
    """Highlight an entry. Only real changes are written: a change to an item that is being edited
    resets its editor (the user's typing and the selected text would be lost)."""
    brush = BAD if bad else QBrush()
    if item.background() != brush:
        item.setBackground(brush)
    if tooltip is not None and item.toolTip() != tooltip:
        item.setToolTip(tooltip)


def _stats(dataset: Dataset, vocab_size: int, context_length: int) -> dict:
    """Worker function: core.estimates.dataset_stats as plain data."""
    from core.estimates import dataset_stats

    s = dataset_stats(dataset, vocab_size, context_length)
    return {"vocab_size": s.vocab_size, "fact_tokens": s.fact_tokens, "dialogue_tokens": s.dialogue_tokens,
            "fact_sequences": s.fact_sequences, "dialogue_sequences": s.dialogue_sequences,
            "longest": s.longest,
            "too_long": [[p.kind, p.index, p.turn, p.message] for p in s.too_long]}


class DatasetTab(QWidget):
    """Edits a :class:`core.dataset.Dataset` in place and says what is wrong with it, live."""

    changed = Signal()  # the dataset was edited

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._dataset = Dataset()
        self._vocab_size, self._context_length = 1024, 128
        self._problems: list = []  # core.dataset.EntryProblem + too-long problems from the stats
        self._too_long: list = []
        self._stats_worker: CallWorker | None = None
        self._stats_pending = False
        self._loading = False

        self._validate_timer = QTimer(self, singleShot=True, interval=250)
        self._validate_timer.timeout.connect(self.validate_now)
        self._stats_timer = QTimer(self, singleShot=True, interval=700)
        self._stats_timer.timeout.connect(self._start_stats)

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
        self.facts = QListWidget()
        self.facts.setWordWrap(True)
        self.facts.setAlternatingRowColors(True)
        self.facts.itemChanged.connect(self._on_fact_edited)
        self.facts.itemSelectionChanged.connect(self._update_buttons)
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
        self.dialogues = QListWidget()
        self.dialogues.setAlternatingRowColors(True)
        self.dialogues.currentRowChanged.connect(self._show_dialogue)
        self.dialogues.itemSelectionChanged.connect(self._update_buttons)
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
        self.turns = QTableWidget(0, 2)
        self.turns.setHorizontalHeaderLabels(["User", "Assistant"])
        self.turns.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.turns.setWordWrap(True)
        self.turns.itemChanged.connect(self._on_turn_edited)
        self.turns.itemSelectionChanged.connect(self._update_buttons)
        self.turns.currentCellChanged.connect(self._update_buttons)
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
        self._update_buttons()

    # ----------------------------------------------------------------------------- data in/out
    def set_dataset(self, dataset: Dataset) -> None:
        """Show ``dataset`` (the tab edits this object in place)."""
        self._dataset = dataset
        self._loading = True
        self.facts.clear()
        for f in dataset.facts:
            self.facts.addItem(self._fact_item(f))
        self.dialogues.clear()
        for d in dataset.dialogues:
            self.dialogues.addItem(QListWidgetItem(self._summary(d)))
        self._loading = False
        self._show_dialogue(0 if dataset.dialogues else -1)
        if dataset.dialogues:
            self.dialogues.setCurrentRow(0)
        self._apply_filter()
        self.validate_now()
        self._stats_timer.start()

    def dataset(self) -> Dataset:
        """The dataset being edited (live object; copy it before handing it to another thread)."""
        return self._dataset

    def dataset_copy(self) -> Dataset:
        return copy.deepcopy(self._dataset)

    def set_limits(self, vocab_size: int, context_length: int) -> None:
        """Vocabulary size and context length used for token counts and the too-long check."""
        if (vocab_size, context_length) != (self._vocab_size, self._context_length):
            self._vocab_size, self._context_length = vocab_size, context_length
            self._stats_timer.start()

    def problems(self) -> list:
        """Current problems (EntryProblem-like objects with kind, index, turn, message)."""
        return list(self._problems)

    def _edited(self) -> None:
        if self._loading:
            return
        self._validate_timer.start()
        self._stats_timer.start()
        self.changed.emit()

    # ----------------------------------------------------------------------------- facts
    @staticmethod
    def _fact_item(text: str) -> QListWidgetItem:
        it = QListWidgetItem(text)
        it.setFlags(it.flags() | Qt.ItemFlag.ItemIsEditable)
        return it

    def add_fact(self, text: str = "") -> None:
        """Append a fact and open it for editing, its text selected so that typing replaces it."""
        text = text if isinstance(text, str) and text else "New fact."
        self.search.clear()  # the new entry must be visible
        self._dataset.facts.append(text)
        self._loading = True
        self.facts.addItem(self._fact_item(text))
        self._loading = False
        row = self.facts.count() - 1
        self.facts.setCurrentRow(row)
        item = self.facts.item(row)
        self.facts.editItem(item)
        editor = self.facts.indexWidget(self.facts.indexFromItem(item))
        if isinstance(editor, QLineEdit):
            editor.selectAll()
        self._edited()

    def remove_fact(self) -> None:
        """Remove the selected fact (only one the search shows)."""
        row = _selected_row(self.facts)
        if 0 <= row < len(self._dataset.facts):
            del self._dataset.facts[row]
            self._loading = True
            self.facts.takeItem(row)
            self._loading = False
            self._drop_hidden_selection()
            self._edited()

    def _move_fact(self, delta: int) -> None:
        """Swap the selected fact with the nearest one the search shows above (-1) or below (+1)."""
        row = _selected_row(self.facts)
        new = _visible_neighbour(self.facts, row, delta) if row >= 0 else -1
        facts = self._dataset.facts
        if 0 <= row < len(facts) and 0 <= new < len(facts):
            facts[row], facts[new] = facts[new], facts[row]
            self._loading = True
            self.facts.item(row).setText(facts[row])
            self.facts.item(new).setText(facts[new])
            self._loading = False
            self.facts.setCurrentRow(new)
            self._edited()

    def _on_fact_edited(self, item: QListWidgetItem) -> None:
        if self._loading:
            return
        row = self.facts.row(item)
        if 0 <= row < len(self._dataset.facts) and self._dataset.facts[row] != item.text():
            self._dataset.facts[row] = item.text()
            self._edited()

    # ----------------------------------------------------------------------------- dialogues
    @staticmethod
    def _summary(d: Dialogue) -> str:
        if not d.turns:
            return "(no turns)"
        first = d.turns[0][0].strip() or "(empty question)"
        n_more = len(d.turns) - 1
        more = f"  (+{n_more} turn{'s' if n_more > 1 else ''})" if n_more else ""
        return f"User: {first}{more}"

    def _current_dialogue(self) -> int:
        """The dialogue shown in the editor: the selected one, if the search shows it; else -1."""
        row = _selected_row(self.dialogues)
        return row if 0 <= row < len(self._dataset.dialogues) else -1

    def add_dialogue(self) -> None:
        self.search.clear()  # the new entry must be visible
        d = Dialogue([("New question?", "New answer.")])
        self._dataset.dialogues.append(d)
        self.dialogues.addItem(QListWidgetItem(self._summary(d)))
        self.dialogues.setCurrentRow(self.dialogues.count() - 1)
        self._edited()

    def remove_dialogue(self) -> None:
        """Remove the selected dialogue (only one the search shows)."""
        row = self._current_dialogue()
        if row >= 0:
            del self._dataset.dialogues[row]
            self.dialogues.takeItem(row)
            self._drop_hidden_selection()
            self._show_dialogue(self._current_dialogue())
            self._edited()

    def _move_dialogue(self, delta: int) -> None:
        """Swap the selected dialogue with the nearest one the search shows above (-1) or below (+1)."""
        row = self._current_dialogue()
        new = _visible_neighbour(self.dialogues, row, delta) if row >= 0 else -1
        ds = self._dataset.dialogues
        if row >= 0 and 0 <= new < len(ds):
            ds[row], ds[new] = ds[new], ds[row]
            self._refresh_summary(row)
            self._refresh_summary(new)
            self.dialogues.setCurrentRow(new)
            self._edited()

    def _show_dialogue(self, row: int) -> None:
        self._loading = True
        self.turns.setRowCount(0)
        valid = 0 <= row < len(self._dataset.dialogues) and not self.dialogues.item(row).isHidden()
        self.system.setEnabled(valid)
        self.turns.setEnabled(valid)
        if valid:
            d = self._dataset.dialogues[row]
            self.system.setText(d.system or "")
            for user, answer in d.turns:
                r = self.turns.rowCount()
                self.turns.insertRow(r)
                self.turns.setItem(r, 0, QTableWidgetItem(user))
                self.turns.setItem(r, 1, QTableWidgetItem(answer))
            self.turns.resizeRowsToContents()
        else:
            self.system.setText("")
        self._loading = False
        self._highlight()
        self._update_buttons()

    def _refresh_summary(self, row: int) -> None:
        self.dialogues.item(row).setText(self._summary(self._dataset.dialogues[row]))

    def _on_system_edited(self, text: str) -> None:
        row = self._current_dialogue()
        if row >= 0:
            self._dataset.dialogues[row].system = text if text.strip() else None
            self._edited()

    def _on_turn_edited(self, item: QTableWidgetItem) -> None:
        row = self._current_dialogue()
        if self._loading or row < 0:
            return
        d = self._dataset.dialogues[row]
        t = item.row()
        if 0 <= t < len(d.turns):
            user, answer = d.turns[t]
            d.turns[t] = (item.text(), answer) if item.column() == 0 else (user, item.text())
            self._refresh_summary(row)
            self._edited()

    def add_turn(self) -> None:
        row = self._current_dialogue()
        if row < 0:
            return
        self._dataset.dialogues[row].turns.append(("New question?", "New answer."))
        self._show_dialogue(row)
        self._refresh_summary(row)
        self.turns.setCurrentCell(self.turns.rowCount() - 1, 0)
        self._edited()

    def remove_turn(self) -> None:
        row, t = self._current_dialogue(), self.turns.currentRow()
        if row >= 0 and 0 <= t < len(self._dataset.dialogues[row].turns):
            del self._dataset.dialogues[row].turns[t]
            self._show_dialogue(row)
            self._refresh_summary(row)
            self._edited()

    def _move_turn(self, delta: int) -> None:
        row, t = self._current_dialogue(), self.turns.currentRow()
        if row < 0:
            return
        turns = self._dataset.dialogues[row].turns
        if 0 <= t < len(turns) and 0 <= t + delta < len(turns):
            turns[t], turns[t + delta] = turns[t + delta], turns[t]
            self._show_dialogue(row)
            self._refresh_summary(row)
            self.turns.setCurrentCell(t + delta, 0)
            self._edited()

    # ----------------------------------------------------------------------------- search
    def _apply_filter(self) -> None:
        needle = self.search.text().strip().lower()
        for i, f in enumerate(self._dataset.facts):
            self.facts.item(i).setHidden(bool(needle) and needle not in f.lower())
        for i, d in enumerate(self._dataset.dialogues):
            text = " ".join([d.system or ""] + [u + " " + a for u, a in d.turns]).lower()
            self.dialogues.item(i).setHidden(bool(needle) and needle not in text)
        self._drop_hidden_selection()
        self._update_buttons()

    def _drop_hidden_selection(self) -> None:
        """A selected entry that the search hides is deselected (and the dialogue editor emptied), so
        Remove / Up / Down never act on an entry the user cannot see."""
        for view in (self.facts, self.dialogues):
            row = view.currentRow()
            if row >= 0 and view.item(row).isHidden():
                view.setCurrentRow(-1)
                view.clearSelection()
        if self.turns.isEnabled() and self._current_dialogue() < 0:
            self._show_dialogue(-1)

    def _update_buttons(self) -> None:
        """Remove / Up / Down only for a selected, visible entry with a visible neighbour that way."""
        for view, remove, up, down in ((self.facts, self.fact_remove, self.fact_up, self.fact_down),
                                       (self.dialogues, self.dialogue_remove, self.dialogue_up,
                                        self.dialogue_down)):
            row = _selected_row(view)
            remove.setEnabled(row >= 0)
            up.setEnabled(row >= 0 and _visible_neighbour(view, row, -1) >= 0)
            down.setEnabled(row >= 0 and _visible_neighbour(view, row, 1) >= 0)
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
        self._problems = self._dataset.validate()
        self._problems += [p for p in self._too_long
                           if (p.kind == "fact" and p.index < len(self._dataset.facts))
                           or (p.kind == "dialogue" and p.index < len(self._dataset.dialogues))]
        self.problem_list.clear()
        for p in self._problems:
            it = QListWidgetItem(f"⚠ {p}")
            it.setData(Qt.ItemDataRole.UserRole, (p.kind, p.index, p.turn))
            self.problem_list.addItem(it)
        if not self._dataset.facts and not self._dataset.dialogues:
            self.problem_list.addItem(QListWidgetItem("⚠ The dataset is empty: add facts or dialogues."))
        elif not self._problems:
            self.problem_list.addItem(QListWidgetItem("No problems found."))
        self._highlight()

    def _highlight(self) -> None:
        bad_facts = {p.index: p for p in self._problems if p.kind == "fact"}
        bad_dlg: dict[int, list] = {}
        for p in self._problems:
            if p.kind == "dialogue":
                bad_dlg.setdefault(p.index, []).append(p)
        was_loading, self._loading = self._loading, True
        for i in range(self.facts.count()):
            p = bad_facts.get(i)
            _mark(self.facts.item(i), bool(p), str(p) if p else "")
        for i in range(self.dialogues.count()):
            ps = bad_dlg.get(i)
            _mark(self.dialogues.item(i), bool(ps), "\n".join(map(str, ps)) if ps else "")
        cur = self._current_dialogue()
        bad_turns = {p.turn for p in bad_dlg.get(cur, []) if p.turn is not None}
        for r in range(self.turns.rowCount()):
            for c in range(2):
                it = self.turns.item(r, c)
                if it is not None:
                    _mark(it, r in bad_turns, None)
        self._loading = was_loading

    def _goto_problem(self, item: QListWidgetItem) -> None:
        where = item.data(Qt.ItemDataRole.UserRole)
        if not where:
            return
        kind, index, turn = where
        self.search.clear()
        if kind == "fact" and index < self.facts.count():
            self.facts.setCurrentRow(index)
            self.facts.scrollToItem(self.facts.item(index))
            self.facts.setFocus()
        elif kind == "dialogue" and index < self.dialogues.count():
            self.dialogues.setCurrentRow(index)
            self.dialogues.scrollToItem(self.dialogues.item(index))
            if turn is not None and turn < self.turns.rowCount():
                self.turns.setCurrentCell(turn, 0)

    # ----------------------------------------------------------------------------- counts
    def _start_stats(self) -> None:
        if self._stats_worker is not None and self._stats_worker.isRunning():
            self._stats_pending = True
            return
        self._stats_pending = False
        ds = self.dataset_copy()
        if not ds.facts and not ds.dialogues:
            self.stats_label.setText("0 facts, 0 dialogues.")
            return
        w = CallWorker(_stats, ds, self._vocab_size, self._context_length)
        w.done.connect(self._on_stats)
        w.failed.connect(self._on_stats_failed)
        w.finished.connect(self._on_stats_finished)
        self._stats_worker = w
        w.start()

    def _on_stats(self, s: dict) -> None:
        from core.dataset import EntryProblem

        n_turns = sum(len(d.turns) for d in self._dataset.dialogues)
        self.stats_label.setText(
            f"{len(self._dataset.facts)} facts, {len(self._dataset.dialogues)} dialogues ({n_turns} turns) · "
            f"{s['fact_tokens'] + s['dialogue_tokens']:,} tokens ({s['fact_tokens']:,} in facts, "
            f"{s['dialogue_tokens']:,} in dialogues) · {s['fact_sequences'] + s['dialogue_sequences']} training "
            f"sequences · longest entry {s['longest']} tokens (context {self._context_length}) · "
            f"vocabulary {s['vocab_size']} tokens")
        self._too_long = [EntryProblem(k, i, t, m) for k, i, t, m in s["too_long"]]
        self.validate_now()

    def _on_stats_failed(self, kind: str, message: str) -> None:
        self.stats_label.setText(f"Token counts unavailable: {message}")

    def _on_stats_finished(self) -> None:
        if self._stats_pending:
            self._start_stats()

    def stop(self) -> None:
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
            why = f"; {len(problems)} entries could not be read, e.g. {problems[0]}" if problems else ""
            raise DatasetError(f"{path}: no facts or dialogues found{why}. The dataset was not changed.")
        if replace:
            self.set_dataset(ds)
        else:
            self._dataset.facts.extend(ds.facts)
            self._dataset.dialogues.extend(ds.dialogues)
            self.set_dataset(self._dataset)
        self.changed.emit()
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
            dialogs.inform(self, "Import", f"{len(problems)} entries were skipped:\n"
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
            self.set_dataset(default_dataset())
            self.changed.emit()
