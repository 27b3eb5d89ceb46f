"""The `opencl-llm` command line: resume, output folders, errors as one line, interactive chat."""
from __future__ import annotations

import io

import pytest

from core.cli import main

TINY = ["--preset", "Tiny", "--d-model", "32", "--ffn-dim", "64", "--context-length", "64", "--batch-size", "4",
        "--vocab-size", "300", "-q"]


def train(tmp_path, *extra):
    return main(["train", *TINY, *extra])


def stage_state(folder):
    from core.checkpoint import CheckpointMeta

    meta = CheckpointMeta.read(folder)
    return meta.stage_index, meta.stage_step, meta.train.dialogues.steps


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
    # the dataset it was trained on, given again, is no change (a new user's resume was refused for it)
    from core.dataset import default_dataset, save_dataset

    same, other = tmp_path / "same.json", tmp_path / "other.json"
    save_dataset(default_dataset(), same)
    d = default_dataset()
    d.facts.append("The Brindlewick ferry leaves at nine.")
    save_dataset(d, other)
    assert main(["train", "--resume", str(out), "--data", str(same), "--tune-steps", "6", "-q"]) == 0
    assert stage_state(out) == (2, 0, 6)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--data", str(other), "-q"]) == 2
    assert (f"--data: {other} is not the dataset this run was trained on (its dataset.json); give --allow-new-data"
            in capsys.readouterr().err)
    # a finished run has nothing left to train on it: refused, nothing saved (it was saved with the new dataset
    # recorded, which recall then said the model was trained on)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["train", "--resume", str(out), "--data", str(other), "--allow-new-data", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"both stages are complete, so --data {other} would not be trained on; nothing saved" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # with more steps, past the facts stage: its new fact is trained only by tuning's replay, and the output says so
    assert main(["train", "--resume", str(out), "--data", str(other), "--allow-new-data", "--tune-steps", "7",
                 "-q"]) == 0
    assert (f"note: the facts stage was over before this dataset came, so facts new in it are trained only as tuning "
            f"replays facts, and slowly; a new run learns them in its facts stage: opencl-llm train --data {other} "
            "--out NEW_FOLDER") in capsys.readouterr().out


def test_resuming_a_finished_run_leaves_its_checkpoint_as_it_is(tmp_path, capsys):
    """A finished run resumed into its own folder has nothing to train: its checkpoint is not written again
    (it was, and the output said "model saved"); resumed into another folder, it is saved there."""
    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1") == 0
    before = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.iterdir()}
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "-q"]) == 0
    shown = capsys.readouterr().out
    assert "nothing left to train" in shown and f"model unchanged in {out}" in shown and "model saved" not in shown
    assert "give --tune-steps above 1, the most it was given, to continue" in shown
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.iterdir()} == before
    assert main(["train", "--resume", str(out), "--out", str(tmp_path / "copy"), "-q"]) == 0
    assert f"model saved to {tmp_path / 'copy'}" in capsys.readouterr().out
    assert stage_state(tmp_path / "copy") == stage_state(out)


@pytest.mark.parametrize("options, message", [
    (["--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
    (["--tune-steps", "-3"], "--tune-steps: must be >= 0, got -3"),
    (["--pretrain-lr", "-1"], "--pretrain-lr: must be > 0"),
    (["--n-heads", "5"], "--n-heads: d_model (32) must be divisible by n_heads (5)"),
    (["--context-length", "1"], "--context-length: must be within 2..8192, got 1"),
])
def test_a_bad_setting_names_its_option(tmp_path, capsys, options, message):
    """Settings errors name the option the user typed, not the config's field (it said
    'invalid setting pretrain.batch_size: must be within 1.., got 0'); nothing is written."""
    assert train(tmp_path, "--out", str(tmp_path / "m"), *options) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"opencl-llm: error: {message}"), err
    assert not (tmp_path / "m").exists()


def test_a_mistyped_option_gets_its_commands_usage_and_a_suggestion(capsys):
    """argparse's own message for an unknown option came from the top-level parser (the list of commands)."""
    with pytest.raises(SystemExit) as e:
        main(["train", "--lora-rnak", "8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: opencl-llm train ")
    assert err.strip().endswith("opencl-llm train: error: unrecognized arguments: --lora-rnak 8 "
                                "(did you mean --lora-rank?)")
    with pytest.raises(SystemExit):
        main(["devices", "-v"])
    assert "(did you mean opencl-llm -v devices ... (-v goes before the command)?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["chat", "hello"])
    assert capsys.readouterr().err.strip().endswith("opencl-llm chat: error: unrecognized arguments: hello")


def test_out_that_is_a_file_fails_before_training(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert train(tmp_path, "--out", str(f), "--pretrain-steps", "500") == 2
    err = capsys.readouterr().err
    assert "afile" in err and "not a folder" in err and "Traceback" not in err


def test_resume_of_a_folder_no_run_saved_into_says_so(tmp_path, capsys):
    """--resume of a missing folder, or of one no run saved into (a user's, an empty one, another tool's with a
    config.json), is refused in one line that says so, not with check_output_folder's advice for --out, and
    nothing is created or changed. From a new user's trial."""
    mine, empty, hf = tmp_path / "mine", tmp_path / "empty", tmp_path / "hf"
    for d, files in ((mine, {"notes.md": "my notes"}), (empty, {}), (hf, {"config.json": '{"model_type": "llama"}'})):
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for folder, why in [(tmp_path / "a" / "nowhere", "no such folder"), (mine, "no training run was saved here"),
                        (empty, "no training run was saved here"), (hf, "no training run was saved here")]:
        assert main(["train", "--resume", str(folder), "-q"]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines() == [f"opencl-llm: error: {folder}: {why}" + (
            "" if why == "no such folder" else " (--resume needs a folder that `train --out` wrote)")]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_resume_still_recovers_a_cut_save_and_names_a_damaged_config(tmp_path, capsys):
    """What the refusal above must not catch (an earlier attempt did, and was reverted): a checkpoint whose save
    was killed between its renames (the folder absent, its backup .NAME.bak beside it) is put back and resumed,
    and a damaged checkpoint's config.json keeps its own one-line message."""
    import shutil
    from pathlib import Path

    from core.checkpoint_meta import resume_problem

    from core.atomic import MARK

    fixture = Path(__file__).parent / "data" / "checkpoint_v1"  # written before the marker file
    ck = tmp_path / "ck"
    shutil.copytree(fixture, tmp_path / ".ck.bak")
    # a backup no swap marked (a user's copy, or an older version's cut save): not taken, but named
    assert resume_problem(ck) == (f"{ck}: no such folder (.ck.bak beside it is not a save's backup of this version; "
                                  "if it is your checkpoint, rename it to ck)")
    (tmp_path / ".ck.bak" / MARK).touch()  # what a swap does before the rename
    assert resume_problem(ck) is None
    assert main(["train", "--resume", str(ck), "-q"]) == 0  # both stages done: nothing to train, but read back
    assert (ck / "weights.npz").is_file() and not (tmp_path / ".ck.bak").exists()
    capsys.readouterr()
    (ck / "config.json").write_text("[1, 2, 3]")
    assert resume_problem(ck) is None
    assert main(["train", "--resume", str(ck), "-q"]) == 2
    assert "config.json: field '(top level)' must be an object" in capsys.readouterr().err


def test_dataset_folder_and_missing_file_are_one_line_errors(tmp_path, capsys):
    assert train(tmp_path, "--data", str(tmp_path), "--out", str(tmp_path / "m")) == 2
    assert "is a folder" in capsys.readouterr().err
    assert train(tmp_path, "--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "m")) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.txt'}: no such file" in err and "Errno" not in err and not (tmp_path / "m").exists()


def test_a_too_long_entry_is_named_by_its_file_and_line(tmp_path, capsys):
    """The warning about an entry longer than the model's context names the file and the line it is on, not
    only its number among the facts (a blank line before it: line 4 holds fact 3). From a new user's trial."""
    data = tmp_path / "d.txt"
    data.write_text("The cat is black.\nParis is in France.\n\n" + "word " * 200 + "\n")
    assert train(tmp_path, "--data", str(data), "--out", str(tmp_path / "m"), "--pretrain-steps", "1",
                 "--tune-steps", "0") == 0
    assert f"warning: {data}:4: fact 3: too long" in capsys.readouterr().out


def test_the_verdict_says_why_it_counts_fewer_facts_than_the_dataset(tmp_path, capsys):
    """The dataset line says 3 facts; the verdict counts the 2 the recall check could ask and says why the
    third is not counted, in one line; its text-only count is of the checked facts too. From a new user's trial."""
    import re

    data = tmp_path / "d.txt"
    data.write_text("The cat is black.\nParis is in France.\n" + "word " * 200 + "\n")
    assert train(tmp_path, "--data", str(data), "--out", str(tmp_path / "m"), "--pretrain-steps", "1",
                 "--tune-steps", "0") == 0
    out = capsys.readouterr().out
    assert "dataset: 3 facts, 0 dialogues" in out
    verdict = [ln for ln in out.splitlines() if "learned: " in ln.lower()]
    assert len(verdict) == 1 and re.search(r"\b\d of 2 facts checked \(1 too long for the context to check; 2 as text "
                                           r"only: no question asks about them, so the model may not answer questions "
                                           r"about them\)$", verdict[0]), out


def test_a_trained_model_in_out_is_replaced_only_with_overwrite(tmp_path, capsys):
    """A second `train` into a folder holding a trained model (the same --out, or the default one twice) is refused
    before any training, the model untouched, with what to do; --overwrite replaces it, and the --resume folder is
    continued as before. From a new user's trial: the model of a finished run was replaced without a word."""
    from core.checkpoint import CheckpointMeta

    m = tmp_path / "m"
    assert train(tmp_path, "--pretrain-steps", "2", "--tune-steps", "0", "--out", str(m)) == 0
    before = (m / "weights.npz").read_bytes(), CheckpointMeta.read(m).saved
    capsys.readouterr()
    assert train(tmp_path, "--pretrain-steps", "2", "--tune-steps", "0", "--seed", "5", "--out", str(m)) == 2
    err = capsys.readouterr().err
    assert f"{m}: holds a trained model; continue it with --resume {m}, give --overwrite to replace it" in err, err
    assert ((m / "weights.npz").read_bytes(), CheckpointMeta.read(m).saved) == before
    other = tmp_path / "other"
    assert main(["train", "--resume", str(m), "--out", str(other), "--tune-steps", "1", "-q"]) == 0  # a new --out
    assert main(["train", "--resume", str(m), "--out", str(other), "--tune-steps", "2", "-q"]) == 2  # not twice
    assert main(["train", "--resume", str(m), "--tune-steps", "1", "-q"]) == 0  # the --resume folder itself: fine
    assert train(tmp_path, "--pretrain-steps", "2", "--tune-steps", "0", "--seed", "5", "--out", str(m),
                 "--overwrite") == 0
    meta = CheckpointMeta.read(m)
    assert meta.train.seed == 5 and meta.saved != before[1]
    capsys.readouterr()  # a new model inside that checkpoint: refused (its next save would replace it, or refuse it)
    assert train(tmp_path, "--pretrain-steps", "2", "--tune-steps", "0", "--out", str(m / "sub")) == 2
    assert f"{m / 'sub'}: inside the checkpoint folder {m}" in capsys.readouterr().err and not (m / "sub").exists()


def test_a_run_that_could_check_nothing_says_so(tmp_path, capsys):
    """Every fact longer than the context: nothing is asked, and the run's last line says so (it printed no verdict at
    all: the verdict was made only from a non-empty recall table). From a review of the verdict change."""
    data = tmp_path / "d.txt"
    data.write_text("word " * 200 + "\n" + "more " * 150 + "\n")
    assert train(tmp_path, "--data", str(data), "--out", str(tmp_path / "m"), "--pretrain-steps", "1",
                 "--tune-steps", "0") == 0
    out = capsys.readouterr().out
    # (no text-only count: of the facts checked, none; it said "2 as text only" of 0 checked)
    assert "Nothing could be checked: 0 of 0 facts checked (2 too long for the context to check)\n" in out, out


def test_too_big_model_is_refused_with_sizes(tmp_path, capsys):
    args = ["train", "--d-model", "4096", "--n-heads", "32", "--n-kv-heads", "32", "--ffn-dim", "16384",
            "--n-layers", "64", "--batch-size", "64", "--context-length", "2048", "--out", str(tmp_path / "m"), "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "Traceback" not in err


def test_a_buffer_over_the_device_limit_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """The memory check before training is the Model's one rule (core.model.memory_problem): a device
    with memory to spare but a per-buffer limit below the model's largest buffer is refused at once."""
    import core.device

    real = core.device.open_device

    def small_buffers(*args, **kwargs):
        dev = real(*args, **kwargs)  # the one Device of that device: restored after the test
        monkeypatch.setattr(dev, "max_alloc_bytes", 2**16)
        return dev

    monkeypatch.setattr(core.device, "open_device", small_buffers)
    assert train(tmp_path, "--out", str(tmp_path / "m")) == 2
    out, err = capsys.readouterr()
    assert "per buffer" in err and "--grad-accum" in err and "Traceback" not in err
    # refused before the model was built (the memory line needs the data's longest row: after "dataset:")
    assert "dataset:" in out and "model:" not in out and "pretrain" not in out


class TerminalInput(io.StringIO):
    """Typed lines, as a terminal gives them (``isatty``): the chat shows its prompts."""

    def isatty(self) -> bool:
        return True


def test_export_into_a_folder_and_interactive_chat(tmp_path, capsys, monkeypatch):
    out = tmp_path / "model"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "3") == 0
    folder = tmp_path / "exports"
    folder.mkdir()
    monkeypatch.setattr("core.cli.BIG_EXPORT_BYTES", 1000)  # every export is "big": the default's note
    assert main(["export", "--model", str(out), "--out", str(folder)]) == 0
    assert (folder / "model.gguf").is_file()
    shown = capsys.readouterr().out
    assert "replaced" not in shown and "note: f32 is exact; --dtype q8_0 writes about " in shown
    # an earlier export (the app's own) is replaced only with --overwrite, and the output says what it was
    before = (folder / "model.gguf").read_bytes()
    assert main(["export", "--model", str(out), "--out", str(folder), "--dtype", "q8_0"]) == 2
    assert "model.gguf: exists; give --overwrite to replace it" in capsys.readouterr().err
    assert (folder / "model.gguf").read_bytes() == before
    assert main(["export", "--model", str(out), "--out", str(folder), "--dtype", "q8_0", "--overwrite"]) == 0
    shown = capsys.readouterr().out
    assert "q8_0; replaced the earlier f32 export" in shown and "note:" not in shown  # a dtype chosen: no note
    # --out without ".gguf" names the same files (export adds the suffix): "v1.0" -> v1.0.gguf, v1.0.Modelfile
    assert main(["export", "--model", str(out), "--out", str(folder / "v1.0"), "--modelfile"]) == 0
    (folder / "v1.0.Modelfile").write_text((folder / "v1.0.Modelfile").read_text() + "# my edit\n")
    capsys.readouterr()
    for target in (folder / "v1.0", folder / "model"):
        assert main(["export", "--model", str(out), "--out", str(target), "--modelfile", "--dtype", "q4_0"]) == 2
        assert "exist" in capsys.readouterr().err
    assert (folder / "v1.0.Modelfile").read_text().endswith("# my edit\n")
    # with --overwrite the edited Modelfile is replaced, and the output says its edits are gone
    assert main(["export", "--model", str(out), "--out", str(folder / "v1.0"), "--modelfile", "--overwrite"]) == 0
    assert "replaced the earlier one, which differed: edits to it are gone" in capsys.readouterr().out
    assert main(["export", "--model", str(out), "--out", str(folder / "v1.0"), "--modelfile", "--overwrite"]) == 0
    assert "edits to it are gone" not in capsys.readouterr().out  # the same text again: nothing lost
    assert main(["export", "--model", str(out), "--out", str(folder / "model"), "--overwrite"]) == 0
    assert "replaced the earlier q8_0 export" in capsys.readouterr().out
    # through a link the user made to an export: the link stays, the export it names is replaced
    (folder / "current.gguf").symlink_to("model.gguf")
    f32 = (folder / "model.gguf").read_bytes()
    assert main(["export", "--model", str(out), "--out", str(folder / "current.gguf"), "--dtype", "q8_0",
                 "--overwrite"]) == 0
    assert "replaced the earlier f32 export" in capsys.readouterr().out
    assert (folder / "current.gguf").is_symlink() and len((folder / "model.gguf").read_bytes()) < len(f32)
    lines = "Where is Brindlewick?\n" + "word " * 200 + "\n\udce9t\u00e9?\n/exit\nnever read\n"
    monkeypatch.setattr("sys.stdin", TerminalInput(lines))
    assert main(["chat", "--model", str(out), "--max-tokens", "4"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("Assistant:") == 3  # the too-long message is answered with an error, the chat goes on
    assert "context_length" in shown


def test_piped_chat_prints_only_the_answers(tmp_path):
    """Issue 24: ``echo -e "hi\nwho are you" | opencl-llm chat`` printed "User: User: Assistant: ...".
    With stdin not a terminal, stdout holds one answer per message and nothing else."""
    import subprocess
    import sys
    from pathlib import Path

    from core.chat import ChatSession
    from core.checkpoint import load_model
    from core.device import open_device
    from core.generate import Generator, SamplingSettings

    out = tmp_path / "model"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "3") == 0
    r = subprocess.run([sys.executable, "-m", "core.cli", "chat", "--model", str(out), "--max-tokens", "6"],
                       input="hi\n\nwho are you\n", capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    loaded = load_model(out)
    session = ChatSession(Generator(open_device(), loaded.config, loaded.weights), loaded.tokenizer)
    settings = SamplingSettings(temperature=0.0, max_tokens=6)
    want = [session.answer("hi", settings), session.answer("who are you", settings)]  # the blank line skipped
    # the answers are streamed, so a space the model ends one with may stay at the line's end
    assert [x.rstrip() for x in r.stdout.splitlines()] == [x.rstrip() for x in "\n".join(want).splitlines()], \
        (r.stdout, want)
    assert "User:" not in r.stdout + r.stderr and "Assistant:" not in r.stdout


def test_ctrl_c_stops_between_steps_and_resume_is_exact(tmp_path, capsys):
    """SIGINT during training: the trainer stops after the step in progress, the checkpoint is
    consistent, and resuming ends with exactly the weights of an uninterrupted run."""
    import signal

    import numpy as np

    from core.checkpoint import load_checkpoint

    steps = ["--pretrain-steps", "6", "--tune-steps", "4", "--seed", "3"]
    full = tmp_path / "full"
    assert train(tmp_path, "--out", str(full), *steps) == 0
    from tests.signals import signal_at_step

    part = tmp_path / "part"
    with signal_at_step(signal.SIGINT, 3):  # a real SIGINT in the middle of step 3
        assert train(tmp_path, "--out", str(part), *steps) == 130
    assert "--resume" in capsys.readouterr().out
    assert main(["train", "--resume", str(part), "-q"]) == 0
    a, b = load_checkpoint(full), load_checkpoint(part)
    assert a.checkpoint.adam_step == b.checkpoint.adam_step == 10
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_damaged_checkpoints_are_one_line_errors(tmp_path, capsys):
    import numpy as np

    out = tmp_path / "m"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1") == 0
    with np.load(out / "weights.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "output_norm.weight"}
    np.savez(out / "weights.npz", **arrays)
    capsys.readouterr()
    assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "output_norm.weight" in err and "missing" in err and "Traceback" not in err
    (out / "weights.npz").write_bytes(b"PK\x03\x04 truncated")
    assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 2
    assert "unreadable" in capsys.readouterr().err


def test_tuning_progress_in_a_log_file_is_lines_not_carriage_returns(capsys, monkeypatch):
    """A first run's matmul tuning prints a progress line rewritten in place on a terminal; in a file (here
    capsys, no terminal) it prints whole lines, the first, at most one per 10 s, and the last: no carriage
    returns that join a log's lines into one."""
    from core import cli
    from core.kernels import matmul_autotune

    def tuning(dev, progress=None, **_):
        for i in range(1, 10):
            progress(i / 9, f"matmul tuning nt: {i}/9")
        return {"seconds": 1.5}

    monkeypatch.setattr(matmul_autotune, "tuned_configs", tuning)
    cli._tune_matmul(object())
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == ["matmul tuning nt: 1/9", "matmul tuning nt: 9/9",
                                "matmul tuned in 1.5 s (cached for this device and driver)"]


def test_ctrl_c_during_a_kernel_build_says_interrupted(monkeypatch, capsys):
    """Ctrl-C while the driver compiles made PoCL's build fail ("unable to rename temporary ..."), and the CLI
    reported that build error with exit 1 (a review helper's Ctrl-C half a second into train --resume): a build
    error after a Ctrl-C is the interruption, exit 130; the caller's SIGINT handler is back afterwards."""
    import signal

    import core.cli
    from core.device import KernelBuildError

    def compiling(args):
        try:
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, caught inside the driver's call
        except KeyboardInterrupt:
            pass
        raise KernelBuildError("building matmul.cl failed: clBuildProgram failed: BUILD_PROGRAM_FAILURE")

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(core.cli, "cmd_devices", compiling)
    assert main(["devices"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "BUILD_PROGRAM_FAILURE" not in err
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_stops_a_piped_chat_waiting_for_input(tmp_path):
    """SIGINT ends a chat blocked reading its piped input at once (the CLI's own SIGINT handler, main's, must not
    make that read wait for more input)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "model"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1") == 0
    p = subprocess.Popen([sys.executable, "-m", "core.cli", "chat", "--model", str(out)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    try:
        time.sleep(8)  # loaded and reading its input (a SIGINT during the imports ends it as well)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=20)  # the pipe stays open: only the signal can end it
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert p.returncode in (0, 130, -signal.SIGINT)  # the chat takes Ctrl-C as "quit" (0), as at a terminal


def test_a_preset_is_taken_in_any_case():
    """`--preset tiny` was refused ("invalid choice"): the names are for people, not for case."""
    from core.cli import build_parser

    assert build_parser().parse_args(["train", "--preset", "tiny"]).preset == "Tiny"
    assert build_parser().parse_args(["train", "--preset", "LARGER"]).preset == "Larger"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--preset", "huge"])


def test_chat_with_a_folder_a_first_run_has_not_saved_yet_says_so(tmp_path, capsys):
    """`chat --model m` while the first `train --out m` has not saved yet said "m: no such file or folder"."""
    import subprocess
    import sys
    import time

    out = tmp_path / "m"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from core.folder_lock import FolderLock; "
                               f"FolderLock({str(out)!r}, 'opencl-llm train').acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert f"{out}: no model saved there yet (process {holder.pid} on host" in err and "opencl-llm train" in err
        # and a resume of it (it said "m: no such folder"), the folder made or not
        for made in (False, True):
            if made:
                out.mkdir()
            assert main(["train", "--resume", str(out), "-q"]) == 2
            assert f"{out}: no model saved there yet (process {holder.pid} on host" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    out.rmdir()
    assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 2
    assert f"{out}: no such file or folder" in capsys.readouterr().err


def test_chat_and_export_of_a_run_stopped_midway_say_so(tmp_path, capsys):
    """A new user chatted with and exported a run stopped 2 s in (Ctrl-C) and got "No, the warranty , the warranty ,
    ..." with no hint that the model was unfinished. Chat (on stderr: stdout keeps only answers) and export now say
    where it stopped and how to continue it; a finished run gets no such note."""
    import json

    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "2") == 0
    capsys.readouterr()
    assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 0
    assert "stopped" not in capsys.readouterr().err
    meta = json.loads((out / "config.json").read_text())
    meta.update(stage_index=0, stage_step=2)  # as a stop at pretraining's step 2 saves it
    (out / "config.json").write_text(json.dumps(meta))
    assert main(["chat", "--model", str(out), "--prompt", "hi"]) == 0
    cap = capsys.readouterr()
    note = f"note: {out} is a run that stopped in its pretrain stage at step 2 of 3, so its answers may be poor; " \
           f"continue it: opencl-llm train --resume {out}"
    assert note in cap.err and "note" not in cap.out
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "m.gguf")]) == 0
    assert note in capsys.readouterr().out


def test_export_to_a_folder_name_that_does_not_exist_is_refused(tmp_path, capsys):
    """`export --out newdir/` wrote ./newdir.gguf (a new user meant a folder)."""
    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1") == 0
    capsys.readouterr()
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "newdir") + "/"]) == 2
    assert "newdir/: folder does not exist; create it first" in capsys.readouterr().err
    assert not (tmp_path / "newdir.gguf").exists() and not (tmp_path / "newdir").exists()
    (tmp_path / "newdir").mkdir()
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "newdir") + "/"]) == 0
    assert (tmp_path / "newdir" / "run.gguf").is_file()


def test_export_out_names_that_mean_no_file_are_refused_and_notes_name_the_kind_of_run(tmp_path, capsys):
    """From a break-it helper: `--out ''` wrote ./run.gguf, `--out nd/.` wrote nd.gguf and the adapter export
    wrote NEWD.gguf for `--out NEWD/`; the refusal of new data on a finished run said `--data None` for an edited
    dataset.json."""
    import json

    from core.dataset import default_dataset, save_dataset

    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1") == 0
    for bad, why in (("", "--out: empty"), (str(tmp_path / "nd") + "/.", "folder does not exist"),
                     (str(tmp_path / "nd") + "/", "folder does not exist")):
        for extra in ([], ["--adapter"]):
            capsys.readouterr()
            assert main(["export", "--model", str(out), *extra, "--out", bad]) == 2
            assert why in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    d = default_dataset()
    d.facts.append("The Brindlewick ferry leaves at nine.")
    save_dataset(d, out / "dataset.json")  # edited in place
    meta = json.loads((out / "config.json").read_text())
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--allow-new-data", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"so the changed {out / 'dataset.json'} would not be trained on; nothing saved" in err, err
    assert "None" not in err and f"opencl-llm train --data {out / 'dataset.json'} --out NEW_FOLDER" in err
    assert json.loads((out / "config.json").read_text()) == meta


def test_a_named_preset_prints_its_estimate(tmp_path, capsys):
    """No plan timed the device for a named preset (or given sizes), so the run times its own model first and
    prints the estimate, as a fine-tune does; a resume prints none."""
    import re

    out = tmp_path / "run"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "3", "--tune-steps", "2") == 0
    text = capsys.readouterr().out
    assert re.search(r"^plan: estimated \d+:\d\d \(pretrain 3 steps of about [\d.]+ m?s, dialogues 2 steps of about "
                     r"[\d.]+ m?s; checks \d+:\d\d, saves \d+:\d\d\)$", text, re.M), text
    assert main(["train", "--resume", str(out), "--tune-steps", "3", "-q"]) == 0
    assert "plan:" not in capsys.readouterr().out
    # a named preset writes no fact questions: the questions line says so and names Auto, which does (it told a
    # new user of Tiny to add dialogues, which write questions only under Auto)
    assert ("and this run writes no questions for facts, so the model may not answer questions about them; with a "
            "dialogue asking about one fact of each kind, the Auto preset (the default) writes them for the others"
            ) in text


def test_chat_without_a_model_here_says_what_to_do(tmp_path, capsys, monkeypatch):
    """`chat --prompt hi` where nothing was trained said only 'opencl-llm-model: no such file or folder'."""
    monkeypatch.chdir(tmp_path)
    assert main(["chat", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == (
        "opencl-llm: error: opencl-llm-model: no such file or folder (the folder `opencl-llm train` saves into by "
        "default, here: train a model first, or give --model PATH)")
    assert main(["chat", "--model", "elsewhere", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "opencl-llm: error: elsewhere: no such file or folder"


def test_a_files_warnings_come_in_line_order(tmp_path, capsys):
    """A JSONL file's warnings came as line 4 (not valid JSON, found in an earlier pass), then line 2."""
    data = tmp_path / "pets.jsonl"
    data.write_text('{"text": "Biscuit is a brown beagle."}\n{"text": "   "}\n{"text": "Luna is a grey cat."}\n'
                    '{"text": "Pepper is a parrot."\n'
                    '{"messages": [{"role": "user", "content": "What colour is Biscuit?"}, '
                    '{"role": "assistant", "content": "Brown."}]}\n', encoding="utf-8")
    assert train(tmp_path, "--data", str(data), "--out", str(tmp_path / "m"), "--pretrain-steps", "1",
                 "--tune-steps", "1") == 0
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if line.startswith(f"warning: {data}:")]
    assert [int(w.split(":")[2]) for w in warned] == [2, 4], warned
    # said again after the verdict: the warnings scroll away above the run (a new user's run trained on half a file)
    assert err[-1] == (f"warning: 2 entries of {data} were skipped and not trained on (the warnings above the run "
                       "say which and why)"), err


def test_the_verdict_counts_text_only_facts_among_the_checked_ones(tmp_path, capsys):
    """Facts of one word are not checked; they were counted as text only all the same ('0 of 2 facts checked (2 of a
    single word; 3 as text only ...)': more text-only facts than checked ones)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "Zebra."}\n{"text": "Kettle."}\n{"text": "Mira Tolsen plays the cello."}\n'
                    '{"text": "Biscuit is a brown dog."}\n{"messages": [{"role": "user", "content": "What colour is '
                    'Biscuit?"}, {"role": "assistant", "content": "Brown."}]}\n', encoding="utf-8")
    out = tmp_path / "m"
    assert train(tmp_path, "--data", str(data), "--out", str(out), "--pretrain-steps", "1", "--tune-steps", "1") == 0
    said = capsys.readouterr().out
    assert "of 2 facts checked (2 of a single word; 1 as text only: no question asks about it," in said, said
    assert main(["recall", "--model", str(out), "--text-only"]) == 0  # the dataset's own count keeps all three
    assert capsys.readouterr().out.startswith("3 of 4 facts learned as text only")


def test_recall_lists_the_facts_learned_as_text_only(tmp_path, capsys):
    """The verdict counts facts no question asks about ('11 as text only'); a new user asked which they are."""
    out = tmp_path / "m"
    assert train(tmp_path, "--out", str(out), "--pretrain-steps", "1", "--tune-steps", "1") == 0
    assert f"the facts learned as text only: opencl-llm recall --model {out} --text-only" in capsys.readouterr().out
    assert main(["recall", "--model", str(out), "--text-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("11 of 25 facts learned as text only (no dialogue or written question asks about them, so the "
                        "model may not answer questions about them):")
    assert lines[1] == "[fact 6] The Brindlewick library keeps a map drawn by the town founder." and len(lines) == 12
    # only the run's own dataset (another file's facts were not learned at all), not with --show-wrong
    for extra in (["--data", str(out / "dataset.json")], ["--show-wrong"]):
        assert main(["recall", "--model", str(out), "--text-only", *extra]) == 2
        assert "--text-only lists the facts of the dataset the run was trained on" in capsys.readouterr().err
    # nothing to check in a dataset of empty entries is said (it printed nothing and exited 0)
    empty = tmp_path / "spaces.json"
    empty.write_text('{"version": 1, "facts": ["   ", "\\t"], "dialogues": [{"turns": []}]}', encoding="utf-8")
    assert main(["recall", "--model", str(out), "--data", str(empty)]) == 2
    assert "no facts or dialogues with text could be read, so there is nothing to check" in capsys.readouterr().err


def test_a_new_run_of_no_steps_says_nothing_was_saved(tmp_path, capsys):
    """`train --steps 0` into a new folder said 'model unchanged in DIR', a folder it never made (a break-it helper)."""
    assert train(tmp_path, "--out", str(tmp_path / "z"), "--steps", "0") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no steps to train; nothing saved"
    assert not (tmp_path / "z").exists()


def test_recall_asks_a_runs_own_written_and_held_out_questions(tmp_path, capsys):
    """The verdict counted the questions the run wrote for facts ('2 of 2 written questions') and those it held out,
    but `recall --model DIR` (the command the verdict names) asked neither: it checks them as the run's checks did."""
    import re

    from core.dataset import Dataset, Dialogue, save_dataset
    from tests.make_datasets import make_dataset

    g = make_dataset("catalogue", items=8, dialogues=5)
    data, out = tmp_path / "shop.json", tmp_path / "m"
    save_dataset(Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues]), data)
    assert main(["train", "--data", str(data), "--out", str(out), "--time-budget", "30", "-q"]) == 0  # Auto
    said = capsys.readouterr().out
    written = re.search(r"[\d,]+ of ([\d,]+) written questions", said)
    heldout = re.search(r"held out of training\): [\d,]+ of ([\d,]+) answered", said)
    assert written and heldout, said[-800:]
    assert main(["recall", "--model", str(out), "--show-wrong"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for kind, noun, planned in (("question", "written questions", written), ("heldout", "held-out questions", heldout)):
        count = [m for line in lines if (m := re.fullmatch(rf"([\d,]+) of ([\d,]+) {noun} \([\d.]+ %\)", line))]
        assert len(count) == 1 and count[0][2] == planned[1], lines
        wrong = [line for line in lines if line.startswith(f"[{kind} ")]
        assert len(wrong) == int(count[0][2]) - int(count[0][1]), lines
    # another file has no written questions: only its facts and answers are asked
    assert main(["recall", "--model", str(out), "--data", str(data)]) == 0
    assert "questions" not in capsys.readouterr().out
    # its dataset.json edited after the run: questions rebuilt from it would be ones the run never wrote (a break-it
    # helper added two dialogues and got '1 of 4 written questions', the held-out one among them)
    from core.dataset import load_dataset

    edited, _ = load_dataset(out / "dataset.json")
    edited.dialogues.append(Dialogue([("Who makes the fan?", "Osk Industries.")]))
    save_dataset(edited, out / "dataset.json")
    assert main(["recall", "--model", str(out)]) == 0
    said = capsys.readouterr()
    assert "questions" not in said.out and " of 6 answers" in said.out  # the file as it is now: its 6 dialogues
    assert (f"warning: {out / 'dataset.json'}: changed since the run trained on it (its hash is not config.json's "
            "dataset_hash), so the questions the run wrote for facts cannot be told from it; they are not asked") in said.err
    assert main(["recall", "--model", str(out), "--text-only"]) == 2
    assert "cannot be told from it, nor which facts it learned as text only" in capsys.readouterr().err


def test_the_progress_bars_fit_an_80_column_terminal():
    """At 80 columns the bar shrank to one cell and the elapsed and remaining times were cut ('0… -:-…'), the recall
    check's row widening the first column ('pretrain: checking recall…') and carrying 'loss -  - tok/s'."""
    import io

    from rich.console import Console

    from core.cli import _Bars
    from core.events import RecallProgress, StepReport
    from core.stages import Stage

    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, color_system=None)
    bars = _Bars(console, disabled=False)
    bars.show(StepReport(Stage("dialogues"), 100, 200, 350, 6.417, 1.0, (), 1e-3, tokens_per_s=126289.4,
                         passes=10.6))
    bars.show(RecallProgress(Stage("pretrain"), 250, 10, 1053, False))
    console.print(bars.progress.make_tasks_table(bars.progress.tasks))
    rows = buf.getvalue().splitlines()
    assert len(rows) == 2 and all(len(r) <= 80 and "…" not in r.replace("recall…", "") for r in rows), rows
    assert "100/200 10.6 passes  loss 6.417  126,289 tok/s 0:00:00" in rows[0] and "━━━" in rows[0], rows
    assert rows[1].startswith("pretrain ") and "10/1053 checking recall…" in rows[1] and "tok/s" not in rows[1], rows
