"""The Dataset tab's files: reading a file to import, writing one in the format its name says, and the
Import / Export / Reset buttons with their file dialogs."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QMenu, QToolButton, QWidget

from core.dataset import Dataset, DatasetError, export_jsonl, export_text, load_dataset, save_dataset
from core.wording import count_words, were
from gui import dialogs
from gui.dataset_views import small_button

FILE_FILTER = "Datasets (*.json *.txt *.jsonl);;All files (*)"
UNCHANGED = "The dataset was not changed."
PROBLEMS_SHOWN, NOTES_SHOWN = 20, 10
"""Lines of skipped entries and of notes an import's message shows (then "… and N more")."""
SAVE_FILTERS = {"App JSON (*.json)": ".json", "Plain text (*.txt)": ".txt", "Chat JSONL (*.jsonl)": ".jsonl"}


def read_import(path: str | Path) -> tuple[Dataset, list[str], list[str]]:
    """A dataset file (any core format), the problems found (skipped entries) and the notes on how it was read
    (core.dataset.load_dataset's: a name given twice in an object, a file read as plain text).

    Raises:
        core.dataset.DatasetError, OSError: the file cannot be read at all, or holds no entry.
    """
    notes: list[str] = []
    ds, problems = load_dataset(path, notes)
    if not ds.facts and not ds.dialogues:  # the notes may say why (a list given twice, the second one empty)
        why = f"; {count_words(len(problems), 'entry')} could not be read, e.g. {problems[0]}" if problems else ""
        said = f"\n{_first(notes, NOTES_SHOWN)}" if notes else ""
        raise DatasetError(f"{path}: no facts or dialogues found{why}. {UNCHANGED}{said}")
    return ds, [str(p) for p in problems], notes


def import_message(problems: list[str], notes: list[str]) -> str:
    """What an import tells the user: the entries skipped (the first :data:`PROBLEMS_SHOWN`) and the notes (the first
    :data:`NOTES_SHOWN`), each list's length said; "" when neither."""
    parts = []
    if problems:
        parts.append(f"{count_words(len(problems), 'entry')} {were(len(problems))} skipped:\n"
                     + _first(problems, PROBLEMS_SHOWN))
    if notes:
        parts.append(_first(notes, NOTES_SHOWN))
    return "\n\n".join(parts)


def _first(lines: list[str], n: int) -> str:
    """The first ``n`` of ``lines`` and how many more there are (a message box taller than the screen hides its
    buttons: 500 repeated names made one 14,056 pixels tall)."""
    return "\n".join(lines[:n]) + (f"\n… and {len(lines) - n} more" if len(lines) > n else "")


def write_dataset(dataset: Dataset, path: str | Path) -> None:
    """Write ``dataset``; the format follows the extension (.txt, .jsonl, else JSON). Raises OSError."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext == ".txt":
        export_text(dataset, path)
    elif ext == ".jsonl":
        export_jsonl(dataset, path)
    else:
        save_dataset(dataset, path)


class DatasetFileButtons(QHBoxLayout):
    """Import (replace or append), Export…, Reset to example; the dialogs they open.

    Args:
        parent: the widget the dialogs belong to.
        import_file: ``import_file(path, replace)`` returning (skipped entries, notes) (raises OSError/ValueError).
        export_file: ``export_file(path)`` (raises OSError).
        reset: replaces the dataset with the built-in example.
    """

    def __init__(self, parent: QWidget, import_file: Callable[..., tuple[list[str], list[str]]],
                 export_file: Callable[[str], None], reset: Callable[[], None]) -> None:
        super().__init__()
        self._parent, self._import, self._export, self._reset = parent, import_file, export_file, reset
        self.import_button = QToolButton()
        self.import_button.setText("Import")
        self.import_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.import_button)
        menu.addAction("Replace with a file…", lambda: self.import_dialog(replace=True))
        menu.addAction("Append a file…", lambda: self.import_dialog(replace=False))
        self.import_button.setMenu(menu)
        self.addWidget(self.import_button)
        self.addWidget(small_button("Export…", "Save as the app's JSON, plain text or chat JSONL", self.export_dialog))
        self.addWidget(small_button("Reset to example", "Replace everything with the built-in example dataset",
                                    self.reset_dialog))

    def import_dialog(self, replace: bool) -> None:
        path, _ = QFileDialog.getOpenFileName(self._parent, "Import a dataset", "", FILE_FILTER)
        if not path:
            return
        try:
            problems, notes = self._import(path, replace=replace)
        except OSError as e:  # the file vanished or is not readable: its name and why, not Python's repr
            dialogs.warn(self._parent, "Import failed", f"{e.filename or path}: {e.strerror or e}. {UNCHANGED}")
            return
        except ValueError as e:  # (a broken JSON file's message did not say that nothing changed)
            said = str(e)
            dialogs.warn(self._parent, "Import failed", said if UNCHANGED in said else f"{said.rstrip('.')}. {UNCHANGED}")
            return
        if message := import_message(problems, notes):
            dialogs.inform(self._parent, "Import", message)

    def export_dialog(self) -> None:
        path, chosen = QFileDialog.getSaveFileName(self._parent, "Export the dataset", "dataset.json",
                                                   ";;".join(SAVE_FILTERS))
        if not path:
            return
        if not Path(path).suffix:
            path += SAVE_FILTERS.get(chosen, ".json")
        try:
            self._export(path)
        except OSError as e:
            dialogs.warn(self._parent, "Export failed", str(e))

    def reset_dialog(self) -> None:
        if dialogs.ask(self._parent, "Reset dataset", "Replace the whole dataset with the built-in example?",
                       yes="Replace"):
            self._reset()
