"""The two stages of a training run, named once (issue 23: no stage name typed as a string elsewhere).

Stage 1 learns every token of every fact (with a share of question-and-answer examples mixed in);
stage 2 learns the assistant's answers of the dialogues while it replays the facts. The ``value`` of
each member is the key saved in checkpoints, project files, history files and ``TrainConfig`` fields
("pretrain", "dialogues"). Files written before the dialogue stage was called "dialogues" name it
"tune": :data:`OLD_VALUES` is the one place that knows it, and every reader goes through
:meth:`Stage.parse`, :meth:`Stage.key_in` or :func:`upgrade_keys`.
"""
from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class Stage(str, Enum):
    """A training stage. ``index`` is 0 or 1 (the order of a run); ``Stage("tune")`` (an older
    version's value) is ``Stage.DIALOGUES``."""

    PRETRAIN = "pretrain"
    DIALOGUES = "dialogues"

    @classmethod
    def _missing_(cls, value: object) -> Stage | None:
        """A value older versions saved (:data:`OLD_VALUES`) names its stage; any other: ValueError."""
        return OLD_VALUES.get(value) if isinstance(value, str) else None

    @classmethod
    def parse(cls, value: object) -> Stage:
        """The stage a saved value names: a member's value or an older version's (:data:`OLD_VALUES`).

        Raises:
            ValueError: ``"'x' is not a stage (pretrain, dialogues)"``.
        """
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a stage ({', '.join(s.value for s in _ORDER)})") from None

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

    @property
    def flag(self) -> str:
        """The stage's part of ``opencl-llm train``'s options (``--pretrain-steps``, ``--tune-lr``, ...):
        the users' flags, kept as they were when the value changed."""
        return _FLAGS[self]

    def key_in(self, saved: Mapping) -> str:
        """The key under which ``saved`` (a file's mapping) holds this stage: its value, else an older
        version's value that is there, else the value (then missing)."""
        for key in (self.value, *(old for old, s in OLD_VALUES.items() if s is self)):
            if key in saved:
                return key
        return self.value

    @classmethod
    def at(cls, index: int) -> Stage:
        """The stage at position ``index`` (0 or 1); raises IndexError for any other position."""
        return _ORDER[index]

    def __str__(self) -> str:  # f"{stage}" gives the saved key, as the strings before the enum did
        return self.value


_ORDER = (Stage.PRETRAIN, Stage.DIALOGUES)
STAGES = _ORDER
"""Both stages in run order."""
OLD_VALUES = {"tune": Stage.DIALOGUES}
"""Values that earlier versions of the app wrote for a stage (config.json's ``train``, project and history files)."""
_LABELS = {Stage.PRETRAIN: "Stage 1: pretraining on facts", Stage.DIALOGUES: "Stage 2: tuning on dialogues"}
_SHORT = {Stage.PRETRAIN: "pretraining", Stage.DIALOGUES: "tuning"}
_FLAGS = {Stage.PRETRAIN: "pretrain", Stage.DIALOGUES: "tune"}


def upgrade_keys(saved: Mapping) -> dict:
    """``saved`` with each key that is an older version's stage value, alone or before a dot
    (``"tune"``, ``"tune.lr"``), renamed to the stage's value (``"dialogues"``, ``"dialogues.lr"``); a key
    of the current name wins over its old twin. Other keys are kept as they are."""
    out: dict = {}
    for key, value in saved.items():
        head, dot, rest = key.partition(".") if isinstance(key, str) else (key, "", "")
        new = f"{OLD_VALUES[head].value}{dot}{rest}" if head in OLD_VALUES else key
        if new == key or new not in saved:
            out[new] = value
    return out
