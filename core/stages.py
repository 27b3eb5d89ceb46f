"""The two stages of a training run, named once (issue 23: no stage name typed as a string elsewhere).

Stage 1 learns every token of every fact (with a share of question-and-answer examples mixed in);
stage 2 learns the assistant's answers of the dialogues while it replays the facts. The ``value`` of
each member is the key saved in checkpoints, project files and ``TrainConfig`` fields ("pretrain",
"tune"), kept as it is so that every checkpoint written before this module still loads.
"""
from __future__ import annotations

from enum import Enum


class Stage(str, Enum):
    """A training stage. ``Stage("tune") is Stage.DIALOGUES``; ``index`` is 0 or 1 (the order of a run)."""

    PRETRAIN = "pretrain"
    DIALOGUES = "tune"

    @property
    def index(self) -> int:
        """0 for the first stage, 1 for the second (position in ``TrainConfig.stages`` and in plans)."""
        return 0 if self is Stage.PRETRAIN else 1

    @property
    def label(self) -> str:
        """The stage as the app's Training tab heads it, e.g. "Stage 1: pretraining on facts"."""
        return _LABELS[self]

    @property
    def short(self) -> str:
        """One word for progress lines and plan text: "pretraining" or "tuning"."""
        return _SHORT[self]

    @classmethod
    def at(cls, index: int) -> Stage:
        """The stage at position ``index`` (0 or 1); raises IndexError for any other position."""
        return _ORDER[index]

    def __str__(self) -> str:  # f"{stage}" gives the saved key, as the strings before the enum did
        return self.value


_ORDER = (Stage.PRETRAIN, Stage.DIALOGUES)
STAGES = _ORDER
"""Both stages in run order."""
_LABELS = {Stage.PRETRAIN: "Stage 1: pretraining on facts", Stage.DIALOGUES: "Stage 2: tuning on dialogues"}
_SHORT = {Stage.PRETRAIN: "pretraining", Stage.DIALOGUES: "tuning"}
