"""Qt models over a :class:`core.dataset.Dataset` for the Dataset tab (napari-style model/view).

- :class:`FactsModel` — one row per fact, edited in place (``setData`` writes ``dataset.facts``);
- :class:`DialoguesModel` — one row per dialogue, shown as a one-line summary;
- :class:`TurnsModel` — the (user, assistant) turns of one dialogue, two editable columns;
- :class:`SearchProxy` — the search: a row stays when the needle is in its text (case-insensitive).

The models hold no copy: they read and write the dataset's own lists, and a view asks only for the
rows it draws, so 20,000 facts cost nothing until they are scrolled to. Each model emits
``edited`` after a change made through it (an edit, an added, removed or moved row); problems found
by validation are shown with :meth:`set_problems` (background and tooltip of the rows at fault).

Each change made through a model is recorded on its ``history`` (gui.dataset_undo.EditHistory, set
by the tab) with the functions that take it back and make it again. An empty text shows a grey
placeholder ("type the question"); the placeholder is never the entry's content.
"""
from __future__ import annotations

from PySide6.QtCore import (QAbstractListModel, QAbstractTableModel, QModelIndex, QObject, QSortFilterProxyModel, Qt,
                            Signal)
from PySide6.QtGui import QBrush, QColor

from core.dataset import Dialogue

BAD = QBrush(QColor(255, 205, 205))  # background of an entry at fault
PLACEHOLDER = QBrush(QColor(140, 140, 140))  # text colour of an empty cell's hint
NEW_TURN = ("", "")  # a new turn is empty (the checker says so until it is typed), not placeholder text
FACT_HINT = "(empty fact: type it here)"
TURN_HINTS = ("(type the question)", "(type the answer)")
_ROLE = Qt.ItemDataRole
SEARCH_ROLE = _ROLE.UserRole  # the lower-case text a search looks in (_EntryModel.search_text)


def dialogue_summary(d: Dialogue) -> str:
    """One line for the dialogue list: the first question and how many turns follow."""
    if not d.turns:
        return "(no turns)"
    first = d.turns[0][0].strip() or "(empty question)"
    n_more = len(d.turns) - 1
    more = f"  (+{n_more} turn{'s' if n_more > 1 else ''})" if n_more else ""
    return f"User: {first}{more}"


def dialogue_search_text(d: Dialogue) -> str:
    """What the search looks in: the system message and every turn, lower case."""
    return " ".join([d.system or ""] + [u + " " + a for u, a in d.turns]).lower()


def _editable(flags, index):
    """``flags`` of a model's cell plus ItemIsEditable (for every real cell)."""
    return flags | Qt.ItemFlag.ItemIsEditable if index.isValid() else flags


def _is_text_edit(index, value, role) -> bool:
    """A ``setData`` call that edits a cell's text (views pass str for EditRole)."""
    return role == _ROLE.EditRole and index.isValid() and isinstance(value, str)


class _EntryModel(QAbstractListModel):
    """A list model over ``self._rows`` (a list owned by the dataset) with problem marks per row."""

    edited = Signal()  # the dataset was changed through this model
    touched = Signal(int)  # (source row): an undo or redo changed this row (the tab selects it)
    NOUN = "entry"  # in the Edit menu: "Undo remove fact"
    HINT = ""  # shown (grey) for an empty row

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._rows: list = []
        self._bad: dict[int, str] = {}  # row -> problem text (tooltip)
        self.history = None  # gui.dataset_undo.EditHistory that records changes made through the model

    def _record(self, text: str, undo, redo, merge_key=None) -> None:
        if self.history is not None:
            self.history.record(text, undo, redo, merge_key)

    def _then_touch(self, fn, row: int):
        """``fn`` followed by ``touched(row)`` (for an undo or redo)."""
        def run():
            fn()
            self.touched.emit(row)
        return run

    # -- Qt API
    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: QModelIndex, role: int = _ROLE.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        row = index.row()
        if role == _ROLE.DisplayRole:
            text = self.text(row)
            return text if text.strip() or not self.HINT else self.HINT
        if role == _ROLE.EditRole:
            return self.text(row)
        if role == _ROLE.ForegroundRole:
            return PLACEHOLDER if self.HINT and not self.text(row).strip() else None
        if role == _ROLE.BackgroundRole:
            return BAD if row in self._bad else None
        if role == _ROLE.ToolTipRole:
            return self._bad.get(row, self.tooltip(row))
        if role == SEARCH_ROLE:
            return self.search_text(row)
        return None

    # -- for the tab
    def text(self, row: int) -> str:
        """What the row shows."""
        raise NotImplementedError

    def search_text(self, row: int) -> str:
        """Lower-case text the search looks in."""
        raise NotImplementedError

    def tooltip(self, row: int) -> str | None:
        """Tooltip of a row without a problem."""
        return None

    def reset(self, rows: list) -> None:
        """Show ``rows`` (the dataset's own list, not a copy)."""
        self.beginResetModel()
        self._rows, self._bad = rows, {}
        self.endResetModel()

    def insert(self, row: int, value) -> None:
        """Insert ``value`` (a fact or a Dialogue) before ``row``."""
        self.beginInsertRows(QModelIndex(), row, row)
        self._rows.insert(row, value)
        self.endInsertRows()
        self._bad = {r + (r >= row): p for r, p in self._bad.items()}
        self.edited.emit()
        self._record(f"add {self.NOUN}", lambda: self.remove(row),
                     self._then_touch(lambda: self.insert(row, value), row))

    def remove(self, row: int) -> None:
        """Delete ``row`` (later marks move up with their rows)."""
        value = self._rows[row]
        self.beginRemoveRows(QModelIndex(), row, row)
        del self._rows[row]
        self.endRemoveRows()
        self._bad = {r - (r > row): p for r, p in self._bad.items() if r != row}
        self.edited.emit()
        self._record(f"remove {self.NOUN}", self._then_touch(lambda: self.insert(row, value), row),
                     lambda: self.remove(row))

    def swap(self, a: int, b: int) -> None:
        """Exchange rows ``a`` and ``b`` (any two rows: a search may hide the ones between)."""
        rows = self._rows
        rows[a], rows[b] = rows[b], rows[a]
        for r in (a, b):  # one index each: an open editor on either row shows its new text
            self.dataChanged.emit(self.index(r), self.index(r))
        self.edited.emit()
        self._record(f"move {self.NOUN}", self._then_touch(lambda: self.swap(a, b), a),
                     self._then_touch(lambda: self.swap(a, b), b))

    def refresh(self, row: int) -> None:
        """Row ``row`` changed outside the model (a dialogue's turns): redraw it."""
        self.dataChanged.emit(self.index(row), self.index(row))

    def set_problems(self, bad: dict[int, str]) -> None:
        """Mark the rows at fault (row -> problem text). Only rows whose mark changes are redrawn: a
        change signal for a row being edited would reset its editor (the user's typing and selection)."""
        old, self._bad = self._bad, {r: p for r, p in bad.items() if 0 <= r < len(self._rows)}
        changed = sorted(r for r in old.keys() | self._bad.keys() if old.get(r) != self._bad.get(r))
        roles = [_ROLE.BackgroundRole, _ROLE.ToolTipRole]
        if len(changed) > 64:  # one signal for many rows (a range never resets an editor either)
            self.dataChanged.emit(self.index(changed[0]), self.index(changed[-1]), roles)
            return
        for r in changed:
            self.dataChanged.emit(self.index(r), self.index(r), roles)


class FactsModel(_EntryModel):
    """``dataset.facts``, one editable row each."""

    NOUN = "fact"
    HINT = FACT_HINT

    def text(self, row: int) -> str:
        return self._rows[row]

    def search_text(self, row: int) -> str:
        return self._rows[row].lower()

    def tooltip(self, row: int) -> str | None:
        """The whole fact: a row shows one line of it."""
        return self._rows[row] or None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        return _editable(super().flags(index), index)

    def setData(self, index: QModelIndex, value: object, role: int = _ROLE.EditRole) -> bool:  # noqa: N802 - Qt API
        if not _is_text_edit(index, value, role):
            return False
        row = index.row()
        old = self._rows[row]
        if old != value:
            self._set(row, value)
            # the editor writes while the text is typed (gui.dataset_tab.LiveTextDelegate): one step
            self._record("edit fact", self._then_touch(lambda: self._set(row, old), row),
                         self._then_touch(lambda: self._set(row, value), row), merge_key=("fact", id(self), row))
        return True

    def _set(self, row: int, value: str) -> None:
        self._rows[row] = value
        self.dataChanged.emit(self.index(row), self.index(row))
        self.edited.emit()


class DialoguesModel(_EntryModel):
    """``dataset.dialogues``, one summary row each (edited through :class:`TurnsModel`)."""

    NOUN = "dialogue"

    def text(self, row: int) -> str:
        return dialogue_summary(self._rows[row])

    def search_text(self, row: int) -> str:
        return dialogue_search_text(self._rows[row])


class TurnsModel(QAbstractTableModel):
    """The turns of one dialogue: column 0 the user's question, column 1 the assistant's answer."""

    edited = Signal()  # a turn was changed, added, removed or moved through this model
    HEADERS = ("User", "Assistant")

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._dialogue: Dialogue | None = None
        self._bad: set[int] = set()
        self.history = None  # gui.dataset_undo.EditHistory
        self.show_dialogue = None  # (Dialogue) -> None: the tab puts it into the editor (for an undo)

    def _record(self, text: str, undo, redo, merge_key=None) -> None:
        """Record a change of the dialogue shown now; its undo and redo show that dialogue first."""
        if self.history is None:
            return
        d = self._dialogue

        def on_d(fn):
            def run():
                if self._dialogue is not d and self.show_dialogue is not None:
                    self.show_dialogue(d)
                if self._dialogue is d:
                    fn()
            return run
        self.history.record(text, on_d(undo), on_d(redo), merge_key)

    def set_dialogue(self, dialogue: Dialogue | None) -> None:
        """Show ``dialogue`` (edited in place) or nothing."""
        self.beginResetModel()
        self._dialogue, self._bad = dialogue, set()
        self.endResetModel()

    def dialogue(self) -> Dialogue | None:
        """The dialogue shown, or None."""
        return self._dialogue

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() or self._dialogue is None else len(self._dialogue.turns)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else 2

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = _ROLE.DisplayRole) -> object:  # noqa: N802 - Qt API
        if orientation == Qt.Orientation.Horizontal and role == _ROLE.DisplayRole and 0 <= section < 2:
            return self.HEADERS[section]
        return super().headerData(section, orientation, role)

    def data(self, index: QModelIndex, role: int = _ROLE.DisplayRole) -> object:
        if not index.isValid() or index.row() >= self.rowCount():
            return None
        text = self._dialogue.turns[index.row()][index.column()]
        if role == _ROLE.DisplayRole:
            return text if text.strip() else TURN_HINTS[index.column()]
        if role == _ROLE.EditRole:
            return text
        if role == _ROLE.ForegroundRole:
            return None if text.strip() else PLACEHOLDER
        if role == _ROLE.BackgroundRole:
            return BAD if index.row() in self._bad else None
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        return _editable(super().flags(index), index)

    def setData(self, index: QModelIndex, value: object, role: int = _ROLE.EditRole) -> bool:  # noqa: N802 - Qt API
        if not _is_text_edit(index, value, role):
            return False
        t, turns = index.row(), self._dialogue.turns
        user, answer = old = turns[t]
        new = (value, answer) if index.column() == 0 else (user, value)
        if new != old:
            self._set_turn(t, new)
            # written while typed (gui.dataset_tab.LiveTextDelegate): the writes of one cell are one step
            self._record("edit turn", lambda: self._set_turn(t, old), lambda: self._set_turn(t, new),
                         merge_key=("turn", id(self._dialogue), t, index.column()))
        return True

    def _set_turn(self, t: int, turn: tuple[str, str]) -> None:
        self._dialogue.turns[t] = turn
        self.dataChanged.emit(self.index(t, 0), self.index(t, 1))
        self.edited.emit()

    def add_turn(self, turn: tuple[str, str] = NEW_TURN, t: int | None = None) -> int:
        """Insert ``turn`` (default: an empty one) before turn ``t`` (default: at the end); returns its row."""
        t = len(self._dialogue.turns) if t is None else t
        self.beginInsertRows(QModelIndex(), t, t)
        self._dialogue.turns.insert(t, turn)
        self.endInsertRows()
        self._bad = {r + (r >= t) for r in self._bad}
        self.edited.emit()
        self._record("add turn", lambda: self.remove_turn(t), lambda: self.add_turn(turn, t))
        return t

    def remove_turn(self, t: int) -> None:
        """Delete turn ``t``."""
        turn = self._dialogue.turns[t]
        self.beginRemoveRows(QModelIndex(), t, t)
        del self._dialogue.turns[t]
        self.endRemoveRows()
        self._bad = {r - (r > t) for r in self._bad if r != t}
        self.edited.emit()
        self._record("remove turn", lambda: self.add_turn(turn, t), lambda: self.remove_turn(t))

    def swap_turns(self, a: int, b: int) -> None:
        """Exchange turns ``a`` and ``b``."""
        turns = self._dialogue.turns
        turns[a], turns[b] = turns[b], turns[a]
        for r in (a, b):
            self.dataChanged.emit(self.index(r, 0), self.index(r, 1))
        self.edited.emit()
        self._record("move turn", lambda: self.swap_turns(a, b), lambda: self.swap_turns(a, b))

    def set_bad_turns(self, bad: set[int]) -> None:
        """Mark the turns at fault; only rows whose mark changes are redrawn (see _EntryModel)."""
        old, self._bad = self._bad, set(bad)
        for r in sorted(old ^ self._bad):
            if r < self.rowCount():
                for c in (0, 1):  # one index each: a range signal is cheaper but resets nothing either
                    self.dataChanged.emit(self.index(r, c), self.index(r, c), [_ROLE.BackgroundRole])


class SearchProxy(QSortFilterProxyModel):
    """Keeps the rows whose :meth:`_EntryModel.search_text` (the model's ``SEARCH_ROLE``) contains the
    needle (lower case).

    Qt's own filter does the matching: with no needle it keeps every row without asking the model (a
    Python filterAcceptsRow was 22,000 calls into Python, each waiting for the GIL while a worker counts
    tokens: clearing a search then took seconds). The filter is applied when the needle changes, not
    on every edit (dynamic filtering is off), so an entry being edited never vanishes from under the cursor.
    """

    def __init__(self, source: _EntryModel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._needle = ""
        self.setDynamicSortFilter(False)
        self.setFilterRole(SEARCH_ROLE)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseSensitive)  # both sides are lower case
        self.setSourceModel(source)

    def set_needle(self, needle: str) -> None:
        needle = needle.strip().lower()
        if needle == self._needle:
            return
        self._needle = needle
        self.setFilterFixedString(needle)
