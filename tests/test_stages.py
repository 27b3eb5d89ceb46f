"""core/stages.py: the dialogue stage is saved as "dialogues"; what earlier versions saved as "tune"
(checkpoints' config.json, GGUF training config, project forms, history files) still reads as it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.checkpoint_meta import CheckpointError, CheckpointMeta
from core.config import StageConfig, TrainConfig
from core.stages import OLD_VALUES, STAGES, Stage, upgrade_keys

OLD_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint_v1" / "config.json"  # written with "tune"
OLD = next(iter(OLD_VALUES))


def test_the_values_say_what_each_stage_trains_and_the_old_value_names_the_dialogue_stage():
    assert [s.value for s in STAGES] == ["pretrain", "dialogues"] and f"{Stage.DIALOGUES}" == "dialogues"
    assert OLD == "tune" and Stage(OLD) is Stage.parse(OLD) is Stage.DIALOGUES
    assert Stage.parse("pretrain") is Stage.PRETRAIN and Stage.parse(Stage.DIALOGUES) is Stage.DIALOGUES
    for bad in ("sft", "", None, 1):
        with pytest.raises(ValueError, match=r"is not a stage \(pretrain, dialogues\)"):
            Stage.parse(bad)
    assert Stage.DIALOGUES.flag == "tune" and Stage.PRETRAIN.flag == "pretrain"  # the CLI's --tune-steps stays


def test_upgrade_keys_renames_only_an_old_stage_key_and_the_new_one_wins():
    old = {"tune": 1, "tune.lr": 0.5, "pretrain.lr": 0.1, "tuned": 2, "seed": 3}
    assert upgrade_keys(old) == {"dialogues": 1, "dialogues.lr": 0.5, "pretrain.lr": 0.1, "tuned": 2, "seed": 3}
    assert upgrade_keys({"tune.lr": 0.5, "dialogues.lr": 0.25}) == {"dialogues.lr": 0.25}
    assert Stage.DIALOGUES.key_in({"tune": {}}) == "tune" and Stage.DIALOGUES.key_in({}) == "dialogues"


def test_a_train_config_saved_with_the_old_key_reads_the_same():
    tc = TrainConfig(dialogues=StageConfig(steps=7, lr=1e-3))
    saved = tc.to_dict()
    assert "dialogues" in saved and OLD not in saved
    old = {(OLD if k == "dialogues" else k): v for k, v in saved.items()}
    assert TrainConfig.from_dict(old) == tc == TrainConfig.from_dict(saved)


def test_an_old_checkpoint_meta_with_the_old_key_reads_its_dialogue_stage():
    d = json.loads(OLD_CHECKPOINT.read_text())
    assert OLD in d["train"] and "dialogues" not in d["train"]
    m = CheckpointMeta.from_dict(d)
    assert m.train.dialogues == StageConfig(**d["train"][OLD])
    assert '"dialogues"' in m.to_json() and f'"{OLD}"' not in m.to_json()  # written back under the new key
    d["train"][OLD] = {**d["train"][OLD], "lr": "x"}
    with pytest.raises(CheckpointError, match=r"field 'train\.tune\.lr'"):  # named as the file has it
        CheckpointMeta.from_dict(d)


def test_a_history_row_of_the_old_stage_reads_as_the_dialogue_stage():
    from gui.history import HistoryError, parse_history

    runs = parse_history({"runs": [{"recall": [[OLD, "dialogue", "q", "a", "a", True],
                                               ["pretrain", "fact", "f", "x", "x", True]]}]})["runs"]
    assert [row[0] for row in runs[0]["recall"]] == ["dialogues", "pretrain"]
    with pytest.raises(HistoryError, match=r"runs\[0\]\.recall\[0\]\[0\]: 'sft' is not a stage"):
        parse_history({"runs": [{"recall": [["sft", "dialogue", "q", "a", "a", True]]}]})
