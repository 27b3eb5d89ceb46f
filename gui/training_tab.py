"""Training tab: start / stop / resume, progress with ETA, live plots, log, recall table."""
from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QCheckBox, QFrame, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit,
                               QProgressBar, QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from core.plan import format_duration
from core.wording import count_words, memory_size
from gui import dialogs
from gui.app_state import AppState
from gui.events import Comparison, RecallChecking, RunDone, RunStarted, StageDone, TrainingStep
from gui.history import MAX_LOG_LINES, MAX_RUNS, earlier_run
from gui.plots import TrainingPlots
from gui.project import checkpoint_meta
from gui.widgets import ElidedLabel
from gui.workers import CompareWorker, TrainWorker

if TYPE_CHECKING:
    from core.config import TrainConfig

STAGE_NAMES = {"pretrain": "Stage 1: pretraining on facts", "tune": "Stage 2: tuning on dialogues"}
OK_BRUSH, FAIL_BRUSH = QBrush(QColor(200, 240, 200)), QBrush(QColor(255, 205, 205))
START_TIP = ("{what} with the current dataset and settings. A trained model this project already has stays until "
             "the new run finishes its first stage (and is kept if you stop earlier).")
RESUME_TIP = ("Continue the last run from its checkpoint, with its model and dataset; steps, learning rates, batch "
              "sizes, clipping, weight decay and replay share are taken from the Hyperparameters tab")
KEPT_NOTE = "the previous trained model is kept until this run finishes a stage"
RECALL_HINT = "Shown when a stage ends: which facts and dialogue answers the model reproduces."
# why a stage ended before its planned steps (core.trainer.StageReport.end_reason), as the labels say it
EARLY_ENDS = {"learned": "learned", "no progress": "no better recall in the last checks",
              "time budget": "time budget used"}
STAGE_SHORT = {"pretrain": "pretraining", "tune": "tuning"}
FINAL_STATUS = ("Learned", "Not fully learned", "Training finished")  # how a finished run's label begins
NO_PLOTS_NOTE = ("Trained model ready — its plots, log and recall table were not kept (it was trained by an "
                 "earlier version of the app or outside it); try it on the Chat tab")


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def estimate_text(info: RunStarted) -> str:
    """"estimated 1:23 (first run on this device: +0:40 for tuning and compiling), resident memory at most
    0.75 GiB" of a run's RunStarted (as ``train`` and ``train --base`` print them), or "" when not estimated."""
    if not info.estimated_s:
        return ""
    first = (f" (first run on this device: +{format_duration(info.first_run_s)} for tuning and compiling)"
             if info.first_run_s else "")
    memory = f", resident memory at most {memory_size(info.peak_resident_bytes)}" if info.peak_resident_bytes else ""
    return f"estimated {format_duration(info.estimated_s)}{first}{memory}"


def validation_interval(train_config: TrainConfig) -> int:
    """Steps between validation points: about 15 per run, at least 10 steps apart."""
    return max(10, (train_config.pretrain.steps + train_config.tune.steps) // 15)


def _saved_position(meta) -> tuple[int, int, list[int]] | None:
    """(stage_index, stage_step, [pretrain steps, tune steps]) of a checkpoint's CheckpointMeta (None: none)."""
    if meta is None:
        return None
    return meta.stage_index, meta.stage_step, [meta.train.pretrain.steps, meta.train.tune.steps]


SAMPLED_NOUN = {"fact": "facts", "dialogue": "dialogue answers", "chat": "answers in a conversation",
                "heldout": "held-out questions"}


def folder_write_problem(folder: Path) -> str | None:
    """Why a training run could not save into ``folder`` (None when it can): a temporary file is created
    and removed in it (or in the nearest folder that exists, where the run would create it), as the
    checkpoint saves will; a permission check alone misses read-only file systems.

    Args:
        folder: the project folder the run saves its checkpoints in.

    Returns:
        One line naming the folder and the reason, or None.
    """
    probe = Path(folder)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".write-test-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return (f"{probe}: cannot write here ({e.strerror or e}), so training could not save its model; "
                "save the project in a writable folder (File ▸ Save project as…) and start again")
    return None


class TrainingTab(QWidget):
    """Runs a :class:`gui.workers.TrainWorker` and shows what it reports.

    Args:
        state: the app state: device, dataset, configs and checkpoint folders come from it; the tab
            reports a saved model (``notify_model_saved``) and whether it is training (``set_training``).
    """

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self._worker: TrainWorker | None = None
        self._stage_steps = [0, 0]
        self._rates: deque = deque(maxlen=30)
        self._last: TrainingStep | None = None
        self._t0 = 0.0
        self._resumed = False
        self._stopping = False
        self._active = False
        self._checking: RecallChecking | None = None  # the recall check running now
        self._check_s = 0.0  # seconds the last recall check took (for the ETA)
        self._check_t0 = 0.0
        self._estimate: RunStarted | None = None  # the run's start, with its estimate (estimate_text)
        self._first_run = ""  # " (first run on this device: about 1:50 for tuning and compiling)" or ""
        # stages of this run that ended before their planned steps: (stage, why, steps done, planned)
        self._early: list[tuple[str, str, int, int]] = []
        # the bar shows at least this: the planned end of a stage that ended early (its last step is short of it)
        self._progress_floor = 0
        # the project's history (gui.history): earlier runs, and the latest run's fields besides its plots
        self._earlier: list[dict] = []
        self._run: dict | None = None  # {"started", "recall", "summary", "status", "speed"}

        # -- controls
        row = QHBoxLayout()
        self.start_button = QPushButton("Start training")
        self.start_button.setToolTip(START_TIP.format(what="Train a new model from scratch"))
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current step and save a checkpoint")
        self.stop_button.clicked.connect(self.stop)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setToolTip(RESUME_TIP)
        self.resume_button.clicked.connect(self.resume)
        self.heldout_button = QPushButton("Learn held-out questions")
        self.heldout_button.setToolTip("The run kept some questions about facts without a dialogue out of training "
                                       "to measure how well such questions are answered; train them too")
        self.heldout_button.clicked.connect(self.learn_heldout)
        self.heldout_button.hide()
        for b in (self.start_button, self.stop_button, self.resume_button, self.heldout_button):
            row.addWidget(b)
        self.stage_label = QLabel("Not started")
        self.stage_label.setStyleSheet("font-weight: bold;")
        self.stage_label.setWordWrap(True)  # "Stopped at … — Resume to continue (…)" fits narrow windows
        row.addSpacing(12)
        row.addWidget(self.stage_label, 1)
        prow = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        prow.addWidget(self.progress, 1)
        # one line, elided with the whole text as tooltip (a narrow window clips nothing); its width does
        # not follow the numbers, so the bar does not jump
        self.speed_label = ElidedLabel("", min_chars=60)
        prow.addWidget(self.speed_label, 2)
        self.earlier_check = QCheckBox("Show earlier runs")
        self.earlier_check.setToolTip("Draw the loss of this project's earlier runs faintly behind the latest one")
        self.earlier_check.toggled.connect(self._show_earlier_runs)
        self.earlier_check.setEnabled(False)
        prow.addWidget(self.earlier_check)
        self.hint_label = QLabel()  # why Start / Resume are disabled
        self.hint_label.setWordWrap(True)
        self.hint_label.setStyleSheet("color: #b00020;")
        self.hint_label.hide()

        # -- error banner
        self.banner = QFrame()
        self.banner.setStyleSheet("QFrame { background: #fff3cd; border: 1px solid #e0c060; border-radius: 4px; }")
        brow = QHBoxLayout(self.banner)
        self.banner_text = QLabel()
        self.banner_text.setWordWrap(True)
        brow.addWidget(self.banner_text, 1)
        self.cpu_button = QPushButton("Switch to the CPU device and start again")
        self.cpu_button.clicked.connect(self._switch_to_cpu)
        brow.addWidget(self.cpu_button)
        close = QPushButton("Dismiss")
        close.clicked.connect(self.banner.hide)
        brow.addWidget(close)
        self.banner.hide()

        # -- plots, log, recall
        self.plots = TrainingPlots()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(MAX_LOG_LINES)
        log_box = QGroupBox("Log")
        QVBoxLayout(log_box).addWidget(self.log)
        recall_box = QGroupBox("Recall after each stage")
        rv = QVBoxLayout(recall_box)
        self.recall_label = QLabel(RECALL_HINT)
        self.recall_label.setWordWrap(True)
        rv.addWidget(self.recall_label)
        self.recall = QTableWidget(0, 6)
        self.recall.setHorizontalHeaderLabels(["Stage", "Kind", "Prompt", "Expected", "Model wrote", "OK"])
        header = self.recall.horizontalHeader()
        for c in range(6):  # the text columns share the width; the short ones fit their contents
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch if c in (2, 3, 4)
                                        else QHeaderView.ResizeMode.ResizeToContents)
        self.recall.verticalHeader().setVisible(False)
        self.recall.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.recall.setWordWrap(False)
        rv.addWidget(self.recall, 1)
        # -- before / after, for a model fine-tuned from a GGUF file
        self.compare_button = QPushButton("Compare with the base model")
        self.compare_button.setToolTip("Greedy answers of the base model and the tuned one, side by side, to every "
                                       "dataset question and a few general ones: what was learned, what was forgotten")
        self.compare_button.clicked.connect(self.compare_with_base)
        self.compare_button.hide()
        rv.addWidget(self.compare_button)
        self.compare = QTableWidget(0, 4)
        self.compare.setHorizontalHeaderLabels(["Question", "Taught", "Base model", "Tuned model"])
        for c in range(4):
            self.compare.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch)
        self.compare.verticalHeader().setVisible(False)
        self.compare.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.compare.hide()
        rv.addWidget(self.compare, 1)
        self._compare_worker = None
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(log_box)
        bottom.addWidget(recall_box)
        bottom.setSizes([350, 650])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.plots)
        split.addWidget(bottom)
        split.setSizes([520, 260])

        lay = QVBoxLayout(self)
        lay.addLayout(row)
        lay.addLayout(prow)
        lay.addWidget(self.hint_label)
        lay.addWidget(self.banner)
        lay.addWidget(split, 1)

        self._label_timer = QTimer(self, interval=200)
        self._label_timer.timeout.connect(self._update_labels)
        for signal in (state.device_changed, state.hyperparameters_changed, state.model_saved):
            signal.connect(self.update_buttons)
        state.project_changed.connect(self.show_project_state)
        self.update_buttons()

    # ----------------------------------------------------------------------------- state
    def is_running(self) -> bool:
        """True from start until the worker's last signal has been handled."""
        return self._active

    def can_resume(self) -> bool:
        return self.app_state.resume_dir() is not None

    def _fine_tuned(self) -> bool:
        path = self.app_state.trained_model_path()
        meta = checkpoint_meta(path) if path is not None else None
        return bool(meta is not None and meta.base.get("base_model"))

    def compare_with_base(self) -> bool:
        """Start the before/after comparison of the trained model with its base (False if not possible)."""
        path = self.app_state.trained_model_path()
        if self.is_running() or self._compare_worker is not None or path is None or not self._fine_tuned():
            return False
        w = CompareWorker(self.app_state.device_info(), path)
        w.connect_slots(result=self._on_compare, log_line=self.append_log,
                        failed=lambda kind, msg: self.append_log("WARNING", f"comparison failed: {msg}"),
                        finished=self._on_compare_finished)
        self._compare_worker = w
        self.compare_button.setEnabled(False)
        self.compare_button.setText("Comparing…")
        w.start()
        return True

    def _on_compare(self, result: Comparison) -> None:
        self.compare.setRowCount(0)
        for r in result.answers:
            i = self.compare.rowCount()
            self.compare.insertRow(i)
            for c, v in enumerate((r.question, r.taught or "(general question)", r.before, r.after)):
                it = QTableWidgetItem(v)
                it.setToolTip(v)
                self.compare.setItem(i, c, it)
        self.compare.show()

    def _on_compare_finished(self) -> None:
        self._compare_worker = None
        self.compare_button.setText("Compare with the base model")
        self.update_buttons()

    def comparing(self) -> bool:
        """True while the before/after comparison runs."""
        return self._compare_worker is not None

    def update_buttons(self, *_: object) -> None:
        running = self.is_running()
        self.compare_button.setVisible(self._fine_tuned())
        self.compare_button.setEnabled(not running and self._compare_worker is None)
        blocker = self.app_state.train_blocker()
        self.start_button.setEnabled(not running and blocker is None)
        self.stop_button.setEnabled(running and not self._stopping)
        self.resume_button.setEnabled(not running and blocker is None and self.can_resume())
        self.heldout_button.setVisible(not running and blocker is None and self._heldout_offered())
        self.start_button.setToolTip(blocker or START_TIP.format(what=(does := self._new_run_does())[0].upper() + does[1:]))
        self.resume_button.setToolTip(blocker or RESUME_TIP)
        self.hint_label.setText(blocker or "")
        self.hint_label.setVisible(bool(blocker) and not running)

    def show_project_state(self, project: object = None) -> None:
        """A project was opened: forget the previous project's run and show this one's saved history
        (the latest run's plots, recall table and numbers, the log; earlier runs' loss for the overlay)
        and where its checkpoints stand."""
        if self.is_running():
            return
        self.banner.hide()
        self.log.clear()
        self.plots.clear()
        self.recall.setRowCount(0)
        self.recall_label.setText(RECALL_HINT)
        self.speed_label.setText("")
        self._last = None
        history = getattr(project, "history", None) or {"runs": [], "log": []}
        runs = list(history.get("runs", []))
        self._earlier = [earlier_run(r) for r in runs[:-1]]
        self._run = None
        if runs:
            run = runs[-1]
            self._run = {"started": run.get("started", ""), "recall": [], "summary": [],
                         "status": run.get("status", ""), "speed": run.get("speed", "")}
            self.plots.restore(run)
            for row in run.get("recall", []):
                self._add_recall_row(row)
            for line in run.get("summary", []):
                self._add_recall_summary(line)
            self.speed_label.setText(self._run["speed"])
        self._set_earlier_curves()
        for line in history.get("log", []):
            self.log.appendPlainText(line)
        self._show_saved_state()
        self.update_buttons()

    def _set_earlier_curves(self) -> None:
        curves = [r["series"]["loss"] for r in self._earlier if r["series"]["loss"][0]]
        self.plots.set_earlier_runs(curves)
        self.earlier_check.setEnabled(bool(curves))
        self.earlier_check.setText(f"Show earlier runs ({len(curves)})" if curves else "Show earlier runs")

    def _show_earlier_runs(self, on: bool) -> None:
        self.plots.show_earlier_runs(on)

    def saved_history(self) -> dict:
        """What the project saves of training (gui.history's ``{"runs", "log"}``): the earlier runs, the
        latest run with its plots, recall table, verdict and numbers line, and the log's lines."""
        runs = list(self._earlier)
        if self._run is not None:
            runs.append({**self._run, **self.plots.snapshot()})
        return {"runs": runs, "log": self.log.toPlainText().splitlines()}

    def _new_run(self) -> None:
        """A new run starts: the latest one becomes an earlier run (its loss curve is kept)."""
        if self._run is not None and self.plots.loss.x:  # a run that never took a step is not kept
            self._earlier.append(earlier_run({**self._run, **self.plots.snapshot()}))
            self._earlier = self._earlier[-(MAX_RUNS - 1):]  # what the project keeps (gui.history)
        self._run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "recall": [], "summary": [], "status": "",
                     "speed": ""}
        self._set_earlier_curves()

    def _show_saved_state(self) -> None:
        """Stage label and progress bar from the project's checkpoints (config.json), with the latest
        run's verdict when it finished."""
        resume_dir = self.app_state.resume_dir()
        trained = self.app_state.trained_model_path()
        folder = resume_dir or trained
        pos = _saved_position(checkpoint_meta(folder)) if folder is not None else None
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        status = self._run["status"] if self._run is not None else ""
        has_plots = bool(self.plots.loss.x)
        if pos is None:
            self.stage_label.setText("Not started" if folder is None else
                                     "Trained model ready" if has_plots else NO_PLOTS_NOTE)
            return
        stage, step, steps = pos
        total = sum(steps)
        if total > 0:
            done = total if stage >= 2 else (steps[0] if stage == 1 else 0) + step
            self.progress.setRange(0, total)
            self.progress.setValue(min(total, done))
        if resume_dir is None:
            if not has_plots:
                self.stage_label.setText(NO_PLOTS_NOTE)
            elif status.startswith(FINAL_STATUS):
                self.stage_label.setText(status)
            else:
                self.stage_label.setText("Trained model ready — try it on the Chat tab")
            return
        text = f"Stopped at stage {stage + 1} step {step} of {steps[stage]} — Resume to continue"
        if trained is not None and resume_dir != trained:
            text += f" ({KEPT_NOTE})"
        self.stage_label.setText(text)

    def append_log(self, level: str, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        prefix = "" if level == "INFO" else f"{level}: "
        self.log.appendPlainText(f"{stamp}  {prefix}{message}")

    def _show_banner(self, text: str, offer_cpu: bool) -> None:
        self.banner_text.setText(text)
        self.cpu_button.setVisible(offer_cpu)
        self.banner.show()

    # ----------------------------------------------------------------------------- actions
    def start(self) -> bool:
        """Start a new run; False (with a message) when settings or dataset are not usable, or when the
        user keeps the trained model."""
        if self.is_running():
            return False
        if self.app_state.trained_model_path() is not None or self.app_state.resume_dir() is not None:
            text = (f"This project already has a trained model. A new run {self._new_run_does('one')} with the "
                    "current dataset and settings.\n\nThe current model stays in use (Chat, Export) until the "
                    "new run finishes its first stage; if you stop the new run before that, it is kept.")
            if not dialogs.ask(self, "Replace the trained model?", text, yes="Start a new run"):
                return False
        return self._launch(resume=False)

    def _new_run_does(self, model: str = "a new model") -> str:
        """What Start does: "trains <model> from scratch", or "fine-tunes <the base file>" (Hyperparameters ▸
        Start from)."""
        base = self.app_state.base_model()
        return f"fine-tunes {Path(base).name}" if base else f"trains {model} from scratch"

    def resume(self) -> bool:
        """Continue the project's last run from its checkpoint, with its model and dataset; the form's
        training-only settings apply. Asks first when the form's model settings or the dataset differ."""
        if self.is_running():
            return False
        return self._launch(resume=True)

    def learn_heldout(self) -> bool:
        """Continue the project's finished run with the fact questions it held out trained too
        (core.plan.with_heldout_trained); False (with a message) when there is none to learn."""
        from core.plan import with_heldout_trained

        folder = self.app_state.trained_model_path()
        meta = checkpoint_meta(folder) if folder is not None else None
        if self.is_running() or meta is None or not meta.train.heldout:
            self._show_banner("This project's model kept no questions out of training.", False)
            return False
        return self._launch(resume=True, continue_with=(folder, with_heldout_trained(meta.train)))

    def _heldout_offered(self) -> bool:
        folder = self.app_state.trained_model_path()
        meta = checkpoint_meta(folder) if folder is not None else None
        return meta is not None and meta.done and bool(meta.train.heldout)

    def _plan_resume(self, folder, mc, tc):
        """The gui.resume.ResumePlan for ``folder``, or None (with a message) when it cannot resume."""
        from gui.project import checkpoint_problem
        from gui.resume import resume_plan

        meta = checkpoint_meta(folder)
        if meta is None:
            self._show_banner(f"Cannot resume: {checkpoint_problem(folder)}.", False)
            return None
        plan = resume_plan(meta, mc, tc, self.app_state.dataset_copy())
        if plan.ignored:
            text = ("Resume continues the saved model and dataset; to use the new settings, Start a new run.\n\n"
                    "Not used by Resume:\n" + "\n".join(f"• {x}" for x in plan.ignored))
            if plan.applied:
                text += "\n\nUsed by Resume:\n" + "\n".join(f"• {x}" for x in plan.applied)
            if not dialogs.ask(self, "Resume the saved run?", text, yes="Resume"):
                return None
        return plan

    def _refuse_unwritable(self, run_dir: Path | None) -> bool:
        """True (with a message box and the banner) when the run's checkpoints could not be saved: a run in
        a read-only project failed after its first stage, with autosave failures only in the status bar."""
        problem = folder_write_problem(run_dir.parent) if run_dir is not None else None
        if problem is None:
            return False
        dialogs.warn(self, "Cannot train in this project folder", problem)
        self._show_banner(problem, False)
        return True

    def _launch(self, resume: bool, continue_with: tuple | None = None) -> bool:
        if self.is_running():
            return False
        self.banner.hide()
        device = self.app_state.device_info()
        if device is None:
            self._show_banner("No OpenCL device: see the Device tab.", False)
            return False
        configs = self.app_state.configs()
        if configs is None:
            self._show_banner(f"Fix the hyperparameters first: {self.app_state.config_error()}", False)
            return False
        mc, tc = configs
        checkpoint = self.app_state.checkpoint_dir()
        if resume:
            run_dir = continue_with[0] if continue_with else self.app_state.resume_dir()
            if run_dir is None:
                self._show_banner("There is no unfinished run to resume.", False)
                return False
            if self._refuse_unwritable(run_dir):
                return False
            if continue_with:  # (folder, TrainConfig): a finished run continued with new settings
                resumed_tc = continue_with[1]
                self.append_log("INFO", "training the held-out questions too")
            else:
                plan = self._plan_resume(run_dir, mc, tc)
                if plan is None:
                    return False
                resumed_tc = plan.train_config
                for change in plan.applied:
                    self.append_log("INFO", f"resume uses the new setting {change}")
            kw = dict(train_config=resumed_tc)
            val_every = validation_interval(resumed_tc)
            self.plots.set_clip_threshold(resumed_tc.grad_clip)
            if self._run is None:  # its history was not kept: what follows is this run's
                self._new_run()
        else:
            dataset = self.app_state.dataset_copy()
            if not dataset.facts and not dataset.dialogues:
                self._show_banner("The dataset is empty: add facts or dialogues on the Dataset tab.", False)
                return False
            problems = dataset.validate()
            if problems:
                self._show_banner(f"Fix the dataset first ({count_words(len(problems), 'problem')}), e.g. {problems[0]}",
                                  False)
                return False
            run_dir = self.app_state.new_run_dir()
            if self._refuse_unwritable(run_dir):
                return False
            plan = self.app_state.plan()  # the Auto plan's time, its one-time costs included (core.plan.Plan)
            plan_s = (plan.run_s, plan.first_run_s if plan.first_run_note() else 0.0) if plan is not None else None
            kw = dict(dataset=dataset, model_config=mc, train_config=tc, base=self.app_state.base_model(),
                      plan_s=plan_s)
            self._new_run()
            self.plots.clear()
            self.plots.set_clip_threshold(tc.grad_clip)
            self.recall.setRowCount(0)
            self.recall_label.setText("Shown when a stage ends.")
            val_every = validation_interval(tc)
        w = TrainWorker(device, checkpoint, resume=resume, val_every=val_every, run_dir=run_dir, **kw)
        w.connect_slots(phase=self._on_phase, run_started=self._on_started, step=self._on_step,
                        validation=self._on_validation,
                        stage_done=self._on_stage_done, checkpoint_saved=self.app_state.notify_model_saved,
                        recall_progress=self._on_recall_progress,
                        run_done=self._on_run_done, log_line=self.append_log, failed=self._on_failed,
                        finished=self._on_finished)
        self._worker = w
        self._active = True
        self._stopping = False
        self._resumed = resume
        self._rates.clear()
        self._last = None
        self._early, self._progress_floor = [], 0
        self._estimate = None
        self._t0 = time.perf_counter()
        first = kw.get("plan_s") or (0.0, 0.0)
        self._first_run = (f" (first run on this device: about {format_duration(first[1])} for tuning and "
                           "compiling)" if first[1] else "")
        self.stage_label.setText(f"Preparing: tokenizer, model and kernels{self._first_run}…")
        self.speed_label.setText("")
        self.progress.setRange(0, 0)  # busy until the first step
        self.append_log("INFO", "resuming training" if resume else "starting training")
        w.start()
        self._label_timer.start()
        self.app_state.set_training(True)
        self.update_buttons()
        return True

    def stop(self) -> None:
        """Ask the run to stop after the current step (a checkpoint is saved)."""
        if self.is_running() and self._worker.isRunning():
            self._stopping = True
            self._worker.request_stop()
            self.stage_label.setText("Stopping after this step…")
            self.update_buttons()

    def stop_and_wait(self) -> None:
        """Stop the run and wait for its thread (the window closes); the plots stop redrawing."""
        if self._worker is not None:
            self._worker.request_stop()
            self._worker.wait()
        self.plots.stop()

    def _switch_to_cpu(self) -> None:
        self.banner.hide()
        if self.app_state.switch_to_cpu():
            self.start()

    # ----------------------------------------------------------------------------- worker signals
    def _on_phase(self, what: str) -> None:
        """The run's work before its first step (TrainWorker.phase), with its first run's one-time costs."""
        self.stage_label.setText(f"Preparing: {what}{self._first_run}…")

    def _on_started(self, info: RunStarted) -> None:
        self._stage_steps = list(info.stage_steps)
        total = sum(self._stage_steps)
        self.progress.setRange(0, max(total, 1))
        offset = self._stage_steps[0] if info.stage_index >= 1 else 0
        self.progress.setValue(offset + info.stage_step)
        if self._stage_steps[0] and self._stage_steps[1] and (not info.resumed or not self.plots.loss.x):
            self.plots.add_stage_marker(self._stage_steps[0] + 0.5, "tuning starts")
        self._estimate = info if info.estimated_s else None
        plan = f" — {estimate_text(info)}" if self._estimate else ""
        self.stage_label.setText(f"Training on {info.device}{plan}")
        self.speed_label.setText(estimate_text(info))
        if self._estimate:
            self.append_log("INFO", f"this run: {estimate_text(info)}")

    def _on_validation(self, d) -> None:
        self.plots.add_validation(d)
        self.app_state.mark_history_changed()  # about 15 saves a run: a crash loses little of the plots

    def _on_step(self, d: TrainingStep) -> None:
        self.plots.add_step(d)
        self._last = d
        self._rates.append((time.perf_counter(), d.global_step))

    def _update_labels(self) -> None:
        d = self._last
        if d is None:
            return
        total = sum(self._stage_steps)
        self.progress.setValue(max(d.global_step, self._progress_floor))
        stage_no = 1 if d.stage == "pretrain" else 2
        running = not self._stopping and self.is_running()
        c = self._checking
        if running and c is not None:
            what = "after" if c.final else "at"
            self.stage_label.setText(f"{STAGE_NAMES.get(c.stage, c.stage)} — checking recall… {c.done}/{c.total} "
                                     f"prompts ({what} step {d.step}, stage {stage_no} of 2)")
        elif running:
            self.stage_label.setText(f"{STAGE_NAMES.get(d.stage, d.stage)} — step {d.step}/"
                                     f"{d.total_steps} · {d.passes:.1f} passes (stage {stage_no} of 2)")
        eta = ""
        if running and len(self._rates) >= 2:
            (t0, s0), (t1, s1) = self._rates[0], self._rates[-1]
            if s1 > s0 and t1 > t0:
                # at most: the remaining steps, plus one recall check per stage left (its last duration)
                stages_left = 2 if d.stage == "pretrain" else 1
                rest = (total - d.global_step) * (t1 - t0) / (s1 - s0) + stages_left * self._check_s
                eta = f" · ETA {_hms(rest)} at most"
        elif running and self._estimate is not None:  # not timed yet: what is left of the estimate
            eta = f" · ETA about {_hms(self._estimate.estimated_s - (time.perf_counter() - self._t0))}"
        if self._estimate is not None:
            eta += f" (estimated {format_duration(self._estimate.estimated_s)} in all)"
        since = " since resuming" if self._resumed else ""
        early = f" (stopped early: {self._early[-1][1]})" if self._early and not running else ""
        self.speed_label.setText(f"step {d.global_step}/{total}{early} · {d.passes:.1f} passes{eta} · "
                                 f"{d.tokens_per_s:,.0f} tokens/s · loss {d.loss:.3f} · "
                                 f"{_hms(time.perf_counter() - self._t0)} elapsed{since}")

    def _on_recall_progress(self, c: RecallChecking) -> None:
        if c.done == 0:
            self._check_t0 = time.perf_counter()
        self._checking = c if c.done < c.total else None
        if c.done >= c.total:
            self._check_s = time.perf_counter() - self._check_t0
            # the check's time is not step time: restart the rate window
            self._rates.clear()
        self._update_labels()

    def _on_stage_done(self, d: StageDone) -> None:
        self.plots.flush()
        if d.stopped:
            self.append_log("INFO", f"{d.stage}: stopped at step {d.steps_done}")
            return
        self._note_early_end(d)
        for r in d.recall:
            self._add_recall_row([d.stage, r.kind, r.prompt, r.expected, r.got, bool(r.ok)])
        f_ok, f_n = d.facts_recalled
        g_ok, g_n = d.dialogues_recalled
        some = "".join(f" Checked a sample of the {SAMPLED_NOUN.get(k, k)}: {c:,} of {n:,}." for k, c, n in d.sampled)
        self._add_recall_summary(f"After {d.stage}: {f_ok} of {f_n} facts and {g_ok} of {g_n} dialogue answers "
                                 f"reproduced exactly.{some}")
        self.app_state.mark_history_changed()

    def _note_early_end(self, d: StageDone) -> None:
        """A stage that ended before its planned steps (learned, no progress, time budget) is complete:
        the bar moves to its planned end (a run that ends early is at 100 %), and the labels say why."""
        why = EARLY_ENDS.get(d.end_reason)
        si = 0 if d.stage == "pretrain" else 1
        planned = self._stage_steps[si]
        if why is None or d.steps_done >= planned:
            return
        self._early.append((d.stage, why, d.steps_done, planned))
        self._progress_floor = (self._stage_steps[0] if si == 1 else 0) + planned
        self.progress.setValue(self._progress_floor)
        self.append_log("INFO", f"{d.stage} stopped early: {why} at step {d.steps_done} of {planned}")

    def _early_note(self) -> str:
        """' — tuning stopped early: learned at step 100 of 125' for each stage that ended early, or ''."""
        return "".join(f" — {STAGE_SHORT.get(stage, stage)} stopped early: {why} at step {done} of {planned}"
                       for stage, why, done, planned in self._early)

    def _add_recall_row(self, row: list) -> None:
        """One row of the recall table: [stage, kind, prompt, expected, got, ok]; kept for the history."""
        if self._run is not None:
            self._run["recall"].append(list(row))
        i = self.recall.rowCount()
        self.recall.insertRow(i)
        ok = row[5]
        for c, v in enumerate(row[:5] + ["yes" if ok else "no"]):
            it = QTableWidgetItem(v)
            it.setToolTip(v)
            if c == 5:
                it.setBackground(OK_BRUSH if ok else FAIL_BRUSH)
            self.recall.setItem(i, c, it)

    def _add_recall_summary(self, text: str) -> None:
        if self._run is not None:
            self._run["summary"].append(text)
        prev = self.recall_label.text()
        self.recall_label.setText(prev + "\n" + text if prev.startswith("After") else text)

    def _on_run_done(self, d: RunDone) -> None:
        self._checking = None
        if d.finished and d.verdict:
            self.stage_label.setText(d.verdict + self._early_note()
                                     + ("" if d.learned else f" — to learn the rest: {d.advice}"))
            self.append_log("INFO" if d.learned else "WARNING", self.stage_label.text())
        elif d.finished:
            self.stage_label.setText("Training finished (no recall check) — try the model on the Chat tab")
        elif d.stopped:
            text = "Stopped"
            if d.checkpoint:
                stage = d.stage_index
                steps = self._stage_steps[stage] if stage < 2 else 0
                text += f" at stage {stage + 1} step {d.stage_step} of {steps} — Resume to continue"
                if not d.replaced:
                    text += f" ({KEPT_NOTE})"
            self.stage_label.setText(text)

    def _on_failed(self, kind: str, message: str) -> None:
        self.append_log("ERROR", message)
        info = self.app_state.device_info()
        offer_cpu = kind == "device" and info is not None and info.kind != "CPU" and self.app_state.has_cpu_device()
        if kind == "device":
            text = f"The OpenCL device failed during training: {message}"
            if offer_cpu:
                text += "\nThe CPU device is slower but has more memory."
        elif kind == "diverged":
            text = f"Training diverged: {message}"
        else:
            text = f"Training failed: {message}"
        self._show_banner(text, offer_cpu)
        self.stage_label.setText("Failed")

    def _on_finished(self) -> None:
        self._active = False
        self._label_timer.stop()
        self._update_labels()
        self.plots.flush()
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
        if self._stopping and not self.stage_label.text().startswith(("Stopped", "Failed")):
            self.stage_label.setText("Stopped")
        self._stopping = False
        if self._run is not None:
            self._run["status"], self._run["speed"] = self.stage_label.text(), self.speed_label.text()
        self.app_state.set_training(False)
        self.app_state.mark_history_changed()
        self.update_buttons()
