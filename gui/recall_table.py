"""The Training tab's recall table: one row per prompt a stage's recall check asked, on a Qt model.

The rows are plain records (:class:`RecallRow`) in a :class:`RecallModel` (``QAbstractTableModel``), shown
by a :class:`RecallView` (``QTableView``): 20,000 facts are 20,000 records, not 120,000 cell items.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QAbstractItemView, QGroupBox, QHeaderView, QLabel, QTableView, QVBoxLayout, QWidget

from gui.events import StageDone

OK_BRUSH, FAIL_BRUSH = QBrush(QColor(200, 240, 200)), QBrush(QColor(255, 205, 205))
HEADERS = ("Stage", "Kind", "Prompt", "Expected", "Model wrote", "OK")
TEXT_COLUMNS = (2, 3, 4)  # share the width; the short ones fit their contents
OK_COLUMN = HEADERS.index("OK")

Index = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class RecallRow:
    """One prompt of a recall check: the stage's saved key (a core.stages.Stage value), the kind ("fact",
    "dialogue", "chat", "heldout", "question"), the prompt, the expected and the generated text, and whether they match."""

    stage: str
    kind: str
    prompt: str
    expected: str
    got: str
    ok: bool

    @classmethod
    def from_saved(cls, row: list) -> RecallRow:
        """A row of the project's history (gui.history: ``[stage, kind, prompt, expected, got, ok]``)."""
        stage, kind, prompt, expected, got, ok = row
        return cls(str(stage), kind, prompt, expected, got, bool(ok))

    def saved(self) -> list:
        """The row as the project's history keeps it (the inverse of :meth:`from_saved`)."""
        return [self.stage, self.kind, self.prompt, self.expected, self.got, self.ok]

    def cells(self) -> tuple[str, ...]:
        """The six texts the table shows, in HEADERS order."""
        return self.stage, self.kind, self.prompt, self.expected, self.got, "yes" if self.ok else "no"


class RecallModel(QAbstractTableModel):
    """The rows of the recall table (read-only); the OK cell is green or red."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: list[RecallRow] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(HEADERS)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        row = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return row.cells()[index.column()]
        if role == Qt.ItemDataRole.BackgroundRole and index.column() == OK_COLUMN:
            return OK_BRUSH if row.ok else FAIL_BRUSH
        return None

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 - Qt API
                   role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return HEADERS[section]
        return None

    def add(self, rows: list[RecallRow]) -> None:
        """Append rows (one insert for a stage's whole check)."""
        if rows:
            self.beginInsertRows(QModelIndex(), len(self._rows), len(self._rows) + len(rows) - 1)
            self._rows.extend(rows)
            self.endInsertRows()

    def clear(self) -> None:
        self.beginResetModel()
        self._rows = []
        self.endResetModel()

    def rows(self) -> list[RecallRow]:
        """The rows in the order they were added."""
        return list(self._rows)


class RecallView(QTableView):
    """The table of a :class:`RecallModel`; ``rowCount()`` and ``cell(row, column)`` read what it shows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setModel(RecallModel(self))
        header = self.horizontalHeader()
        for c in range(len(HEADERS)):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch if c in TEXT_COLUMNS
                                        else QHeaderView.ResizeMode.ResizeToContents)
        self.verticalHeader().setVisible(False)
        self.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)  # no row is measured
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setWordWrap(False)

    def rowCount(self) -> int:  # noqa: N802 - as QTableWidget names it
        return self.model().rowCount()

    def cell(self, row: int, column: int) -> str:
        """The text shown at ``row``, ``column``."""
        return self.model().index(row, column).data()


SAMPLED_NOUN = {"fact": "facts", "dialogue": "dialogue answers", "chat": "answers in a conversation",
                "heldout": "held-out questions", "question": "written questions"}
RECALL_HINT = "Shown when a stage ends: which facts and dialogue answers the model reproduces."


def stage_rows(d: StageDone) -> list[RecallRow]:
    """The recall table's rows of a stage's recall check."""
    return [RecallRow(str(d.stage), r.kind, r.prompt, r.expected, r.got, bool(r.ok)) for r in d.recall]


def stage_summary(d: StageDone) -> str:
    """"After pretrain: 3 of 4 facts and 1 of 2 dialogue answers reproduced exactly." (with the samples)."""
    f_ok, f_n = d.facts_recalled
    g_ok, g_n = d.dialogues_recalled
    q_ok, q_n = d.questions_recalled
    some = "".join(f" Checked a sample of the {SAMPLED_NOUN.get(k, k)}: {c:,} of {n:,}." for k, c, n in d.sampled)
    written = f" {q_ok} of {q_n} questions written for facts answered exactly." if q_n else ""
    return (f"After {d.stage}: {f_ok} of {f_n} facts and {g_ok} of {g_n} dialogue answers reproduced exactly."
            f"{written}{some}")


class RecallBox(QGroupBox):
    """"Recall after each stage": the summary lines (``label``) over the table (``view``); ``extra`` (the
    before/after comparison) below them."""

    def __init__(self, extra: QWidget, parent: QWidget | None = None) -> None:
        super().__init__("Recall after each stage", parent)
        lay = QVBoxLayout(self)
        self.label = QLabel(RECALL_HINT)
        self.label.setWordWrap(True)
        lay.addWidget(self.label)
        self.view = RecallView()
        lay.addWidget(self.view, 1)
        lay.addWidget(extra)

    def clear(self, hint: str = RECALL_HINT) -> None:
        self.view.model().clear()
        self.label.setText(hint)

    def add(self, rows: list[RecallRow]) -> None:
        self.view.model().add(rows)

    def add_summary(self, text: str) -> None:
        """A stage's summary line, under those of the run's earlier stages."""
        prev = self.label.text()
        self.label.setText(prev + "\n" + text if prev.startswith("After") else text)
