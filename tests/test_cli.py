"""The `opencl-llm` command line: resume, output folders, errors as one line, interactive chat."""
from __future__ import annotations

import io
import json


from core.cli import main

TINY = ["--preset", "Tiny", "--d-model", "32", "--ffn-dim", "64", "--context-length", "64", "--batch-size", "4",
        "--vocab-size", "300", "-q"]


def train(tmp_path, *extra):
    return main(["train", *TINY, *extra])


def stage_state(folder):
    meta = json.loads((folder / "config.json").read_text())
    return meta["stage_index"], meta["stage_step"], meta["train"]["tune"]["steps"]


def test_resume_continues_in_the_same_folder_with_new_steps(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "2") == 0
    assert stage_state(out) == (2, 0, 2)
    assert main(["train", "--resume", str(out), "--tune-steps", "5", "-q"]) == 0
    assert stage_state(out) == (2, 0, 5)  # saved back into --resume's folder, tune stage extended
    assert not (tmp_path / "opencl-llm-model").exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--d-model", "64", "-q"]) == 2
    assert "cannot change when resuming" in capsys.readouterr().err


def test_out_that_is_a_file_fails_before_training(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert train(tmp_path, "--out", str(f), "--pretrain-steps", "500") == 2
    err = capsys.readouterr().err
    assert "afile" in err and "not a folder" in err and "Traceback" not in err


def test_dataset_folder_and_missing_file_are_one_line_errors(tmp_path, capsys):
    assert train(tmp_path, "--data", str(tmp_path), "--out", str(tmp_path / "m")) == 2
    assert "is a folder" in capsys.readouterr().err
    assert train(tmp_path, "--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "m")) == 2
    assert "nope.txt" in capsys.readouterr().err


def test_too_big_model_is_refused_with_sizes(tmp_path, capsys):
    args = ["train", "--d-model", "4096", "--n-heads", "32", "--n-kv-heads", "32", "--ffn-dim", "16384",
            "--n-layers", "64", "--batch-size", "64", "--context-length", "2048", "--out", str(tmp_path / "m"), "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "Traceback" not in err


def test_export_into_a_folder_and_interactive_chat(tmp_path, capsys, monkeypatch):
    out = tmp_path / "model"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "3") == 0
    folder = tmp_path / "exports"
    folder.mkdir()
    assert main(["export", "--model", str(out), "--out", str(folder)]) == 0
    assert (folder / "model.gguf").is_file()
    capsys.readouterr()
    lines = "Where is Brindlewick?\n" + "word " * 200 + "\n\udce9t\u00e9?\n/exit\nnever read\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    assert main(["chat", "--model", str(out), "--max-tokens", "4"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("Assistant:") == 3  # the too-long message is answered with an error, the chat goes on
    assert "context_length" in shown
