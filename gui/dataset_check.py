"""The Dataset tab's "Check" box: the problems of the dataset (core validation, 250 ms after the last edit)
and its token counts (core.estimates.dataset_stats on a copy, in a thread or for a large dataset a child
process: gui.workers.call_worker, 700 ms after the last edit,
only while the tab is shown)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGroupBox, QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from core.config import ModelConfig
from core.dataset import Dataset
from core.estimates import DatasetStats, dataset_stats
from core.wording import count_words
from gui.workers import CallWorker, ChildCallWorker, call_worker

if TYPE_CHECKING:
    from PySide6.QtGui import QShowEvent

MAX_LISTED_PROBLEMS = 500  # a list item per problem: 20,000 items would make every check slow


def stats_text(dataset: Dataset, s: DatasetStats, context_length: int) -> str:
    """The counts line: entries, turns, tokens, training sequences, the longest entry, the vocabulary."""
    n_turns = sum(len(d.turns) for d in dataset.dialogues)
    return (f"{count_words(len(dataset.facts), 'fact')}, {count_words(len(dataset.dialogues), 'dialogue')} "
            f"({count_words(n_turns, 'turn')}) · "
            f"{s.fact_tokens + s.dialogue_tokens:,} tokens ({s.fact_tokens:,} in facts, "
            f"{s.dialogue_tokens:,} in dialogues) · "
            f"{count_words(s.fact_sequences + s.dialogue_sequences, 'training sequence')} · longest entry "
            f"{count_words(s.longest, 'token')} (context {context_length}) · vocabulary {s.vocab_size} tokens")


def _entry_key(dataset: Dataset, kind: str, index: int) -> object:
    """What entry ``index`` of ``kind`` (``"fact"`` / ``"dialogue"``) holds now, as a value that a later edit
    of it changes (None past the end)."""
    if kind == "fact":
        return dataset.facts[index] if index < len(dataset.facts) else None
    d = dataset.dialogues[index] if index < len(dataset.dialogues) else None
    return None if d is None else (d.system, tuple(tuple(t) for t in d.turns))


class DatasetCheck(QGroupBox):
    """``stats_label`` (the counts) over ``problem_list`` (the first MAX_LISTED_PROBLEMS problems).

    Args:
        dataset: the dataset being edited (the live object).
        copy: an independent copy of it (for the counting thread).
        highlight: called with every problem after each check (the tab marks the rows).
        goto: called with the problem list's item the user clicked (its UserRole data: (kind, index, turn)).
    """

    def __init__(self, dataset: Callable[[], Dataset], copy: Callable[[], Dataset],
                 highlight: Callable[[list], None], goto: Callable[[QListWidgetItem], None],
                 parent: QWidget | None = None) -> None:
        super().__init__("Check", parent)
        self._dataset, self._copy, self._highlight = dataset, copy, highlight
        self.vocab_size, self.context_length = ModelConfig.vocab_size, ModelConfig.context_length  # the defaults
        self._problems: list = []  # core.dataset.EntryProblem + too-long problems from the stats
        self._too_long: list = []  # (too-long problem of the last count, its entry as counted: _entry_key)
        self.stats_worker: CallWorker | None = None
        self.stats_delivered: CallWorker | None = None  # the last worker whose signals have all been handled
        self._stats_pending = False
        self._generation = 0  # counts the edits (and limits) so far: a count of an older one is stale
        self._stopped = False
        self.validate_timer = QTimer(self, singleShot=True, interval=250)
        self.validate_timer.timeout.connect(self.validate_now)
        self.stats_timer = QTimer(self, singleShot=True, interval=700)
        self.stats_timer.timeout.connect(self.start_stats)
        lay = QVBoxLayout(self)
        self.stats_label = QLabel("")
        self.stats_label.setWordWrap(True)
        lay.addWidget(self.stats_label)
        self.problem_list = QListWidget()
        self.problem_list.setMaximumHeight(110)
        self.problem_list.setUniformItemSizes(True)
        self.problem_list.itemActivated.connect(goto)
        self.problem_list.itemClicked.connect(goto)
        lay.addWidget(self.problem_list)

    def problems(self) -> list:
        """Current problems (EntryProblem-like objects with kind, index, turn, message)."""
        return list(self._problems)

    def set_limits(self, vocab_size: int, context_length: int) -> None:
        """Vocabulary size and context length used for token counts and the too-long check."""
        if (vocab_size, context_length) != (self.vocab_size, self.context_length):
            self.vocab_size, self.context_length = vocab_size, context_length
            self._generation += 1
            self.stats_timer.start()

    def edited(self) -> None:
        """Something changed: check again soon, count tokens again later (both are restarted by every
        keystroke-sized edit, so typing never waits for them)."""
        self._generation += 1
        self.validate_timer.start()
        self.stats_timer.start()

    def replaced(self) -> None:
        """A new dataset: its too-long entries are not known yet; check now, count soon."""
        self._generation += 1
        self._too_long = []
        self.validate_now()
        self.stats_timer.start()

    def validate_now(self) -> None:
        """Run core validation, list the problems and have every entry at fault highlighted."""
        self.validate_timer.stop()
        ds = self._dataset()
        self._problems = ds.validate()
        # an entry edited (or moved) since the count loses its mark until the next count
        self._problems += [p for p, key in self._too_long if _entry_key(ds, p.kind, p.index) == key]
        self.problem_list.clear()
        for p in self._problems[:MAX_LISTED_PROBLEMS]:
            it = QListWidgetItem(f"⚠ {p}")
            it.setData(Qt.ItemDataRole.UserRole, (p.kind, p.index, p.turn))
            self.problem_list.addItem(it)
        if len(self._problems) > MAX_LISTED_PROBLEMS:  # all are highlighted in the lists all the same
            self.problem_list.addItem(QListWidgetItem(f"… and {len(self._problems) - MAX_LISTED_PROBLEMS:,} more "
                                                      "problems (fix these first)"))
        if not ds.facts and not ds.dialogues:
            self.problem_list.addItem(QListWidgetItem("⚠ The dataset is empty: add facts or dialogues."))
        elif not self._problems:
            self.problem_list.addItem(QListWidgetItem("No problems found."))
        self._highlight(self._problems)

    def start_stats(self) -> None:
        """Count tokens in a worker (a child process for a large dataset: its own GIL), on a snapshot of the
        dataset. Lazy: edits only restart the timer that calls this, and a hidden tab waits until it is shown.
        A count still running counts a dataset edited since: in a child it is ended now (the new count starts
        when it has gone, within 50 ms), in a thread (under 2,000 entries, a fraction of a second) it finishes
        first. A count of a dataset edited (or replaced, or of other limits) after it started is never shown."""
        if self._stopped:
            return
        if self.stats_worker is not None and self.stats_worker.isRunning():
            self._stats_pending = True
            if isinstance(self.stats_worker, ChildCallWorker) and self.stats_worker.generation != self._generation:
                self.stats_worker.request_stop()
            return
        if not self.isVisible():
            self._stats_pending = True
            return
        self._stats_pending = False
        ds = self._copy()
        if not ds.facts and not ds.dialogues:
            self.stats_label.setText("0 facts, 0 dialogues.")
            return
        w = call_worker(dataset_stats, ds, self.vocab_size, self.context_length,
                        entries=len(ds.facts) + len(ds.dialogues))
        w.generation = self._generation  # what it counts (its signals may arrive after the next one started)
        w.connect_slots(done=self._on_stats, failed=self._on_stats_failed, finished=self._on_stats_finished)
        self.stats_worker = w
        w.start()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        if self._stats_pending and not self.stats_timer.isActive():
            self.stats_timer.start()

    def _on_stats(self, s: DatasetStats) -> None:
        if not self._counted_now():  # counted before an edit: the next count replaces it
            return
        self.stats_label.setText(stats_text(self._dataset(), s, self.context_length))
        ds = self._dataset()  # as counted: no edit since (_counted_now)
        self._too_long = [(p, _entry_key(ds, p.kind, p.index)) for p in s.too_long]
        self.validate_now()

    def _on_stats_failed(self, kind: str, message: str) -> None:
        if not self._counted_now():  # as in _on_stats
            return
        self.stats_label.setText(f"Token counts unavailable: {message}")

    def _counted_now(self) -> bool:
        """Whether the worker whose signal is being handled counted the dataset as it is now (no edit, new
        dataset or new limits since it started)."""
        return getattr(self.sender(), "generation", None) == self._generation

    def _on_stats_finished(self) -> None:
        self.stats_delivered = self.sender()  # its result (queued before this) has been handled
        if self._stats_pending:
            self.start_stats()

    def stop(self) -> None:
        """Stop the timers and the counting worker for good (the window closes)."""
        self._stopped = True
        for t in (self.validate_timer, self.stats_timer):
            t.stop()
        if self.stats_worker is not None:
            self.stats_worker.request_stop()
            self.stats_worker.wait()
