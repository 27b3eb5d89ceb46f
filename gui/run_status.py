"""The Training tab's status line, progress bar and numbers line (steps, passes, ETA, speed) of a run."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from PySide6.QtWidgets import QLabel, QProgressBar, QWidget

from core.plan import format_duration
from core.stages import Stage
from core.wording import memory_size
from gui.events import RecallChecking, RunDone, RunStarted, StageDone, TrainingStep
from gui.widgets import ElidedLabel

KEPT_NOTE = "the previous trained model is kept until this run finishes a stage"
# why a stage ended before its planned steps (core.trainer.StageReport.end_reason), as the labels say it
EARLY_ENDS = {"learned": "learned", "no progress": "no better recall in the last checks",
              "time budget": "time budget used"}
FINAL_STATUS = ("Learned", "Not fully learned", "Training finished")  # how a finished run's label begins
NO_PLOTS_NOTE = ("Trained model ready — its plots, log and recall table were not kept (it was trained by an "
                 "earlier version of the app or outside it); try it on the Chat tab")


def hms(seconds: float) -> str:
    """``seconds`` as "m:ss" or "h:mm:ss" (rounded, never negative)."""
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


class RunStatus:
    """Owns ``stage_label``, ``progress`` and ``speed_label`` and the numbers behind them: the stage sizes,
    the recent step rate (for the ETA), the running recall check, the stages that ended early.

    Args:
        running: True while the run goes on and was not asked to stop (the labels then show an ETA).

    Once the run has ended (``run_done`` or ``failed``), the stage label keeps its verdict: the 200 ms timer that
    redraws the labels may still fire before the worker's thread has ended (``finished``).
    """

    def __init__(self, running: Callable[[], bool]) -> None:
        self._running = running
        self.stage_label = QLabel("Not started")
        self.stage_label.setStyleSheet("font-weight: bold;")
        self.stage_label.setWordWrap(True)  # "Stopped at … — Resume to continue (…)" fits narrow windows
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        # one line, elided with the whole text as tooltip (a narrow window clips nothing); its width does
        # not follow the numbers, so the bar does not jump
        self.speed_label = ElidedLabel("", min_chars=60)
        self.stage_steps = [0, 0]
        self.last: TrainingStep | None = None
        self.begin(False, 0.0)
        self._check_s = 0.0  # seconds the last recall check took (for the ETA)

    def begin(self, resumed: bool, first_run_s: float) -> None:
        """A run is launched: forget the last one's numbers; the bar is busy until the first step."""
        self._rates: deque = deque(maxlen=30)
        self.last = None
        self._t0 = time.perf_counter()
        self._ended = False  # run_done or failed arrived: the stage label holds the run's end
        self._resumed = resumed
        self._checking: RecallChecking | None = None  # the recall check running now
        self._check_t0 = 0.0
        self._estimate: RunStarted | None = None  # the run's start, with its estimate (estimate_text)
        # stages of this run that ended before their planned steps: (stage, why, steps done, planned)
        self._early: list[tuple[str, str, int, int]] = []
        # the bar shows at least this: the planned end of a stage that ended early (its last step is short of it)
        self._progress_floor = 0
        self.check_cut = False  # the last stage's recall check was cut short by a stop (StageDone.recall_stopped)
        self._first_run = (f" (first run on this device: about {format_duration(first_run_s)} for tuning and "
                           "compiling)" if first_run_s else "")

    def preparing(self) -> None:
        self.stage_label.setText(f"Preparing: tokenizer, model and kernels{self._first_run}…")
        self.speed_label.setText("")
        self.progress.setRange(0, 0)

    def phase(self, what: str) -> None:
        """The run's work before its first step (TrainWorker.phase), with its first run's one-time costs."""
        self.stage_label.setText(f"Preparing: {what.rstrip('…')}{self._first_run}…")  # core's may end in "…"

    def started(self, info: RunStarted) -> str:
        """The run's first report: the bar's range and position, the estimate; returns the estimate's text."""
        self.stage_steps = list(info.stage_steps)
        self.progress.setRange(0, max(sum(self.stage_steps), 1))
        offset = self.stage_steps[0] if info.stage_index >= 1 else 0
        self.progress.setValue(offset + info.stage_step)
        self._estimate = info if info.estimated_s else None
        plan = f" — {estimate_text(info)}" if self._estimate else ""
        self.stage_label.setText(f"Training on {info.device}{plan}")
        self.speed_label.setText(estimate_text(info))
        return estimate_text(info) if self._estimate else ""

    def step(self, d: TrainingStep) -> None:
        self.last = d
        self._rates.append((time.perf_counter(), d.global_step))

    def update(self) -> None:
        """Redraw the labels and the bar from the latest step (a timer calls it a few times a second)."""
        d = self.last
        if d is None:
            return
        self.progress.setValue(max(d.global_step, self._progress_floor))
        running = self._running() and not self._ended
        if running:
            self.stage_label.setText(self._stage_text(d))
        since = " since resuming" if self._resumed else ""
        early = f" (stopped early: {self._early[-1][1]})" if self._early and not running else ""
        self.speed_label.setText(f"step {d.global_step}/{sum(self.stage_steps)}{early} · {d.passes:.1f} passes"
                                 f"{self._eta(d, running)} · {d.tokens_per_s:,.0f} tokens/s · loss {d.loss:.3f} · "
                                 f"{hms(time.perf_counter() - self._t0)} elapsed{since}")

    def _stage_text(self, d: TrainingStep) -> str:
        stage_no, c = Stage(d.stage).index + 1, self._checking
        if c is not None:
            what = "after" if c.final else "at"
            return (f"{Stage(c.stage).label} — checking recall… {c.done}/{c.total} "
                    f"prompts ({what} step {d.step}, stage {stage_no} of 2)")
        return (f"{Stage(d.stage).label} — step {d.step}/{d.total_steps} · {d.passes:.1f} passes "
                f"(stage {stage_no} of 2)")

    def _eta(self, d: TrainingStep, running: bool) -> str:
        eta = ""
        if running and len(self._rates) >= 2:
            (t0, s0), (t1, s1) = self._rates[0], self._rates[-1]
            if s1 > s0 and t1 > t0:
                # at most: the remaining steps, plus one recall check per stage left (its last duration)
                stages_left = 2 - Stage(d.stage).index
                rest = (sum(self.stage_steps) - d.global_step) * (t1 - t0) / (s1 - s0) + stages_left * self._check_s
                eta = f" · ETA {hms(rest)} at most"
        elif running and self._estimate is not None:  # not timed yet: what is left of the estimate
            eta = f" · ETA about {hms(self._estimate.estimated_s - (time.perf_counter() - self._t0))}"
        if self._estimate is not None:
            eta += f" (estimated {format_duration(self._estimate.estimated_s)} in all)"
        return eta

    def recall_progress(self, c: RecallChecking) -> None:
        if c.done == 0:
            self._check_t0 = time.perf_counter()
        self._checking = c if c.done < c.total else None
        if c.done >= c.total:
            self._check_s = time.perf_counter() - self._check_t0
            # the check's time is not step time: restart the rate window
            self._rates.clear()
        self.update()

    def ended_early(self, d: StageDone) -> str | None:
        """A stage that ended before its planned steps (learned, no progress, time budget) is complete:
        the bar moves to its planned end (a run that ends early is at 100 %); returns the log line, or None."""
        why = EARLY_ENDS.get(d.end_reason)
        si = Stage(d.stage).index
        planned = self.stage_steps[si]
        if why is None or d.steps_done >= planned:
            return None
        self._early.append((d.stage, why, d.steps_done, planned))
        self._progress_floor = (self.stage_steps[0] if si == 1 else 0) + planned
        self.progress.setValue(self._progress_floor)
        return f"{d.stage} stopped early: {why} at step {d.steps_done} of {planned}"

    def _early_note(self) -> str:
        """' — tuning stopped early: learned at step 100 of 125' for each stage that ended early, or ''."""
        return "".join(f" — {Stage(stage).short} stopped early: {why} at step {done} of {planned}"
                       for stage, why, done, planned in self._early)

    def failed(self) -> None:
        """The run failed: the caller's "Failed" label stays; the estimate of a run that failed before its first step
        is gone (a step's numbers stay)."""
        self._ended = True
        self.stage_label.setText("Failed")
        if self.last is None:
            self.speed_label.setText("")

    def run_done(self, d: RunDone) -> None:
        """The run's end: its verdict, or where it stopped."""
        self._checking = None
        self._ended = True
        if d.finished and d.verdict:
            self.stage_label.setText(d.verdict + (f"; {d.general}" if d.general else "") + self._early_note()
                                     + ("" if d.learned else f" — to learn the rest: {d.advice}"))
        elif d.finished and self.check_cut:  # (it said "no recall check" of a check that a stop cut short)
            self.stage_label.setText("Training finished; its last recall check was stopped, so there is no verdict "
                                     "— try the model on the Chat tab")
        elif d.finished:
            self.stage_label.setText("Training finished (no recall check) — try the model on the Chat tab")
        elif d.stopped:
            text = "Stopped"
            if d.checkpoint:
                stage = d.stage_index
                steps = self.stage_steps[stage] if stage < 2 else 0
                text += f" at stage {stage + 1} step {d.stage_step} of {steps} — Resume to continue"
                if not d.replaced:
                    text += f" ({KEPT_NOTE})"
            self.stage_label.setText(text)

    def finished(self, stopping: bool) -> None:
        """The worker's thread ended: last redraw; a busy bar goes back to empty."""
        self.update()
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
        if stopping and not self._ended:  # the run's end (run_done, failed) stays: a stop in the last recall check
            self.stage_label.setText("Stopped")  # ends it "finished" without a verdict, not plain "Stopped"

    def show_saved(self, position: tuple[int, int, list[int]] | None, folder: bool, has_plots: bool,
                   status: str, resumable: bool, kept: bool) -> None:
        """Label and bar of a project just opened, from its checkpoint's position (stage index, stage step,
        [steps per stage]; None when no checkpoint is readable) and the latest run's saved status."""
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        if position is None:
            self.stage_label.setText("Not started" if not folder else
                                     "Trained model ready" if has_plots else NO_PLOTS_NOTE)
            return
        stage, step, steps = position
        total = sum(steps)
        if total > 0:
            done = total if stage >= 2 else (steps[0] if stage == 1 else 0) + step
            self.progress.setRange(0, total)
            self.progress.setValue(min(total, done))
        if not resumable:
            self.stage_label.setText(NO_PLOTS_NOTE if not has_plots else status if status.startswith(FINAL_STATUS)
                                     else "Trained model ready — try it on the Chat tab")
            return
        text = f"Stopped at stage {stage + 1} step {step} of {steps[stage]} — Resume to continue"
        self.stage_label.setText(text + (f" ({KEPT_NOTE})" if kept else ""))
