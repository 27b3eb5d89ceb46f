"""CheckpointMeta (the one reader/writer of config.json), the version-1 fixture, resume rules, and every
damaged-file case of issue 11 as a one-line error (never a traceback)."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from core.checkpoint import (FORMAT_VERSION, CheckpointError, CheckpointMeta, NonFiniteError, load_checkpoint,
                             load_model, resume_position, save_checkpoint)
from core.cli import main
from core.dataset import Dataset, load_dataset

FIXTURE = Path(__file__).parent / "data" / "checkpoint_v1"


@pytest.fixture
def ck(tmp_path) -> Path:
    """A copy of the version-1 checkpoint written by the app before atomic checkpoints."""
    d = tmp_path / "ck"
    shutil.copytree(FIXTURE, d)
    return d


def one_line_error(capsys, rc: int) -> str:
    """Assert the CLI failed with exit 2 and exactly one error line, no traceback; return the line."""
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("opencl-llm: error: "), err
    return lines[0]


def edit_config(folder: Path, fn) -> None:
    path = folder / "config.json"
    d = json.loads(path.read_text())
    path.write_text(json.dumps(fn(d)))


# ------------------------------------------------------------------------------------ the format
def test_version_1_fixture_loads_with_its_state():
    loaded = load_checkpoint(FIXTURE)
    m = loaded.checkpoint
    assert m.version == 1 and m.tokenizer_hash == ""  # written by the app before this format
    assert (m.stage_index, m.stage_step, m.adam_step) == (2, 0, 6) and m.done
    assert m.model.d_model == 32 and m.train.dialogues.steps == 3 and loaded.tokenizer.vocab_size == 300
    assert all(np.all(np.isfinite(w)) for w in loaded.weights.values())


def test_meta_round_trip_and_current_version(ck):
    m = CheckpointMeta.read(ck)
    again = CheckpointMeta.from_json(m.to_json())
    assert again.version == FORMAT_VERSION
    assert replace(again, version=1) == m
    assert "NaN" not in replace(m, last_loss=float("nan")).to_json()  # strict JSON


@pytest.mark.parametrize("edit, message", [
    (lambda d: [1, 2, 3], "field '(top level)' must be an object, got a list"),
    (lambda d: {k: v for k, v in d.items() if k != "train"}, "field 'train' is missing"),
    (lambda d: d | {"train": d["train"] | {"tune": 5}}, "field 'train.tune' must be an object, got a number"),
    (lambda d: d | {"train": d["train"] | {"tune": d["train"]["tune"] | {"lr": "x"}}}, "field 'train.tune.lr' must be"),
    (lambda d: d | {"model": d["model"] | {"rope_theta": 1e-30}}, "field 'model.rope_theta' must be >= 1"),
    (lambda d: d | {"model": {k: v for k, v in d["model"].items() if k != "d_model"}}, "field 'model.d_model' is missing"),
    (lambda d: d | {"stage_index": 7}, "field 'stage_index' must be within 0..2, got 7"),
    (lambda d: d | {"stage_step": -1}, "field 'stage_step' must be >= 0, got -1"),
    (lambda d: d | {"adam_step": "6"}, "field 'adam_step' must be an integer, got a string"),
    (lambda d: d | {"format": "other"}, "field 'format' is 'other'"),
    (lambda d: d | {"version": 99}, "field 'version' is 99: written by a newer app version"),
    (lambda d: d | {"last_loss": [1]}, "field 'last_loss' must be a number or null"),
    (lambda d: d | {"base": {"general_replay": {"first_dialogue": -1, "questions": [], "unfinished": []}}},
     "field 'base.general_replay.first_dialogue' must be >= 0, got -1"),
    (lambda d: d | {"base": {"general_replay": {"first_dialogue": 2, "questions": "Who?", "unfinished": []}}},
     "field 'base.general_replay.questions' must be"),
])
def test_bad_config_fields_name_file_and_field(ck, edit, message):
    edit_config(ck, edit)
    with pytest.raises(CheckpointError) as e:
        CheckpointMeta.read(ck)
    text = str(e.value)
    assert text.startswith(f"{ck / 'config.json'}: ") and message in text and "\n" not in text


def test_broken_and_deep_config_json(ck):
    (ck / "config.json").write_text("{\n  \"format\": ")
    with pytest.raises(CheckpointError, match=r"config.json:2: broken JSON"):
        CheckpointMeta.read(ck)
    (ck / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        CheckpointMeta.read(ck)
    (ck / "config.json").write_bytes(b" " * (2 << 20))
    with pytest.raises(CheckpointError, match="larger than 1 MiB"):
        CheckpointMeta.read(ck)


# ------------------------------------------------------------------------------------ CLI cases
@pytest.mark.parametrize("command", ["chat", "export", "resume"])
def test_config_list_is_one_line_error(ck, tmp_path, capsys, command):
    (ck / "config.json").write_text("[1,2,3]")
    argv = {"chat": ["chat", "--model", str(ck), "--prompt", "hi"],
            "export": ["export", "--model", str(ck), "--out", str(tmp_path / "x.gguf")],
            "resume": ["train", "--resume", str(ck), "-q"]}[command]
    line = one_line_error(capsys, main(argv))
    assert "config.json: field '(top level)' must be an object" in line


def test_missing_train_on_resume_and_tune_5_on_export(ck, tmp_path, capsys):
    edit_config(ck, lambda d: {k: v for k, v in d.items() if k != "train"})
    assert "field 'train' is missing" in one_line_error(capsys, main(["train", "--resume", str(ck), "-q"]))
    edit_config(ck, lambda d: d | {"train": {"pretrain": {}, "tune": 5}})
    line = one_line_error(capsys, main(["export", "--model", str(ck), "--out", str(tmp_path / "x.gguf")]))
    assert "field 'train.tune' must be an object" in line


def test_tokenizer_of_another_model(ck, tmp_path, capsys):
    from core.tokenizer import Tokenizer

    other = Tokenizer.train(["a completely different text about other things"] * 20, 400)
    (ck / "tokenizer.json").write_text(other.to_json())
    line = one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))
    assert "tokenizer.json" in line and "another model" in line
    # A version-2 checkpoint catches even a same-sized tokenizer: its hash is recorded.
    loaded = load_checkpoint(FIXTURE)
    ds, _ = load_dataset(FIXTURE / "dataset.json")
    new = save_checkpoint(tmp_path / "v2", loaded.weights, None, loaded.checkpoint, loaded.tokenizer, ds)
    text = json.loads((new / "tokenizer.json").read_text())
    text["added_tokens"][0]["content"] = "<|bos2|>"  # same size, another tokenizer
    (new / "tokenizer.json").write_text(json.dumps(text))
    with pytest.raises(CheckpointError, match="does not belong to this checkpoint"):
        load_checkpoint(new)


def test_damaged_weights_and_nan_weights(ck, capsys):
    (ck / "weights.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert "weights.npz: unreadable" in one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))
    loaded = load_checkpoint(FIXTURE)
    w = dict(loaded.weights)
    w["output.weight"] = w["output.weight"].copy()
    w["output.weight"][0, 0] = np.nan
    np.savez(ck / "weights.npz", **w)
    assert "NaN or infinite" in one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))


def test_a_weights_file_of_other_contents_is_one_line_not_a_traceback(ck, capsys):
    """A member that is no array, a string tensor, or a small file unpacking to far more than the model's
    tensors (a zip bomb) are refused before anything large is read."""
    import zipfile

    with zipfile.ZipFile(ck / "weights.npz", "w") as zf:
        zf.writestr("readme.txt", "hello")
    assert "is not a NumPy array" in one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))
    np.savez(ck / "weights.npz", **{"token_embd.weight": np.array(["a", "b"])})
    assert "not a real number type" in one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))
    with zipfile.ZipFile(ck / "weights.npz", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("token_embd.weight.npy", bytes(256 << 20))  # 256 MiB of zeros, a few hundred KiB packed
    assert (ck / "weights.npz").stat().st_size < 2 << 20
    assert "unpacks to 256.0 MiB" in one_line_error(capsys, main(["chat", "--model", str(ck), "--prompt", "hi"]))


def test_nothing_non_finite_is_saved(tmp_path):
    loaded = load_checkpoint(FIXTURE)
    ds, _ = load_dataset(FIXTURE / "dataset.json")
    args = (loaded.checkpoint, loaded.tokenizer, ds)
    good = save_checkpoint(tmp_path / "ck", loaded.weights, None, *args)
    before = (good / "weights.npz").read_bytes()
    bad = {k: v * np.float32(np.inf) for k, v in loaded.weights.items()}
    with pytest.raises(NonFiniteError, match="NaN or infinite values; not saved"):
        save_checkpoint(good, bad, None, *args)
    assert (good / "weights.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_deep_jsonl_and_dev_zero_and_folders(tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "a fact"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    ds, problems = load_dataset(deep)
    assert ds.facts == ["a fact"] and "nested too deeply" in str(problems[0]) and ":2:" in str(problems[0])
    deep_json = tmp_path / "deep.json"
    deep_json.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in one_line_error(capsys, main(["train", "--data", str(deep_json), "--out",
                                                              str(tmp_path / "o"), "-q"]))
    assert "not a regular file" in one_line_error(capsys, main(["train", "--data", "/dev/zero", "--out",
                                                               str(tmp_path / "o"), "-q"]))
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    assert "not a regular file" in one_line_error(capsys, main(["train", "--data", str(fifo), "--out",
                                                               str(tmp_path / "o"), "-q"]))


def test_cr_only_bad_byte_line(tmp_path):
    from core.dataset import DatasetError

    p = tmp_path / "cr.txt"
    p.write_bytes(b"one\rtwo\rthr\xffee\r")
    with pytest.raises(DatasetError, match=r"cr.txt:3: the file is not UTF-8"):
        load_dataset(p)


def test_resume_dataset_error_names_the_path_once(ck, capsys):
    (ck / "dataset.json").write_text('{"format": "opencl-llm-studio-dataset", "facts": [1]}')
    line = one_line_error(capsys, main(["train", "--resume", str(ck), "-q"]))
    assert line.count(str(ck / "dataset.json")) == 1


def test_out_folder_with_user_files_is_refused(tmp_path, capsys):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "thesis.txt").write_text("precious")
    line = one_line_error(capsys, main(["train", "--out", str(out), "-q", "--pretrain-steps", "1"]))
    assert "not a checkpoint" in line and (out / "thesis.txt").read_text() == "precious"


@pytest.mark.parametrize("flag, message", [
    (["--pretrain-lr", "1e308", "--tune-lr", "1e308"], "--pretrain-lr: must be <= 1"),
    (["--tune-lr", "1e30"], "--tune-lr: must be <= 1"),
    (["--rope-theta", "1e-30"], "--rope-theta: must be >= 1"),
])
def test_learning_rate_and_rope_theta_bounds(tmp_path, capsys, flag, message):
    assert message in one_line_error(capsys, main(["train", *flag, "--out", str(tmp_path / "o"), "-q"]))
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------ GGUF cases
def _fixture_gguf(tmp_path) -> Path:
    from core.gguf_io import export_gguf

    return export_gguf(load_checkpoint(FIXTURE), tmp_path / "m.gguf").path


def test_gguf_without_merges_is_refused(tmp_path):
    from core.gguf_io import GGUFError
    from tests.test_gguf import rewrite

    src = _fixture_gguf(tmp_path)
    dst = rewrite(src, tmp_path / "nomerges.gguf", drop=(gguf.Keys.Tokenizer.MERGES,))
    with pytest.raises(GGUFError, match=gguf.Keys.Tokenizer.MERGES + " is missing"):
        load_model(dst)


def test_gguf_without_extension_loads(tmp_path):
    src = _fixture_gguf(tmp_path)
    plain = tmp_path / "model-file"
    shutil.copy(src, plain)
    back = load_model(plain)
    assert back.meta["format"] == "gguf" and back.checkpoint is None


def test_export_on_full_disk_message(tmp_path, monkeypatch):
    import errno

    from core.gguf_io import export_gguf

    import gguf

    def short_write(self, *a, **k):  # what numpy's tofile says when the disk fills under the writer
        raise OSError("4096 requested and 3016 written")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", short_write)
    with pytest.raises(OSError) as e:
        export_gguf(load_checkpoint(FIXTURE), tmp_path / "m.gguf")
    assert e.value.errno == errno.ENOSPC and "the disk is full" in str(e.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ resume rules
def test_resume_position_rules():
    m = CheckpointMeta.read(FIXTURE)  # finished: 3 pretrain + 3 tune steps
    more_tune = replace(m.train, dialogues=replace(m.train.dialogues, steps=5))
    assert resume_position(m, m.train) == (2, 0)
    assert resume_position(m, more_tune) == (1, 3)
    more_pre = replace(m.train, pretrain=replace(m.train.pretrain, steps=5))
    with pytest.raises(CheckpointError, match="already begun tuning"):
        resume_position(m, more_pre)
    after_pre = replace(m, stage_index=1, stage_step=0)
    assert resume_position(after_pre, more_pre) == (0, 3)


def test_v1_fixture_chats_and_resumes_with_more_steps(ck, device, capsys):
    assert main(["chat", "--model", str(ck), "--prompt", "Hello", "--max-tokens", "4"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--tune-steps", "5", "-q"]) == 0
    out = capsys.readouterr().out
    assert "stage 2 of 2, step 3" in out and "stage 3" not in out
    m = CheckpointMeta.read(ck)
    assert m.version == FORMAT_VERSION and m.adam_step == 8 and m.done and m.train.dialogues.steps == 5
    assert m.tokenizer_hash and load_checkpoint(ck).checkpoint == m
    # a finished run resumed without more steps trains nothing and says so
    assert main(["train", "--resume", str(ck), "-q"]) == 0
    assert "both stages are complete" in capsys.readouterr().out
    assert CheckpointMeta.read(ck).adam_step == 8


def test_resume_refuses_a_changed_dataset_unless_allowed(ck, tmp_path, device, capsys):
    ds, _ = load_dataset(ck / "dataset.json")
    from core.dataset import save_dataset

    save_dataset(Dataset(ds.facts + ["Swapped in later."], ds.dialogues), ck / "dataset.json")
    line = one_line_error(capsys, main(["train", "--resume", str(ck), "--tune-steps", "4", "-q"]))
    assert "not the dataset this run was trained on" in line and "--allow-new-data" in line
    old_hash = CheckpointMeta.read(ck).dataset_hash
    assert main(["train", "--resume", str(ck), "--tune-steps", "4", "--allow-new-data", "-q"]) == 0
    m = CheckpointMeta.read(ck)
    assert m.previous_dataset_hashes == (old_hash,) and m.dataset_hash != old_hash and m.adam_step == 7
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_text("Completely new fact one.\nCompletely new fact two.\n")
    line = one_line_error(capsys, main(["train", "--resume", str(ck), "--data", str(other)]))
    assert f"--data: {other} is not the dataset this run was trained on" in line and "--allow-new-data" in line
    assert main(["train", "--resume", str(ck), "--data", str(other), "--allow-new-data", "--tune-steps", "5", "-q"]) == 0
    m2 = CheckpointMeta.read(ck)
    assert m2.previous_dataset_hashes == (old_hash, m.dataset_hash)
    assert load_dataset(ck / "dataset.json")[0].facts == ["Completely new fact one.", "Completely new fact two."]


# ------------------------------------------------------------------------------------ chat room
def test_chat_drops_old_turns_to_keep_room_for_the_answer():
    from core.chat import ChatSession

    loaded = load_checkpoint(FIXTURE)

    class Gen:  # _prompt needs only the config
        config = loaded.config

    s = ChatSession(Gen(), loaded.tokenizer)
    s.history = [(f"q{i}", f"a{i}") for i in range(20)]
    lengths = []
    for room in (1, 8, 24, 40):
        ids = s._prompt("Can penguins fly?", room)
        assert len(ids) + room <= loaded.config.context_length
        lengths.append(len(ids))
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]  # more room, fewer old turns


def test_leftovers_of_old_and_new_saves_are_removed_on_load(ck, tmp_path):
    from core.atomic import MARK, _host, backup_path

    (ck / ".optimizer.npz.0a2f3e1b.tmp").write_bytes(b"x" * 1000)  # what a kill during a file write leaves
    dead = tmp_path / f".ck.tmp-{_host()}-999999999-abc"  # an unfinished save of a process that is gone
    dead.mkdir()
    (dead / MARK).touch()
    (dead / "weights.npz").write_bytes(b"part")
    load_checkpoint(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"] and not any(p.name.endswith(".tmp") for p in ck.iterdir())
    (ck / MARK).touch()  # cut between the two renames of a swap (which marks the old folder): the backup is the
    ck.rename(backup_path(ck))  # checkpoint
    assert load_checkpoint(ck).checkpoint.adam_step == 6 and ck.is_dir() and not backup_path(ck).exists()
    assert not (ck / MARK).exists()
    assert load_checkpoint(ck).checkpoint.adam_step == 6 and ck.is_dir() and not backup_path(ck).exists()


_TINY_1 = ["--preset", "Tiny", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "2", "--ffn-dim",
           "64", "--context-length", "64", "--batch-size", "4", "--vocab-size", "300", "-q", "--pretrain-steps", "2",
           "--tune-steps", "2"]


def _sigint_in_recall_check(monkeypatch, at_call: int) -> list:
    """A real SIGINT sent as the ``at_call``-th recall check (1: the pretrain stage's end, 2: the dialogues
    stage's) begins; returns the list that gets an item each time that check asks whether to stop."""
    import os
    import signal

    from core import trainer as trainer_mod

    real, calls, asked = trainer_mod.recall_check, [], []

    def recall_with_ctrl_c(model, tok, dataset, kinds=trainer_mod.KINDS, should_stop=None, **kw):
        calls.append(1)
        if len(calls) != at_call:
            return real(model, tok, dataset, kinds, should_stop, **kw)
        os.kill(os.getpid(), signal.SIGINT)

        def stop():
            asked.append(1)
            return should_stop()
        return real(model, tok, dataset, kinds, stop, **kw)

    monkeypatch.setattr(trainer_mod, "recall_check", recall_with_ctrl_c)
    return asked


def test_ctrl_c_during_the_recall_check_keeps_the_finished_stage(tmp_path, device, capsys, monkeypatch):
    """A real SIGINT arriving in the end-of-stage recall check: the check stops at its next prompt, the
    finished stage was saved before it, the CLI exits 130 and the run resumes at the next stage."""
    prompts = _sigint_in_recall_check(monkeypatch, 1)
    out = tmp_path / "ck"
    assert main(["train", *_TINY_1, "--out", str(out)]) == 130
    assert "stopped during the recall check" in capsys.readouterr().out
    assert len(prompts) == 1  # honoured before the first batch was decoded
    m = CheckpointMeta.read(out)
    assert (m.stage_index, m.stage_step, m.adam_step) == (1, 0, 2)


def test_ctrl_c_during_the_final_recall_check_names_recall_not_resume(tmp_path, device, capsys, monkeypatch):
    """A SIGINT in the last stage's recall check: the model is saved with both stages done, so a resume would
    find nothing to train and give no verdict; the message names `recall` for what it learned instead."""
    _sigint_in_recall_check(monkeypatch, 2)
    out = tmp_path / "ck"
    assert main(["train", *_TINY_1, "--out", str(out)]) == 130
    said = capsys.readouterr().out
    assert "stopped during the final recall check" in said and f"opencl-llm recall --model {out}" in said
    assert "--resume" not in said
    m = CheckpointMeta.read(out)
    assert (m.stage_index, m.stage_step, m.adam_step) == (2, 0, 4)


def test_ctrl_c_between_two_stages_says_stopped(tmp_path, device, capsys, monkeypatch):
    """A SIGINT that arrives as the pretrain stage's recall check ends (its table whole): the run stops before the
    dialogue stage's first step and says so, exit 130, the stage's checkpoint kept. It said "model saved to ..." and
    a verdict, exit 0, as of a finished run (a break-it helper's closed pipe at that moment)."""
    import os
    import signal

    from core import trainer as trainer_mod

    real = trainer_mod.Trainer.run

    def run_then_ctrl_c(self, *a, **k):  # the signal right after the pretrain stage's report, as its line is shown
        for ev in real(self, *a, **k):
            yield ev
            if isinstance(ev, trainer_mod.StageReport) and ev.stage == "pretrain":
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(trainer_mod.Trainer, "run", run_then_ctrl_c)
    out = tmp_path / "ck"
    assert main(["train", *_TINY_1, "--out", str(out)]) == 130
    said = capsys.readouterr().out
    assert f"stopped at dialogues step 0; checkpoint saved to {out} (continue with: opencl-llm train --resume " in said
    assert "model saved" not in said and "learned" not in said.lower(), said
    m = CheckpointMeta.read(out)
    assert (m.stage_index, m.stage_step, m.adam_step) == (1, 0, 2)


def test_a_read_that_starts_between_a_saves_renames_is_repeated_not_mixed(ck, tmp_path, monkeypatch):
    """The flaky crash test's window, made deterministic: the folder is renamed away just before the
    reader pins it (so nothing is pinned), the next save's folder then appears under the name, and a
    third save swaps in between the reads of config.json and weights.npz. The read is repeated and gets
    one save's files; it used to report 'weights.npz: does not belong to this checkpoint'."""
    import core.checkpoint as cp
    from core.atomic import backup_path

    loaded = load_checkpoint(ck)
    saves = {}
    for tag, shift in (("b", 1.0), ("c", 2.0)):
        saves[tag] = tmp_path / f"save_{tag}"
        save_checkpoint(saves[tag], {k: w + shift for k, w in loaded.weights.items()}, None, loaded.checkpoint,
                        loaded.tokenizer, Dataset(["A fact."], []))
    real_prepare, real_load, real_read = cp._prepare, cp._load_folder, cp._read_arrays
    events = []

    def prepare_then_first_rename(directory):
        d = real_prepare(directory)
        if not events:
            ck.rename(backup_path(ck))           # the writer's first rename: nothing to pin under the name
            events.append("renamed away")
        return d

    def load_after_second_rename(d, directory, dir_fd=None):
        if events == ["renamed away"]:
            shutil.rmtree(backup_path(ck))
            saves["b"].rename(ck)                # the writer's second rename
            events.append("next save in place")
        return real_load(d, directory, dir_fd)

    def read_after_another_save(path, dir_fd=None, limit=cp.MAX_ARRAYS_BYTES):
        if events[-1] == "next save in place":
            shutil.rmtree(ck)
            saves["c"].rename(ck)                # another save, between config.json and weights.npz
            events.append("swapped between the reads")
        return real_read(path, dir_fd, limit)

    monkeypatch.setattr(cp, "_prepare", prepare_then_first_rename)
    monkeypatch.setattr(cp, "_load_folder", load_after_second_rename)
    monkeypatch.setattr(cp, "_read_arrays", read_after_another_save)
    got = load_checkpoint(ck)
    assert events == ["renamed away", "next save in place", "swapped between the reads"]
    for k, w in loaded.weights.items():
        np.testing.assert_array_equal(got.weights[k], w + 2.0)  # save c's, whole
