"""What the Training tab checks and gathers before it starts a TrainWorker: a new run, a resumed one, or a
finished run continued with its held-out questions (no widgets here besides the message boxes it asks)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QWidget

from core.wording import count_words
from gui import dialogs
from gui.app_state import AppState
from gui.project import checkpoint_meta

if TYPE_CHECKING:
    from core.config import ModelConfig, TrainConfig
    from gui.resume import ResumePlan


class NotStarted(Exception):
    """Why a run did not start: the message for the tab's banner ("" when the user said no)."""


@dataclass
class Launch:
    """A run ready to start: its folder and TrainWorker keyword arguments, the lines for the log."""

    run_dir: Path
    resume: bool
    train_config: TrainConfig
    worker_kwargs: dict  # besides device, checkpoint, run_dir, resume and val_every
    log: list[str] = field(default_factory=list)
    first_run_s: float = 0.0  # the Auto plan's one-time costs of this device (0: none or not planned)


def validation_interval(train_config: TrainConfig) -> int:
    """Steps between validation points: about 15 per run, at least 10 steps apart."""
    return max(10, (train_config.pretrain.steps + train_config.dialogues.steps) // 15)


def saved_position(meta) -> tuple[int, int, list[int]] | None:
    """(stage_index, stage_step, [pretrain steps, tune steps]) of a checkpoint's CheckpointMeta (None: none)."""
    if meta is None:
        return None
    return meta.stage_index, meta.stage_step, [meta.train.pretrain.steps, meta.train.dialogues.steps]


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


def new_run_does(state: AppState, model: str = "a new model") -> str:
    """What Start does: "trains <model> from scratch", or "fine-tunes <the base file>" (Hyperparameters ▸
    Start from; "… with LoRA adapters of rank r" when it trains adapters)."""
    base, lora = state.base_model(), state.lora()
    if not base:
        return f"trains {model} from scratch"
    return f"fine-tunes {Path(base).name}" + (f" with LoRA adapters of rank {lora.rank}" if lora else "")


def heldout_offered(state: AppState) -> bool:
    """True when the project's finished run held fact questions out of training (they can be learned now)."""
    folder = state.trained_model_path()
    meta = checkpoint_meta(folder) if folder is not None else None
    return meta is not None and meta.done and bool(meta.train.heldout)


def heldout_continuation(state: AppState) -> tuple[Path, TrainConfig]:
    """(folder, TrainConfig) continuing the finished run with its held-out questions trained too
    (core.plan.with_heldout_trained); raises NotStarted when it kept none."""
    from core.plan import with_heldout_trained

    folder = state.trained_model_path()
    meta = checkpoint_meta(folder) if folder is not None else None
    if meta is None or not meta.train.heldout:
        raise NotStarted("This project's model kept no questions out of training.")
    return folder, with_heldout_trained(meta.train)


def prepare_launch(state: AppState, parent: QWidget, resume: bool,
                   continue_with: tuple[Path, TrainConfig] | None = None) -> Launch:
    """The run to start; raises NotStarted (with the banner's text) when the device, the settings, the
    dataset or the folder are not usable, or when the user declines a message box."""
    if state.device_info() is None:
        raise NotStarted("No OpenCL device: see the Device tab.")
    configs = state.configs()
    if configs is None:
        raise NotStarted(f"Fix the hyperparameters first: {state.config_error()}")
    mc, tc = configs
    if resume:
        _refuse_while_blocked(state)
        return _resumed(state, parent, mc, tc, continue_with)
    return _new(state, parent, mc, tc)


def _refuse_while_blocked(state: AppState) -> None:
    """Raises NotStarted while the buttons are off (AppState.train_blocker: Auto still planning, so that
    its form holds the plan of the dataset before an edit)."""
    blocker = state.train_blocker()
    if blocker is not None:
        raise NotStarted(blocker)


def _resumed(state: AppState, parent: QWidget, mc: ModelConfig, tc: TrainConfig,
             continue_with: tuple[Path, TrainConfig] | None) -> Launch:
    run_dir = continue_with[0] if continue_with else state.resume_dir()
    if run_dir is None:
        raise NotStarted("There is no unfinished run to resume.")
    _refuse_unwritable(parent, run_dir)
    if continue_with:  # (folder, TrainConfig): a finished run continued with new settings
        return Launch(run_dir, True, continue_with[1], {"train_config": continue_with[1]},
                      ["training the held-out questions too"])
    plan = _plan_resume(state, parent, run_dir, mc, tc)
    return Launch(run_dir, True, plan.train_config, {"train_config": plan.train_config},
                  [f"resume uses the new setting {change}" for change in plan.applied])


def _new(state: AppState, parent: QWidget, mc: ModelConfig, tc: TrainConfig) -> Launch:
    dataset = state.dataset_copy()
    if not dataset.facts and not dataset.dialogues:
        raise NotStarted("The dataset is empty: add facts or dialogues on the Dataset tab.")
    problems = dataset.validate()
    if problems:
        raise NotStarted(f"Fix the dataset first ({count_words(len(problems), 'problem')}), e.g. {problems[0]}")
    _refuse_while_blocked(state)
    run_dir = state.new_run_dir()
    _refuse_unwritable(parent, run_dir)
    plan = state.plan()  # the Auto plan's time, its one-time costs included (core.plan.Plan)
    plan_s = (plan.run_s, plan.first_run_s if plan.first_run_note() else 0.0) if plan is not None else None
    kw = dict(dataset=dataset, model_config=mc, train_config=tc, base=state.base_model(), lora=state.lora(),
              plan_s=plan_s)
    return Launch(run_dir, False, tc, kw, first_run_s=plan_s[1] if plan_s else 0.0)


def _plan_resume(state: AppState, parent: QWidget, folder: Path, mc: ModelConfig, tc: TrainConfig) -> ResumePlan:
    """The gui.resume.ResumePlan for ``folder``; raises NotStarted when it cannot resume or the user declines."""
    from gui.project import checkpoint_problem
    from gui.resume import resume_plan

    meta = checkpoint_meta(folder)
    if meta is None:
        raise NotStarted(f"Cannot resume: {checkpoint_problem(folder)}.")
    plan = resume_plan(meta, mc, tc, state.dataset_copy())
    if plan.ignored:
        text = ("Resume continues the saved model and dataset; to use the new settings, Start a new run.\n\n"
                "Not used by Resume:\n" + "\n".join(f"• {x}" for x in plan.ignored))
        if plan.applied:
            text += "\n\nUsed by Resume:\n" + "\n".join(f"• {x}" for x in plan.applied)
        if not dialogs.ask(parent, "Resume the saved run?", text, yes="Resume"):
            raise NotStarted("")
    return plan


def _refuse_unwritable(parent: QWidget, run_dir: Path | None) -> None:
    """Raises NotStarted (after a message box) when the run's checkpoints could not be saved: a run in a
    read-only project failed after its first stage, with autosave failures only in the status bar."""
    problem = folder_write_problem(run_dir.parent) if run_dir is not None else None
    if problem is not None:
        dialogs.warn(parent, "Cannot train in this project folder", problem)
        raise NotStarted(problem)
