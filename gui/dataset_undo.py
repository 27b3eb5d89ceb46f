"""Undo and redo of dataset edits (Edit ▸ Undo, Ctrl+Z; Edit ▸ Redo, Ctrl+Shift+Z).

Every change made through the Dataset tab's models (an edited fact or turn, an added, removed or
moved entry or turn) and through the tab (a system message, an import, a reset) is recorded as a
pair of functions, ``undo`` and ``redo``, on one :class:`QUndoStack`. The change itself has already
been made when it is recorded, so a command's first ``redo`` (which ``QUndoStack.push`` calls) does
nothing. While a command runs, :meth:`EditHistory.record` ignores the changes it makes itself.
Opening another project clears the stack.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from PySide6.QtGui import QUndoCommand, QUndoStack
from PySide6.QtCore import QObject

_MERGE_ID = 1


class _Edit(QUndoCommand):
    def __init__(self, history: "EditHistory", text: str, undo: Callable[[], None], redo: Callable[[], None],
                 merge_key: Hashable | None = None) -> None:
        super().__init__(text)
        self._history, self._undo, self._redo, self.merge_key = history, undo, redo, merge_key
        self._done = True  # made before it was recorded

    def redo(self) -> None:
        if self._done:
            self._done = False
            return
        with self._history.replaying():
            self._redo()

    def undo(self) -> None:
        with self._history.replaying():
            self._undo()

    def id(self) -> int:  # noqa: A003 - Qt API
        return _MERGE_ID if self.merge_key is not None else -1

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt API
        """Typing into one field is one step: keep this command's undo, take the newer redo."""
        if not isinstance(other, _Edit) or other.merge_key is None or other.merge_key != self.merge_key:
            return False
        self._redo = other._redo
        return True


class EditHistory(QObject):
    """The dataset's undo stack (``self.stack``), fed by :meth:`record`."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.stack = QUndoStack(self)
        self._replaying = 0

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """While a command undoes or redoes its change, the changes it makes are not recorded."""
        self._replaying += 1
        try:
            yield
        finally:
            self._replaying -= 1

    def record(self, text: str, undo: Callable[[], None], redo: Callable[[], None],
               merge_key: Hashable | None = None) -> None:
        """A change was just made: ``undo()`` takes it back, ``redo()`` makes it again; ``text`` names it
        in the Edit menu ("Undo remove fact"). Consecutive changes with the same ``merge_key`` are one
        step. Ignored while a command runs."""
        if self._replaying:
            return
        self.stack.push(_Edit(self, text, undo, redo, merge_key))

    def clear(self) -> None:
        """Forget every step (another project was opened)."""
        self.stack.clear()
