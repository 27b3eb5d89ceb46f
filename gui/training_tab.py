"""Training tab: start / stop / resume, progress with ETA, live plots, log, recall table.

The tab wires its parts: gui/run_status.py (status line, bar, numbers line), gui/recall_table.py (the recall
table on a Qt model), gui/compare_panel.py (before/after of a fine-tune), gui/run_history.py (the runs the
project keeps) and gui/run_setup.py (what is checked before a TrainWorker starts).
"""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSplitter, QVBoxLayout, QWidget

from gui import dialogs
from gui.app_state import AppState
from gui.compare_panel import ComparePanel
from gui.events import RunDone, RunStarted, StageDone, TrainingStep
from gui.history import MAX_LOG_LINES
from gui.plots import TrainingPlots
from gui.project import checkpoint_meta
from gui.recall_table import RecallBox, RecallRow, stage_rows, stage_summary
from gui.run_history import RunHistory
from gui.run_setup import (NotStarted, folder_write_problem, heldout_continuation, heldout_offered, new_run_does,
                           prepare_launch, saved_position, validation_interval)
from gui.run_status import NO_PLOTS_NOTE, RunStatus, estimate_text
from gui.widgets import Banner
from gui.workers import TrainWorker

# names other modules and tests import from here
__all__ = ["NO_PLOTS_NOTE", "TrainingTab", "estimate_text", "folder_write_problem", "validation_interval"]

START_TIP = ("{what} with the current dataset and settings. A trained model this project already has stays until "
             "the new run finishes its first stage (and is kept if you stop earlier).")
RESUME_TIP = ("Continue the last run from its checkpoint, with its model and dataset; steps, learning rates, batch "
              "sizes, clipping, weight decay and replay share are taken from the Hyperparameters tab")


def failure_text(kind: str, message: str, offer_cpu: bool) -> str:
    """The banner's text for a failed run (TrainWorker.failed's kind and message)."""
    if kind == "device":
        text = f"The OpenCL device failed during training: {message}"
        return text + ("\nThe CPU device is slower but has more memory." if offer_cpu else "")
    if kind == "diverged":
        return f"Training diverged: {message}"
    return f"Training failed: {message}"


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
        self._stopping = False
        self._active = False
        self.status = RunStatus(lambda: not self._stopping and self.is_running())
        self.stage_label, self.progress, self.speed_label = (self.status.stage_label, self.status.progress,
                                                             self.status.speed_label)
        # the worker's slots that only redraw the status (tests call them on the tab)
        self._on_phase, self._update_labels = self.status.phase, self.status.update
        self.plots = TrainingPlots()
        self.runs = RunHistory(self.plots)
        self.earlier_check = self.runs.earlier_check
        self.comparison = ComparePanel(state, self.append_log, self.is_running, self.update_buttons)
        self.compare_button, self.compare = self.comparison.button, self.comparison.table
        self.compare_with_base, self.comparing = self.comparison.start, self.comparison.running
        self._on_compare = self.comparison.show_result
        self.banner = Banner("Switch to the CPU device and start again",
                             lambda: self.app_state.switch_to_cpu() and self.start())
        self.banner_text, self.cpu_button = self.banner.text_label, self.banner.action_button
        lay = QVBoxLayout(self)
        lay.addLayout(self._build_controls())
        lay.addWidget(self.hint_label)
        lay.addWidget(self.banner)
        lay.addWidget(self._build_body(), 1)
        self._label_timer = QTimer(self, interval=200)
        self._label_timer.timeout.connect(self._update_labels)
        for signal in (state.device_changed, state.hyperparameters_changed, state.model_saved):
            signal.connect(self.update_buttons)
        state.project_changed.connect(self.show_project_state)
        self.update_buttons()

    def _build_controls(self) -> QVBoxLayout:
        """Start / Stop / Resume / held-out buttons and the stage label; the bar, the numbers line and the
        earlier-runs switch under them; ``hint_label`` (why Start is disabled) is placed by the caller."""
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
        row.addSpacing(12)
        row.addWidget(self.stage_label, 1)
        prow = QHBoxLayout()
        prow.addWidget(self.progress, 1)
        prow.addWidget(self.speed_label, 2)
        prow.addWidget(self.earlier_check)
        self.hint_label = QLabel()  # why Start / Resume are disabled
        self.hint_label.setWordWrap(True)
        self.hint_label.setStyleSheet("color: #b00020;")
        self.hint_label.hide()
        rows = QVBoxLayout()
        rows.addLayout(row)
        rows.addLayout(prow)
        return rows

    def _build_body(self) -> QSplitter:
        """The plots over the log and the recall table (with the before/after comparison)."""
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(MAX_LOG_LINES)
        log_box = QGroupBox("Log")
        QVBoxLayout(log_box).addWidget(self.log)
        self.recall_box = RecallBox(self.comparison)
        self.recall, self.recall_label = self.recall_box.view, self.recall_box.label
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(log_box)
        bottom.addWidget(self.recall_box)
        bottom.setSizes([350, 650])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.plots)
        split.addWidget(bottom)
        split.setSizes([520, 260])
        return split

    # ----------------------------------------------------------------------------- state
    def is_running(self) -> bool:
        """True from start until the worker's last signal has been handled."""
        return self._active

    @property
    def _last(self) -> TrainingStep | None:
        """The run's latest step (None before the first)."""
        return self.status.last

    def update_buttons(self, *_: object) -> None:
        running = self.is_running()
        self.comparison.update_button(running)
        blocker = self.app_state.train_blocker()
        self.start_button.setEnabled(not running and blocker is None)
        self.stop_button.setEnabled(running and not self._stopping)
        self.resume_button.setEnabled(not running and blocker is None and self.app_state.resume_dir() is not None)
        self.heldout_button.setVisible(not running and blocker is None and heldout_offered(self.app_state))
        does = new_run_does(self.app_state)
        self.start_button.setToolTip(blocker or START_TIP.format(what=does[0].upper() + does[1:]))
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
        self.recall_box.clear()
        self.speed_label.setText("")
        self.status.last = None
        history = getattr(project, "history", None) or {"runs": [], "log": []}
        run = self.runs.restore(list(history.get("runs", [])))
        if run is not None:
            self.plots.restore(run)
            rows = [RecallRow.from_saved(row) for row in run.get("recall", [])]
            self.recall_box.add(rows)
            self.runs.record("recall", [r.saved() for r in rows])
            for line in run.get("summary", []):
                self.recall_box.add_summary(line)
            self.runs.record("summary", list(run.get("summary", [])))
            self.speed_label.setText(self.runs.run["speed"])
        for line in history.get("log", []):
            self.log.appendPlainText(line)
        self._show_saved_state()
        self.update_buttons()

    def _show_saved_state(self) -> None:
        """Stage label and progress bar from the project's checkpoints (config.json), with the latest
        run's verdict when it finished."""
        resume_dir = self.app_state.resume_dir()
        trained = self.app_state.trained_model_path()
        folder = resume_dir or trained
        position = saved_position(checkpoint_meta(folder)) if folder is not None else None
        status = self.runs.run["status"] if self.runs.run is not None else ""
        self.status.show_saved(position, folder is not None, bool(self.plots.loss.x), status,
                               resume_dir is not None, trained is not None and resume_dir != trained)

    def saved_history(self) -> dict:
        """What the project saves of training (gui.history's ``{"runs", "log"}``): the earlier runs, the
        latest run with its plots, recall table, verdict and numbers line, and the log's lines."""
        return {"runs": self.runs.saved_runs(), "log": self.log.toPlainText().splitlines()}

    def _new_run(self) -> None:
        """A new run starts: the latest one becomes an earlier run (its loss curve is kept)."""
        self.runs.new_run()

    def append_log(self, level: str, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        prefix = "" if level == "INFO" else f"{level}: "
        self.log.appendPlainText(f"{stamp}  {prefix}{message}")

    # ----------------------------------------------------------------------------- actions
    def start(self) -> bool:
        """Start a new run; False (with a message) when settings or dataset are not usable, or when the
        user keeps the trained model."""
        if self.is_running():
            return False
        if self.app_state.trained_model_path() is not None or self.app_state.resume_dir() is not None:
            text = (f"This project already has a trained model. A new run {new_run_does(self.app_state, 'one')} "
                    "with the current dataset and settings.\n\nThe current model stays in use (Chat, Export) "
                    "until the new run finishes its first stage; if you stop the new run before that, it is kept.")
            if not dialogs.ask(self, "Replace the trained model?", text, yes="Start a new run"):
                return False
        return self._launch(resume=False)

    def resume(self) -> bool:
        """Continue the project's last run from its checkpoint, with its model and dataset; the form's
        training-only settings apply. Asks first when the form's model settings or the dataset differ."""
        if self.is_running():
            return False
        return self._launch(resume=True)

    def learn_heldout(self) -> bool:
        """Continue the project's finished run with the fact questions it held out trained too
        (core.plan.with_heldout_trained); False (with a message) when there is none to learn."""
        try:
            if self.is_running():
                raise NotStarted("This project's model kept no questions out of training.")
            return self._launch(resume=True, continue_with=heldout_continuation(self.app_state))
        except NotStarted as e:
            self.banner.show_message(str(e), False)
            return False

    def _launch(self, resume: bool, continue_with: tuple | None = None) -> bool:
        if self.is_running():
            return False
        self.banner.hide()
        try:
            launch = prepare_launch(self.app_state, self, resume, continue_with)
        except NotStarted as e:
            if str(e):
                self.banner.show_message(str(e), False)
            return False
        for line in launch.log:
            self.append_log("INFO", line)
        if not resume or self.runs.run is None:  # a resumed run whose history was not kept: what follows is its
            self._new_run()
        if not resume:
            self.plots.clear()
            self.recall_box.clear("Shown when a stage ends.")
        self.plots.set_clip_threshold(launch.train_config.grad_clip)
        self._start_worker(launch)
        return True

    def _start_worker(self, launch) -> None:
        """Start the TrainWorker of a prepared run (gui.run_setup.Launch) and connect its signals."""
        w = TrainWorker(self.app_state.device_info(), self.app_state.checkpoint_dir(), resume=launch.resume,
                        val_every=validation_interval(launch.train_config), run_dir=launch.run_dir,
                        **launch.worker_kwargs)
        w.connect_slots(phase=self._on_phase, run_started=self._on_started, step=self._on_step,
                        validation=self._on_validation,
                        stage_done=self._on_stage_done, checkpoint_saved=self.app_state.notify_model_saved,
                        recall_progress=self.status.recall_progress,
                        run_done=self._on_run_done, log_line=self.append_log, failed=self._on_failed,
                        finished=self._on_finished)
        self._worker = w
        self._active = True
        self._stopping = False
        self.status.begin(launch.resume, launch.first_run_s)
        self.status.preparing()
        self.append_log("INFO", "resuming training" if launch.resume else "starting training")
        w.start()
        self._label_timer.start()
        self.app_state.set_training(True)
        self.update_buttons()

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

    # ----------------------------------------------------------------------------- worker signals
    def _on_started(self, info: RunStarted) -> None:
        steps = info.stage_steps
        if steps[0] and steps[1] and (not info.resumed or not self.plots.loss.x):
            self.plots.add_stage_marker(steps[0] + 0.5, "tuning starts")
        estimate = self.status.started(info)
        if estimate:
            self.append_log("INFO", f"this run: {estimate}")

    def _on_validation(self, d) -> None:
        self.plots.add_validation(d)
        self.app_state.mark_history_changed()  # about 15 saves a run: a crash loses little of the plots

    def _on_step(self, d: TrainingStep) -> None:
        self.plots.add_step(d)
        self.status.step(d)

    def _on_stage_done(self, d: StageDone) -> None:
        self.plots.flush()
        self.status.check_cut = d.recall_stopped
        if d.stopped:
            self.append_log("INFO", f"{d.stage}: stopped at step {d.steps_done}")
            return
        early = self.status.ended_early(d)
        if early:
            self.append_log("INFO", early)
        rows, summary = stage_rows(d), stage_summary(d)
        self.recall_box.add(rows)
        self.runs.record("recall", [r.saved() for r in rows])
        self.recall_box.add_summary(summary)
        self.runs.record("summary", [summary])
        self.app_state.mark_history_changed()

    def _on_run_done(self, d: RunDone) -> None:
        self.status.run_done(d)
        if d.finished and d.verdict:
            self.append_log("INFO" if d.learned else "WARNING", self.stage_label.text())

    def _on_failed(self, kind: str, message: str) -> None:
        self.append_log("ERROR", message)
        info = self.app_state.device_info()
        offer_cpu = kind == "device" and info is not None and info.kind != "CPU" and self.app_state.has_cpu_device()
        self.banner.show_message(failure_text(kind, message, offer_cpu), offer_cpu)
        self.status.failed()

    def _on_finished(self) -> None:
        self._active = False
        self._label_timer.stop()
        self.status.finished(self._stopping)
        self.plots.flush()
        self._stopping = False
        if self.runs.run is not None:
            self.runs.run["status"], self.runs.run["speed"] = self.stage_label.text(), self.speed_label.text()
        self.app_state.set_training(False)
        self.app_state.mark_history_changed()
        self.update_buttons()
