"""The Dataset tab's views: the facts and dialogues lists (behind a search), the turns table, the editor
that writes while typing, and a list's box with its Add / Remove / Up / Down buttons."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, QTimer
from PySide6.QtWidgets import (QAbstractItemView, QGroupBox, QHBoxLayout, QHeaderView, QLineEdit, QListView,
                               QPushButton, QStyledItemDelegate, QStyleOptionViewItem, QTableView, QVBoxLayout,
                               QWidget)

from gui.dataset_models import DialoguesModel, FactsModel, SearchProxy, TurnsModel


def small_button(text: str, tip: str, slot: Callable[[], object]) -> QPushButton:
    """A push button as wide as its text needs, with a tooltip, connected to ``slot``."""
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


class EntryListBox(QGroupBox):
    """A list of facts or dialogues (``view``) with Add, Remove, Up and Down under it.

    Args:
        title: the box's title ("": no frame, as a part of a larger box).
        noun: "fact" or "dialogue", for the tooltips and the status message of a removal.
        model: the list's model (FactsModel or DialoguesModel).
        add: the Add button's slot.
        message: shows a line in the status bar (AppState.message.emit).
        moved: called with the new row after Up / Down (the tab shows the moved entry).
    """

    def __init__(self, title: str, noun: str, model: FactsModel | DialoguesModel, add: Callable[[], object],
                 message: Callable[[str], object], moved: Callable[[int], object] | None = None) -> None:
        super().__init__(title)
        self._noun, self._message, self._moved = noun, message, moved
        self.model = model
        self.view = EntryListView(model)
        lay = QVBoxLayout(self)
        if not title:  # a part of a larger box
            self.setFlat(True)
            lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.view, 1)
        row = QHBoxLayout()
        row.addWidget(small_button("Add", f"Add a {noun}", add))
        self.remove_button = small_button("Remove", f"Remove the selected {noun}", self.remove)
        self.up_button = small_button("Up", f"Move the selected {noun} above the previous one shown",
                                      lambda: self.move(-1))
        self.down_button = small_button("Down", f"Move the selected {noun} below the next one shown",
                                        lambda: self.move(1))
        for b in (self.remove_button, self.up_button, self.down_button):
            row.addWidget(b)
        lay.addLayout(row)

    def remove(self) -> None:
        """Remove the selected entry (only one the search shows)."""
        row = self.view.currentRow()
        if row >= 0:
            self.model.remove(row)
            self._message(f"Removed {self._noun} {row + 1} — Edit ▸ Undo (Ctrl+Z) brings it back")

    def move(self, delta: int) -> None:
        """Swap the selected entry with the nearest one the search shows above (-1) or below (+1)."""
        row = self.view.currentRow()
        new = self.view.neighbour(row, delta) if row >= 0 else -1
        if new >= 0:
            self.model.swap(row, new)
            self.view.setCurrentRow(new)
            if self._moved is not None:
                self._moved(new)

    def update_buttons(self) -> None:
        """Remove / Up / Down only for a selected, visible entry with a visible neighbour that way."""
        row = self.view.currentRow()
        self.remove_button.setEnabled(row >= 0)
        self.up_button.setEnabled(row >= 0 and self.view.neighbour(row, -1) >= 0)
        self.down_button.setEnabled(row >= 0 and self.view.neighbour(row, 1) >= 0)
