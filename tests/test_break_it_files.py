"""Issue 19, "Data lost" and the checkpoint part of "Silently wrong": each case of the break-it test.

One table (:data:`CASES`): a case sets up a folder, runs a command (the CLI in-process through
``core.cli.main``, or a core/gui function) and expects either a refusal whose one line contains a text,
with every file under the case's folder unchanged (hashed before and after), or that it works, with
every file the app did not write unchanged. The SIGTERM/SIGHUP cases need a real signal and run
separately (SIGTERM in a subprocess), as do the save-time message of an undeletable backup and the
Chat tab's reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from core.atomic import MARK
from core.checkpoint import FORMAT_VERSION, MARKER, CheckpointMeta, load_checkpoint
from core.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_V1 = Path(__file__).parent / "data" / "checkpoint_v1"
TINY = ["--preset", "Tiny", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--n-kv-heads", "2",
        "--ffn-dim", "64", "--context-length", "64", "--batch-size", "4", "--vocab-size", "300", "-q"]


# ------------------------------------------------------------------------------------ helpers
def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: its relative path -> sha256 of a file, ``dir``, or ``link -> target``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"link -> {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def hashes(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def make_writable(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        for d in [Path(dirpath)] + [Path(dirpath) / n for n in dirnames]:
            if d.is_dir() and not d.is_symlink():
                d.chmod(d.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)


def copy_ck(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst)
    return dst


def edit_config(ck: Path, **changes) -> None:
    cfg = json.loads((ck / "config.json").read_text("utf-8"))
    for key, value in changes.items():
        target = cfg
        *parents, last = key.split(".")
        for k in parents:
            target = target[k]
        target[last] = value
    (ck / "config.json").write_text(json.dumps(cfg, indent=2), "utf-8")


def perturb_npz(path: Path) -> None:
    """Rewrite an .npz with the same tensors slightly changed: a file of another run of the same shape."""
    with np.load(path) as z:
        arrays = {k: z[k] + np.float32(1e-3) for k in z.files}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def stage_state(folder: Path) -> tuple[int, int, int]:
    m = CheckpointMeta.read(folder)
    return m.stage_index, m.stage_step, m.train.dialogues.steps


def assert_ours(folder: Path) -> CheckpointMeta:
    """A complete checkpoint of this version: the marker, both file hashes, and it loads."""
    assert (folder / MARKER).is_file()
    m = load_checkpoint(folder).checkpoint
    assert m.version == FORMAT_VERSION and len(m.weights_sha256) == 64 and len(m.optimizer_sha256) == 64
    return m


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """One tiny finished run (2 layers), copied by the cases that need a checkpoint."""
    out = tmp_path_factory.mktemp("base") / "ck"
    assert main(["train", *TINY, "--out", str(out), "--pretrain-steps", "2", "--tune-steps", "1"]) == 0
    return out


# ------------------------------------------------------------------------------------ the table
@dataclass
class Case:
    """``setup(ws, base)`` returns the files the app did not write (hashed before and after); ``command``
    is CLI arguments (``{ws}`` replaced by the case's folder) or ``f(ws) -> message`` (raising is a
    refusal); ``expect`` is ``"works"`` or the text the refusal's one line contains; ``check(ws)``
    looks at the result of a case that works."""

    id: str
    setup: Callable[[Path, Path], list[Path]]
    command: list[str] | Callable[[Path], str]
    expect: str
    check: Callable[[Path], None] | None = None
    cwd: str | None = None
    unchanged: list[str] = field(default_factory=list)  # our own files a "works" case must not touch


def _user_folder(ws, base):
    p = ws / "p"
    (p / "sub").mkdir(parents=True)
    (p / "config.json").write_text("{}\n")
    (p / "thesis.txt").write_text("x\n")
    (p / "sub" / "notes.txt").write_text("chapter 1\n")
    return [p / "config.json", p / "thesis.txt", p / "sub" / "notes.txt"]


def _hf_folder(ws, base):
    from core.checkpoint import load_model
    from core.hf_io import export_hf

    export_hf(load_model(base), ws / "hf")
    return [p for p in (ws / "hf").iterdir()]


def _ck_with_exports(ws, base):
    ck = copy_ck(base, ws / "ck")
    for name, data in (("ck.gguf", b"GGUF\x03 an export"), ("ck.Modelfile", b"FROM ./ck.gguf\n"),
                       ("notes.txt", b"my notes\n")):
        (ck / name).write_bytes(data)
    return [ck / "ck.gguf", ck / "ck.Modelfile", ck / "notes.txt"]


def _ck(ws, base):
    copy_ck(base, ws / "ck")
    return []


def _ck_edited(**changes):
    def setup(ws, base):
        edit_config(copy_ck(base, ws / "ck"), **changes)
        return []
    return setup


def _ck_perturbed(name):
    def setup(ws, base):
        perturb_npz(copy_ck(base, ws / "ck") / name)
        return []
    return setup


def _project(version, **extra):
    def setup(ws, base):
        p = ws / "proj"
        p.mkdir()
        (p / "project.json").write_text(json.dumps({"format": "opencl-llm-studio-project", "version": version,
                                                    "settings": {}, **extra}), "utf-8")
        return [p / "project.json"]
    return setup


def _open_project(ws):
    from gui.project import load_project

    load_project(ws / "proj")
    return "opened"


def _read_only_ck(ws, base):
    ck = copy_ck(base, ws / "ck")
    ck.chmod(0o555)
    return []


def _read_only_parent(ws, base):
    (ws / "ro").mkdir()
    (ws / "ro" / "keep.txt").write_text("mine\n")
    (ws / "ro").chmod(0o555)
    return [ws / "ro" / "keep.txt"]


def _stuck_backup(ws, base):
    copy_ck(base, ws / "ck")
    bak = ws / ".ck.bak"
    bak.mkdir()
    (bak / MARK).touch()  # a save's own backup (core.atomic marks it)
    (bak / "config.json").write_text("{}\n")
    bak.chmod(0o555)
    return [bak / "config.json"]


def _symlink(ws, base):
    copy_ck(base, ws / "real")
    (ws / "link").symlink_to(ws / "real", target_is_directory=True)
    (ws / "beside.txt").write_text("mine\n")
    return [ws / "beside.txt"]


def _check_symlink(ws):
    assert (ws / "link").is_symlink() and (ws / "real").is_dir() and not (ws / "real").is_symlink()
    assert stage_state(ws / "real") == (2, 0, 2)
    assert_ours(ws / "real")
    assert sorted(p.name for p in ws.iterdir()) == ["beside.txt", "link", "real"]


def _dotdot(ws, base):
    copy_ck(base, ws / "runs" / "x")
    (ws / "runs" / "other.txt").write_text("mine\n")
    return [ws / "runs" / "other.txt"]


def _check_dotdot(ws):
    assert stage_state(ws / "runs" / "x") == (2, 0, 2)
    assert_ours(ws / "runs" / "x")
    assert sorted(p.name for p in (ws / "runs").iterdir()) == ["other.txt", "x"]


def _dot(ws, base):
    copy_ck(base, ws / "ck")
    (ws / "d").mkdir()
    (ws / "notes.txt").write_text("mine\n")
    return [ws / "notes.txt"]


def _check_dot(ws):
    assert stage_state(ws / "d") == (2, 0, 2)
    assert_ours(ws / "d")
    assert sorted(p.name for p in ws.iterdir()) == ["ck", "d", "notes.txt"]


def _v1(ws, base):
    shutil.copytree(FIXTURE_V1, ws / "v1")
    return []


def _v1_with_notes(ws, base):
    shutil.copytree(FIXTURE_V1, ws / "v1")
    (ws / "v1" / "notes.txt").write_text("mine\n")
    return [ws / "v1" / "notes.txt"]


def _check_v1(ws):
    m = assert_ours(ws / "v1")  # read by its files, written back with the marker and hashes
    assert m.train.dialogues.steps == 4


RESUME2 = ["--tune-steps", "2", "-q"]

CASES = [
    # ---- data lost
    Case("out-folder-with-user-files", _user_folder, ["train", *TINY, "--steps", "1", "--out", "{ws}/p"],
         "not a checkpoint folder of this app"),
    Case("out-hugging-face-export", _hf_folder, ["train", *TINY, "--steps", "1", "--out", "{ws}/hf"],
         "not a checkpoint folder of this app"),
    Case("resume-with-export-and-notes-inside", _ck_with_exports, ["train", "--resume", "{ws}/ck", *RESUME2],
         "holds ck.Modelfile, which this app did not write"),
    Case("export-gguf-into-checkpoint", _ck, ["export", "--model", "{ws}/ck", "--out", "{ws}/ck", "--modelfile"],
         "inside the checkpoint folder"),
    Case("export-hf-as-checkpoint", _ck, ["export", "--format", "hf", "--model", "{ws}/ck", "--out", "{ws}/ck"],
         "is a checkpoint folder"),
    Case("export-hf-into-checkpoint", _ck, ["export", "--format", "hf", "--model", "{ws}/ck", "--out", "{ws}/ck/hf"],
         "inside the checkpoint folder"),
    Case("n-layers-edited-chat", _ck_edited(**{"model.n_layers": 1}), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "config.json: field 'model.n_layers' is 1"),
    Case("n-layers-edited-resume", _ck_edited(**{"model.n_layers": 1}), ["train", "--resume", "{ws}/ck", *RESUME2],
         "config.json: field 'model.n_layers' is 1"),
    Case("ffn-dim-edited-chat", _ck_edited(**{"model.ffn_dim": 32}), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'model.ffn_dim' is 32"),
    Case("project-version-99", _project(99, future={"x": 1}), _open_project, "field 'version' is 99: written by a newer"),
    Case("project-version-string", _project("1"), _open_project, "field 'version' must be an integer"),
    Case("project-version-true", _project(True), _open_project, "field 'version' must be an integer"),
    Case("read-only-checkpoint", _read_only_ck, ["train", "--resume", "{ws}/ck", *RESUME2], "is read-only"),
    Case("read-only-parent", _read_only_parent, ["train", *TINY, "--steps", "1", "--out", "{ws}/ro/new"],
         "is read-only"),
    Case("undeletable-backup", _stuck_backup, ["train", "--resume", "{ws}/ck", *RESUME2],
         ".ck.bak: the backup of an earlier save cannot be removed"),
    Case("newer-checkpoint-as-out", _ck_edited(version=99), ["train", *TINY, "--steps", "1", "--out", "{ws}/ck"],
         "field 'version' is 99"),
    Case("out-through-symlink", _symlink, ["train", "--resume", "{ws}/link", *RESUME2], "works", _check_symlink),
    Case("out-with-dotdot", _dotdot, ["train", "--resume", "{ws}/runs/x/../x", *RESUME2], "works", _check_dotdot),
    Case("out-dot", _dot, ["train", "--resume", "{ws}/ck", "--out", ".", *RESUME2], "works", _check_dot, cwd="d",
         unchanged=["ck/weights.npz", "ck/config.json", "ck/optimizer.npz"]),
    Case("old-checkpoint-resumes-and-gets-the-marker", _v1, ["train", "--resume", "{ws}/v1", "--tune-steps", "4", "-q"],
         "works", _check_v1),
    Case("old-checkpoint-with-notes", _v1_with_notes, ["train", "--resume", "{ws}/v1", "--tune-steps", "4", "-q"],
         "holds notes.txt, which this app did not write"),
    # ---- silently wrong: checkpoints
    Case("weights-of-another-run", _ck_perturbed("weights.npz"), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "weights.npz: does not belong to this checkpoint"),
    Case("optimizer-of-another-run", _ck_perturbed("optimizer.npz"), ["train", "--resume", "{ws}/ck", *RESUME2],
         "optimizer.npz: does not belong to this checkpoint"),
    Case("config-version-string", _ck_edited(version="1"), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'version' must be an integer, got a string"),
    Case("config-version-true", _ck_edited(version=True), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'version' must be an integer, got a boolean"),
    Case("config-version-negative", _ck_edited(version=-5), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'version' must be >= 1, got -5"),
    Case("config-version-99", _ck_edited(version=99), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'version' is 99: written by a newer app version"),
    Case("config-without-weights-hash", _ck_edited(weights_sha256=None), ["chat", "--model", "{ws}/ck", "--prompt", "hi"],
         "field 'weights_sha256' must be a string"),
]


def _run(case: Case, ws: Path, capsys) -> tuple[bool, str]:
    """(refused, the message); a CLI refusal must be one line, without a traceback."""
    if callable(case.command):
        try:
            return False, case.command(ws)
        except Exception as e:  # noqa: BLE001 - the refusal under test
            assert "\n" not in str(e), str(e)
            return True, str(e)
    argv = [a.replace("{ws}", str(ws)) for a in case.command]
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(ws / case.cwd if case.cwd else ws)
    try:
        rc = main(argv)
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    if rc == 0:
        return False, out
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return True, lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_break_it_case(case: Case, base, tmp_path, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    foreign = case.setup(ws, base)
    before, foreign_before = snapshot(ws), hashes(foreign)
    ours_before = hashes([ws / p for p in case.unchanged])
    try:
        refused, message = _run(case, ws, capsys)
    finally:
        make_writable(ws)
    assert hashes(foreign) == foreign_before  # no file the app did not write is deleted or changed
    if case.expect == "works":
        assert not refused, message
        assert hashes([ws / p for p in case.unchanged]) == ours_before
        case.check(ws)
    else:
        assert refused and case.expect in message, message
        assert snapshot(ws) == before  # refused: nothing at all changed


def test_the_table_covers_every_case_of_the_issue():
    ids = {c.id for c in CASES}
    assert len(CASES) == len(ids) >= 25
    print(f"\n[issue 19] {len(CASES)} cases: {sum(c.expect == 'works' for c in CASES)} work, "
          f"{sum(c.expect != 'works' for c in CASES)} refused")


# ------------------------------------------------------------------------------------ cases outside the table
def test_folders_and_files_named_like_a_saves_leftovers_but_the_users_are_never_touched(base, tmp_path, capsys):
    """A tester's copy of a model in ``.model.bak``, a ``.model.tmp-old`` folder and ``model/.draft.tmp`` were
    deleted by a plain `chat` (every reader finished "interrupted saves"); `train --out proj` beside a user's
    ``.proj.bak`` moved it into ``proj`` and then refused ``proj`` after training. Only what a save marked
    (core.atomic.MARK) is a leftover: the user's are left as they are, and a save that would need the name is
    refused before training."""
    ck = copy_ck(base, tmp_path / "model")
    for d in (tmp_path / ".model.bak", tmp_path / ".model.tmp-old", tmp_path / ".model.tmp-host-999999999-abc"):
        d.mkdir()
        (d / "notes.txt").write_text("mine\n")
    (ck / ".draft.tmp").write_text("d\n")
    before = snapshot(tmp_path)
    assert main(["chat", "--model", str(ck), "--prompt", "hi", "--max-tokens", "2"]) == 0
    assert main(["recall", "--model", str(ck)]) in (0, 1)
    assert snapshot(tmp_path) == before
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), *TINY, "--tune-steps", "8"]) != 0
    assert "holds .draft.tmp, which this app did not write" in capsys.readouterr().err  # a save would delete it
    (ck / ".draft.tmp").unlink()
    before = snapshot(tmp_path)
    assert main(["train", "--resume", str(ck), *TINY, "--tune-steps", "8"]) != 0
    err = capsys.readouterr().err
    assert ".model.bak: in the way of saves" in err and "move or rename it" in err, err
    assert snapshot(tmp_path) == before

    proj, bak = tmp_path / "proj", tmp_path / ".proj.bak"
    bak.mkdir()
    (bak / "notes.txt").write_text("b\n")
    assert main(["train", *TINY, "--steps", "1", "--out", str(proj)]) != 0
    assert ".proj.bak: in the way of saves" in capsys.readouterr().err and not proj.exists()
    assert (bak / "notes.txt").read_text() == "b\n"


def test_an_hf_export_beside_a_users_backup_named_folder_leaves_it(base, tmp_path, capsys):
    """``export --format hf --out hf`` moved a user's ``.hf.bak`` into ``hf`` and deleted it with its files."""
    bak = tmp_path / ".hf.bak"
    bak.mkdir()
    (bak / "notes.txt").write_text("n\n")
    assert main(["export", "--model", str(base), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert (bak / "notes.txt").read_text() == "n\n" and (tmp_path / "hf" / "config.json").is_file()
    assert not (tmp_path / "hf" / MARK).exists()
    # replacing that export needs the name for the old folder: refused, both folders as they were
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["export", "--model", str(base), "--format", "hf", "--out", str(tmp_path / "hf"), "--overwrite"]) != 0
    assert ".hf.bak: a folder or file of that name is in the way" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_a_lock_file_the_app_did_not_write_is_never_removed(base, tmp_path, capsys):
    """``.lk.lock`` holding a user's text, two hours old, was taken for a stale lock and deleted."""
    lock = tmp_path / ".lk.lock"
    lock.write_text("mine\n")
    old = time.time() - 7200
    os.utime(lock, (old, old))
    assert main(["train", *TINY, "--steps", "1", "--out", str(tmp_path / "lk")]) != 0
    err = capsys.readouterr().err
    assert "cannot be read as a lock of this app" in err and ".lk.lock" in err, err
    assert "if no other program uses lk, move or rename the lock file" in err, err
    assert lock.read_text() == "mine\n"
    lock.write_text("")  # an empty one (a lock cut by a crash) older than a minute is stale: taken over
    os.utime(lock, (old, old))
    assert main(["train", *TINY, "--steps", "1", "--out", str(tmp_path / "lk")]) == 0
    assert not lock.exists()


def test_an_undeletable_backup_is_named_at_save_not_directory_not_empty(base, tmp_path, monkeypatch):
    """The save says what really failed (the old backup cannot be removed), and the folder keeps its
    checkpoint; earlier the rename onto the leftover said "Directory not empty"."""
    import core.atomic
    from core.checkpoint import save_checkpoint
    from core.dataset import load_dataset

    ck = copy_ck(base, tmp_path / "ck")
    bak = tmp_path / ".ck.bak"
    bak.mkdir()
    (bak / MARK).touch()  # a save's own backup (core.atomic marks it)
    (bak / "stuck").mkdir()
    (bak / "stuck" / "weights.npz").write_bytes(b"old")
    real_rmtree = shutil.rmtree

    def rmtree(path, ignore_errors=False, **kw):  # a backup no one may delete (another user's files, say)
        if Path(path).name == "stuck":
            if ignore_errors:
                return
            raise PermissionError(13, "Permission denied", str(Path(path) / "weights.npz"))
        return real_rmtree(path, ignore_errors=ignore_errors, **kw)

    monkeypatch.setattr(core.atomic.shutil, "rmtree", rmtree)
    before = snapshot(tmp_path)
    loaded = load_checkpoint(ck)
    dataset, _ = load_dataset(ck / "dataset.json")
    with pytest.raises(OSError) as e:
        save_checkpoint(ck, loaded.weights, None, loaded.checkpoint, loaded.tokenizer, dataset)
    msg = str(e.value.strerror)
    assert "cannot remove the old backup" in msg and ".ck.bak" in msg and "Permission denied" in msg, msg
    assert "Directory not empty" not in msg
    monkeypatch.undo()
    assert snapshot(tmp_path) == before  # nothing changed: no temp folder left, the checkpoint as it was


def test_a_save_refuses_a_file_that_appeared_meanwhile(base, tmp_path):
    """save_checkpoint itself checks the folder (not only the CLI before training)."""
    from core.checkpoint import CheckpointError, save_checkpoint
    from core.dataset import load_dataset

    ck = copy_ck(base, tmp_path / "ck")
    loaded = load_checkpoint(ck)
    dataset, _ = load_dataset(ck / "dataset.json")
    (ck / "model.gguf").write_bytes(b"an export")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="holds model.gguf, which this app did not write"):
        save_checkpoint(ck, loaded.weights, None, loaded.checkpoint, loaded.tokenizer, dataset)
    assert snapshot(tmp_path) == before


def test_sighup_saves_like_ctrl_c(tmp_path, capsys):
    """SIGHUP (a logout) in the middle of training: the run stops after the step and saves a checkpoint
    that resumes, as Ctrl-C does."""
    from tests.signals import signal_at_step

    out = tmp_path / "run"
    with signal_at_step(signal.SIGHUP, 2):
        assert main(["train", *TINY, "--out", str(out), "--pretrain-steps", "6", "--tune-steps", "1"]) == 129  # 128 + SIGHUP
    assert "checkpoint saved" in capsys.readouterr().out
    m = assert_ours(out)
    assert m.stage_index == 0 and 0 < m.stage_step < 6


def test_a_second_signal_during_a_stops_save_names_that_save(tmp_path, capsys, monkeypatch):
    """Ctrl-C at pretrain step 2, then another while the stop's checkpoint is written: the save finishes and the
    message names it ("keeps the checkpoint saved at pretrain step 2", with the resume command); it said "keeps the
    checkpoint of the last completed stage" when no stage had completed (a new user's double Ctrl-C)."""
    from core import checkpoint
    from tests.signals import signal_at_step

    real = checkpoint.save_trainer

    def save_then_signal(trainer, out, *a, **k):
        os.kill(os.getpid(), signal.SIGINT)  # arrives during the save: honoured once it is whole
        return real(trainer, out, *a, **k)

    monkeypatch.setattr(checkpoint, "save_trainer", save_then_signal)
    out = tmp_path / "run"
    with signal_at_step(signal.SIGINT, 2):
        assert main(["train", *TINY, "--out", str(out), "--pretrain-steps", "6", "--tune-steps", "1"]) == 130
    said = capsys.readouterr().out
    assert f"interrupted; {out} keeps the checkpoint saved at pretrain step 2 (continue with: opencl-llm train " \
           f"--resume {out})" in said, said
    m = assert_ours(out)
    assert (m.stage_index, m.stage_step) == (0, 2)


@pytest.mark.parametrize("until, quiet, stage", [("pretrain: checking recall", False, 1), ("pretrain done", True, 1),
                                                  ("device: ", False, None)])
def test_a_reader_that_goes_away_stops_the_run_with_a_checkpoint(tmp_path, until, quiet, stage):
    """`opencl-llm train ... | head`: the pipe's reader left, the next line raised BrokenPipeError, and the run
    ended "error: Broken pipe" (exit 2) with nothing saved (a new user); a line that rich's console wrote ended it
    with exit 1, nothing saved, no word (a break-it helper). Whichever line finds the reader gone, the run stops after
    the step, saves, and exits 141 (128 + SIGPIPE) without a traceback; gone during the setup lines, it stops before
    its first step and saves nothing."""
    out = tmp_path / "run"
    args = [a for a in TINY if a != "-q"] + (["-q"] if quiet else [])
    p = subprocess.Popen([sys.executable, "-m", "core.cli", "train", *args, "--out", str(out), "--pretrain-steps", "3",
                          "--tune-steps", "100000"], cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline()]
        while lines[-1] and not lines[-1].startswith(until):
            lines.append(p.stdout.readline())
        assert lines[-1], lines
        p.stdout.close()  # as head or sed '/.../q' do after their lines: a later line finds no reader
        err = p.stderr.read()
        p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 141, (p.returncode, err)
    assert "Traceback" not in err and "Broken pipe" not in err, err
    if stage is None:
        assert not out.exists()
    else:  # stopped in the dialogue stage (100,000 steps) or just before it (the reader went during the pretrain
        m = assert_ours(out)  # stage's end): it says so, not "model saved" and a verdict, exit 0
        assert m.stage_index == stage


def test_sigterm_saves_a_complete_checkpoint(tmp_path):
    """``kill`` / ``systemctl stop`` during training (a real process): a complete checkpoint is saved
    and loads, and training resumes from it."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "core.cli", "train", *TINY, "--out", str(out),
                          "--pretrain-steps", "3000", "--tune-steps", "1"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # "model: ..." comes just before training starts
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("model:"):
                break
        assert lines and lines[-1].startswith("model:"), "".join(lines) + p.stderr.read()
        time.sleep(3)  # into the steps (the handlers are installed right after that line)
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, stdout + stderr  # 143, as a shell reports a process that SIGTERM ended
    assert "Traceback" not in stderr, stdout + stderr
    m = assert_ours(out)
    assert m.stage_index == 0 and m.stage_step > 0
    assert f"stopped at pretrain step {m.stage_step:,}; checkpoint saved" in stdout, stdout  # where (a new user's ask)
    from core.checkpoint import resume_trainer
    from core.device import open_device

    trainer = resume_trainer(out, open_device())
    assert trainer.stage_step == m.stage_step


def test_chat_tab_shows_why_a_checkpoint_cannot_be_loaded(main_window, qtbot, base, tmp_path):
    """A version-99 checkpoint as the project's trained model: the answer's note and the model label
    say why (not only stderr), instead of "no model is loaded"."""
    ck = copy_ck(base, tmp_path / "ck")
    edit_config(ck, version=99)
    c = main_window.chat_tab
    c.set_trained_model(str(ck))
    assert c.send("hi")
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    text = c.transcript.toPlainText()
    assert "field 'version' is 99" in text, text
    assert "field 'version' is 99" in c.model_label.text()
    assert not c.send("hi again")  # nothing to chat with: the reason stays in view
    assert "field 'version' is 99" in c.model_label.text()


def test_a_model_given_as_dot_from_inside_its_folder_works(base, tmp_path, monkeypatch, capsys):
    """`cd model && opencl-llm chat --model .` (also recall, export) failed with "PosixPath('.') has an empty
    name": the recovery of a cut save named the backup after '.'."""
    ck = copy_ck(base, tmp_path / "model")
    monkeypatch.chdir(ck)
    assert main(["chat", "--model", ".", "--prompt", "hi", "--max-tokens", "2"]) == 0
    assert main(["export", "--model", ".", "--out", str(tmp_path / "m.gguf")]) == 0
    assert main(["recall", "--model", "."]) in (0, 1)
    assert "empty name" not in capsys.readouterr().err and (tmp_path / "m.gguf").is_file()


def test_what_a_swap_cut_at_its_last_moments_leaves_never_blocks_or_loses(base, tmp_path, capsys):
    """A second break-it round on the marks (core.atomic.MARK): an empty .NAME.bak (a save killed between removing
    its mark and its folder) blocked every later save as "the user's"; a reader whose shell stood inside a cut
    save's backup (`--model .`) removed the mark that lets the next command put it back; a user's own file named
    like the mark, with something in it, was deleted; and a lock that is a folder or a link is never removed."""
    ck = copy_ck(base, tmp_path / "m")
    (tmp_path / ".m.bak").mkdir()  # empty: removing it loses nothing
    assert main(["train", "--resume", str(ck), "--tune-steps", "3", "-q"]) == 0
    assert not (tmp_path / ".m.bak").exists()

    ck.rename(tmp_path / ".m.bak")  # a save cut between its two renames (which marks the old folder first)
    (tmp_path / ".m.bak" / MARK).touch()
    os.chdir(tmp_path / ".m.bak")
    try:
        assert main(["chat", "--model", ".", "--prompt", "hi", "--max-tokens", "2"]) == 0
    finally:
        os.chdir(tmp_path)
    assert (tmp_path / ".m.bak" / MARK).is_file()  # still the swap's: the next command puts it back
    assert main(["chat", "--model", str(ck), "--prompt", "hi", "--max-tokens", "2"]) == 0
    assert ck.is_dir() and not (tmp_path / ".m.bak").exists() and not (ck / MARK).exists()

    (ck / MARK).write_text("my notes\n")  # the user's file of that name: theirs
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--tune-steps", "4", "-q"]) != 0
    assert f"holds {MARK}, which this app did not write" in capsys.readouterr().err
    assert (ck / MARK).read_text() == "my notes\n"
    (ck / MARK).unlink()
    other = tmp_path / ".m2.bak"
    other.mkdir()
    (other / MARK).write_text("x\n")
    (other / "a.txt").write_text("a\n")
    m2 = copy_ck(base, tmp_path / "m2")
    assert main(["chat", "--model", str(m2), "--prompt", "hi", "--max-tokens", "2"]) == 0
    assert (other / "a.txt").read_text() == "a\n"

    for kind in ("folder", "link"):
        lock = tmp_path / ".lk.lock"
        lock.mkdir() if kind == "folder" else lock.symlink_to(tmp_path / "nowhere")
        assert main(["train", *TINY, "--steps", "1", "--out", str(tmp_path / "lk")]) != 0
        assert "cannot be read as a lock of this app" in capsys.readouterr().err
        assert lock.is_dir() if kind == "folder" else lock.is_symlink()
        lock.rmdir() if kind == "folder" else lock.unlink()


def test_an_hf_export_through_a_linked_folder_replaces_the_folder_it_names(base, tmp_path, capsys):
    """`export --format hf --out hf --overwrite` where hf is a link to an earlier export elsewhere emptied that
    folder and put a real folder in place of the link. As a file export does, it now replaces the folder the link
    names and keeps the link."""
    real = tmp_path / "big" / "hfreal"
    real.parent.mkdir()
    assert main(["export", "--model", str(base), "--format", "hf", "--out", str(real)]) == 0
    link = tmp_path / "hf"
    link.symlink_to(real, target_is_directory=True)
    assert main(["export", "--model", str(base), "--format", "hf", "--out", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and (real / "config.json").is_file() and not (real / MARK).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "hf"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["hfreal"]


def test_an_export_takes_its_target_as_one_writer(base, tmp_path, capsys):
    """Exports took no lock: two exports into one folder at once could leave a ``.NAME.bak`` no swap marked, which
    blocked later saves. An export now holds its target (core.checkpoint_meta.export_target) while it checks and
    writes it: one whose target, or a folder above it, another live process holds is refused, one line naming the
    holder, and writes nothing; a finished export leaves no lock file behind."""
    for target, extra in ((tmp_path / "m.gguf", []), (tmp_path / "hf", ["--format", "hf"])):
        holder = subprocess.Popen([sys.executable, "-c", "import time; from core.folder_lock import FolderLock; "
                                   f"FolderLock({str(target)!r}, 'an export').acquire(); print('held', flush=True); "
                                   "time.sleep(60)"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert holder.stdout.readline().strip() == "held"
            before = snapshot(tmp_path)
            capsys.readouterr()
            assert main(["export", "--model", str(base), *extra, "--out", str(target)]) != 0
            err = capsys.readouterr().err
            assert f"{target}: in use by process {holder.pid} on host" in err and "an export" in err, err
            assert len(err.strip().splitlines()) == 1 and snapshot(tmp_path) == before
        finally:
            holder.kill()
            holder.wait()
        assert main(["export", "--model", str(base), *extra, "--out", str(target)]) == 0  # its stale lock taken over
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")]
    # a folder the app holds as a project: another process's export into it is refused
    project = tmp_path / "proj"
    project.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; from core.folder_lock import FolderLock; "
                               f"FolderLock({str(project)!r}, 'OpenCL LLM Studio').acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(["export", "--model", str(base), "--out", str(project / "m.gguf")]) != 0
        assert "OpenCL LLM Studio" in capsys.readouterr().err and not (project / "m.gguf").exists()
    finally:
        holder.kill()
        holder.wait()


def _hold(folder: Path, what: str) -> subprocess.Popen:
    """Another process holding ``folder`` (core.folder_lock) until killed."""
    p = subprocess.Popen([sys.executable, "-c", "import time; from core.folder_lock import FolderLock; "
                          f"FolderLock({str(folder)!r}, {what!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    return p


def test_chat_with_a_run_another_process_trains_says_so(base, tmp_path, capsys):
    """`chat` on a folder that another process is training (a resume): the note said "stopped ... continue it:
    opencl-llm train --resume" of a run that was running; it now names the process and that this is its last save."""
    import json

    ck = tmp_path / "ck"
    shutil.copytree(base, ck)
    meta = json.loads((ck / "config.json").read_text())
    meta.update(stage_index=0, stage_step=2)  # saved at pretraining's step 2
    (ck / "config.json").write_text(json.dumps(meta))
    holder = _hold(ck, "opencl-llm train")
    try:
        capsys.readouterr()
        assert main(["chat", "--model", str(ck), "--prompt", "hi"]) == 0
        err = capsys.readouterr().err
        assert f"note: {ck} is being trained now by process {holder.pid} on host" in err, err
        assert "this is its last save at pretrain step 2, so its answers may change" in err and "--resume" not in err
    finally:
        holder.kill()
        holder.wait()
    assert main(["chat", "--model", str(ck), "--prompt", "hi"]) == 0  # the holder gone: stopped, continue it
    assert f"continue it: opencl-llm train --resume {ck}" in capsys.readouterr().err
    for what, folder in (("OpenCL LLM Studio", tmp_path), ("opencl-llm train, resuming from it into other", ck)):
        _not_training(ck, _hold(folder, what), capsys)  # an app with the folder above open; a resume into another


def _not_training(ck: Path, holder: subprocess.Popen, capsys) -> None:
    try:
        assert main(["chat", "--model", str(ck), "--prompt", "hi"]) == 0
        err = capsys.readouterr().err
        assert "being trained now" not in err and f"continue it: opencl-llm train --resume {ck}" in err, err
    finally:
        holder.kill()
        holder.wait()


def test_an_export_checks_locks_and_writes_one_and_the_same_folder(base, tmp_path, capsys):
    """From a break-it helper: `export --format hf --out lnk/../mydocs` (lnk a link to a folder elsewhere) checked and
    locked the folder the OS names (beside the link's target) but wrote ./mydocs, deleting the user's notes in it (or
    a trained checkpoint). Now the folder checked, locked and written is one: the one the OS walks to."""
    (tmp_path / "other" / "sub").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "other" / "sub", target_is_directory=True)
    (tmp_path / "mydocs").mkdir()
    (tmp_path / "mydocs" / "notes.txt").write_text("precious\n")
    shutil.copytree(base, tmp_path / "ck")
    ck_before = snapshot(tmp_path / "ck")
    for name, extra in (("mydocs", ["--format", "hf"]), ("ck", ["--format", "hf"])):
        assert main(["export", "--model", str(base), *extra, "--out", str(tmp_path / "lnk" / ".." / name)]) == 0
        assert (tmp_path / "other" / name / "config.json").is_file()
    assert (tmp_path / "mydocs" / "notes.txt").read_text() == "precious\n" and snapshot(tmp_path / "ck") == ck_before
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".lock", ".bak"))]


def test_a_train_target_too_long_for_a_saves_temp_folder_is_refused_before_training(tmp_path, capsys):
    """`train --out` with a 245-character name trained its first stage, then failed to save it ("File name too long":
    the save's temp folder .NAME.tmp-HOST-PID-XXXXXX is 23+ characters longer). It is refused before training, one
    line naming the longest name that fits, and writes nothing; that name trains and saves."""
    from core.atomic import swap_name_problem

    why = swap_name_problem(tmp_path / ("m" * 245))
    assert why is not None and why.startswith(str(tmp_path / ("m" * 245)) + ": name too long for a save"), why
    fits = int(why.rsplit("at most ", 1)[1].split()[0])
    assert 200 < fits < 245 and swap_name_problem(tmp_path / ("m" * fits)) is None
    assert swap_name_problem(tmp_path / ("m" * (fits + 1))) is not None
    before = snapshot(tmp_path)
    assert main(["train", *TINY, "--out", str(tmp_path / ("m" * 245)), "--pretrain-steps", "1", "--tune-steps", "1"]) != 0
    cap = capsys.readouterr()
    assert "name too long for a save" in cap.err and len(cap.err.strip().splitlines()) == 1, cap.err
    assert "pretrain step" not in cap.out and snapshot(tmp_path) == before
    assert main(["train", *TINY, "--out", str(tmp_path / ("m" * fits)), "--pretrain-steps", "1", "--tune-steps", "1"]) == 0
    assert_ours(tmp_path / ("m" * fits))


def test_a_refused_export_writes_nothing_and_odd_targets_get_one_line(base, tmp_path, capsys):
    """A refused export into a checkpoint folder created the folders on the way and its lock file there (so `train
    --resume` then refused the checkpoint); an HF export made every missing folder above it; a target name near the
    file system's limit failed on the lock's temp name; `--out /` said "PosixPath('/') has an empty name"; a GGUF
    export deleted a user's `.m.gguf.my notes.tmp`."""
    ck = tmp_path / "ck"
    shutil.copytree(base, ck)
    before = snapshot(tmp_path)
    for out, extra in ((ck / "sub" / "deeper" / "hf", ["--format", "hf"]), (ck / "x.gguf", []),
                       (tmp_path / "nope" / "a" / "hf", ["--format", "hf"]), (tmp_path / "nope" / "m.gguf", [])):
        capsys.readouterr()
        assert main(["export", "--model", str(base), *extra, "--out", str(out)]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("inside the checkpoint folder" in err or "folder does not exist" in err)
        assert snapshot(tmp_path) == before, out
    assert main(["export", "--model", str(base), "--format", "hf", "--out", "/"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "root folder" in err and "PosixPath" not in err, err
    long = tmp_path / ("a" * 233 + ".gguf")  # 238 characters, as the helper's
    assert main(["export", "--model", str(base), "--out", str(long)]) == 0 and long.is_file()
    notes = tmp_path / ".m.gguf.my notes.tmp"
    notes.write_text("mine\n")
    assert main(["export", "--model", str(base), "--out", str(tmp_path / "m.gguf")]) == 0
    assert main(["export", "--model", str(base), "--out", str(tmp_path / "m.gguf"), "--overwrite"]) == 0
    assert notes.read_text() == "mine\n"


def test_a_project_opened_through_a_link_is_held_for_exports(base, tmp_path, capsys):
    """The app locked a project opened as `plink` (a link) beside the link, exports locked the real folder: another
    process's export into the project was not refused. Locks are now of the resolved folder."""
    (tmp_path / "preal").mkdir()
    (tmp_path / "plink").symlink_to(tmp_path / "preal", target_is_directory=True)
    holder = _hold(tmp_path / "plink", "OpenCL LLM Studio")
    try:
        for extra, out in (([], "x.gguf"), (["--format", "hf"], "hf")):
            capsys.readouterr()
            assert main(["export", "--model", str(base), *extra, "--out", str(tmp_path / "plink" / out)]) != 0
            assert "OpenCL LLM Studio" in capsys.readouterr().err and not (tmp_path / "preal" / out).exists()
    finally:
        holder.kill()
        holder.wait()


LOCK_RACER = """
import os, sys, time
from core.folder_lock import FolderBusyError, FolderLock
target, log, go = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < go:
    pass
try:
    lk = FolderLock(target, "racer").acquire()
except FolderBusyError:
    sys.exit(0)
t0 = time.time()
time.sleep(0.2)
with open(log, "a") as f:
    f.write(f"{t0} {time.time()}\\n")
lk.release()
"""


def test_a_stale_lock_taken_over_by_several_processes_at_once_has_one_holder(tmp_path):
    """From a break-it helper: two processes that both found a dead holder's lock each removed it, and one then
    removed the other's new lock: both held the folder (19 of 100 rounds). A stale lock is now set aside and
    removed only where it is the file judged stale (core.folder_lock._take_over)."""
    script = tmp_path / "racer.py"
    script.write_text(LOCK_RACER)
    target, log = tmp_path / "t.gguf", tmp_path / "held.log"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for _ in range(30):  # the old code had two holders in the first of 40 rounds here
        (tmp_path / ".t.gguf.lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                                            "started": 1.0, "proc_start": "", "what": "x"}) + "\n")
        go = time.time() + 0.6
        racers = [subprocess.Popen([sys.executable, str(script), str(target), str(log), str(go)], cwd=ROOT)
                  for _ in range(3)]
        for r in racers:
            assert r.wait() == 0
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) >= 30  # every round someone held it
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), spans  # never two at once
