"""Projects on disk: nothing but a project's own files is ever deleted or overwritten; broken
projects are refused; settings stay inside $OPENCL_LLM_STUDIO_DATA; the export path is outside it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from core.dataset import Dataset


def _user_files(folder: Path) -> list[Path]:
    """Files a user put into a project folder (an export, a Modelfile, notes)."""
    files = [folder / "model.gguf", folder / "model.Modelfile", folder / "notes" / "todo.txt"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("mine", "utf-8")
    return files


def test_default_export_path_is_outside_the_data_folder(main_window, studio_env):
    from gui.paths import data_dir

    path = Path(main_window.export_tab.path.text())
    assert path.name == "model.gguf"
    assert data_dir().resolve() not in path.resolve().parents


def test_export_path_follows_the_last_export_folder(studio_env, qtbot):
    from gui.main_window import MainWindow

    folder = studio_env / "exports"
    folder.mkdir()
    QSettings().setValue("export/folder", str(folder))
    w = MainWindow()
    qtbot.addWidget(w)
    try:
        assert Path(w.export_tab.path.text()) == folder / "model.gguf"
    finally:
        w.close()


def test_save_as_from_untitled_keeps_other_files(main_window, tmp_path):
    untitled = main_window.project.folder
    mine = _user_files(untitled)
    main_window.save_project_as(tmp_path / "named")
    assert all(f.read_text("utf-8") == "mine" for f in mine)
    assert not (untitled / "project.json").exists() and not (untitled / "dataset.json").exists()


def test_new_project_keeps_other_files_and_says_so(main_window, dialogs):
    untitled = main_window.project.folder
    mine = _user_files(untitled)
    main_window.dataset_tab.set_dataset(Dataset(["Only fact."], []))
    main_window.save()
    dialogs.answer = False
    main_window._new_project_dialog()
    assert main_window.dataset_tab.dataset().facts == ["Only fact."]  # declined: nothing changed
    assert "trained model" in dialogs.asked[0][1] and "Other files" in dialogs.asked[0][1]
    dialogs.answer = True
    main_window._new_project_dialog()
    assert main_window.dataset_tab.dataset().facts != ["Only fact."]
    assert all(f.read_text("utf-8") == "mine" for f in mine)


def test_save_as_refuses_a_folder_inside_the_project(main_window, dialogs, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from gui.project import ProjectError

    untitled = main_window.project.folder
    inside = untitled / "sub"
    with pytest.raises(ProjectError, match="inside"):
        main_window.save_project_as(inside)
    with pytest.raises(ProjectError, match="inside"):
        main_window.save_project_as(untitled)
    assert main_window.project.folder == untitled and (untitled / "project.json").is_file()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(inside)))
    main_window._save_as_dialog()
    assert dialogs.warned and "inside" in dialogs.warned[0][1]
    assert main_window.project.folder == untitled


def test_save_as_over_another_project_asks_and_over_foreign_files_refuses(main_window, tmp_path, dialogs):
    from gui.project import ProjectError

    other = tmp_path / "other"
    main_window.save_project_as(other)
    main_window.new_project()
    with pytest.raises(ProjectError, match="already holds a project"):
        main_window.save_project_as(other)
    main_window.save_project_as(other, replace=True)
    assert main_window.project.folder == other
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "dataset.json").write_text("{}", "utf-8")
    with pytest.raises(ProjectError, match="dataset.json"):
        main_window.save_project_as(foreign)
    assert (foreign / "dataset.json").read_text("utf-8") == "{}"


@pytest.mark.parametrize("content", ['{"facts": 5}', '{"facts": ["ok", 7], "dialogues": []}', '{"facts": [}'])
def test_a_project_with_a_broken_dataset_is_refused_and_not_overwritten(main_window, tmp_path, dialogs, content):
    from gui.project import ProjectError

    broken = tmp_path / "broken"
    main_window.save_project_as(broken)
    main_window.new_project()
    (broken / "dataset.json").write_text(content, "utf-8")
    with pytest.raises(ProjectError, match="dataset.json"):
        main_window.open_project(broken)
    main_window._open_with_message(str(broken))
    assert dialogs.warned and "dataset.json" in dialogs.warned[-1][1]
    assert main_window.is_untitled()
    main_window.save()
    assert (broken / "dataset.json").read_text("utf-8") == content


def test_a_broken_last_project_is_not_overwritten_at_start(studio_env, qtbot, dialogs):
    from gui.main_window import MainWindow
    from gui.paths import untitled_dir

    w = MainWindow()
    qtbot.addWidget(w)
    w.close()
    ds = untitled_dir() / "dataset.json"
    ds.write_text('{"facts": 5}', "utf-8")
    again = MainWindow()
    qtbot.addWidget(again)
    try:
        qtbot.waitUntil(lambda: bool(dialogs.warned), timeout=2000)
        qtbot.wait(100)
        aside = [p for p in untitled_dir().parent.iterdir() if p.name.startswith("untitled-unreadable")]
        assert len(aside) == 1 and (aside[0] / "dataset.json").read_text("utf-8") == '{"facts": 5}'
        # one message, naming the broken file where it is now (not the fresh project's path)
        assert len(dialogs.warned) == 1 and "moved" in dialogs.warned[0][1]
        assert f"{aside[0] / 'dataset.json'}" in dialogs.warned[0][1] and f"{ds}" not in dialogs.warned[0][1]
        assert again.dataset_tab.dataset().facts  # a fresh untitled project
    finally:
        again.close()


def test_a_broken_project_given_at_start_is_not_overwritten(studio_env, qtbot, dialogs):
    from gui.main_window import MainWindow

    folder = studio_env / "given"
    folder.mkdir()
    (folder / "project.json").write_text(json.dumps({"format": "opencl-llm-studio-project", "version": 1}), "utf-8")
    (folder / "dataset.json").write_text('{"dialogues": {}}', "utf-8")
    w = MainWindow(project_dir=folder)
    qtbot.addWidget(w)
    try:
        qtbot.waitUntil(lambda: bool(dialogs.warned), timeout=2000)
        assert w.is_untitled()
        assert (folder / "dataset.json").read_text("utf-8") == '{"dialogues": {}}'
    finally:
        w.close()


def test_data_variable_isolates_the_settings(qapp, tmp_path, monkeypatch):
    from gui.app import set_app_identity

    monkeypatch.setenv("OPENCL_LLM_STUDIO_DATA", str(tmp_path / "data"))
    set_app_identity(qapp)
    s = QSettings()
    s.setValue("test/isolated", 1)
    s.sync()
    assert Path(s.fileName()).resolve().is_relative_to((tmp_path / "data").resolve()), s.fileName()
    assert Path(s.fileName()).is_file()


def test_export_asks_before_replacing_a_typed_file_and_names_the_modelfile(main_window, tmp_path, dialogs, qtbot):
    from tests.test_gui_e2e import save_tiny_checkpoint

    save_tiny_checkpoint(main_window.project.checkpoint_dir)
    e = main_window.export_tab
    e.refresh()
    target = tmp_path / "Brindle wick.gguf"
    target.write_text("keep me", "utf-8")
    e.path.setText(str(target))
    assert "ollama create brindle-wick -f 'Brindle wick.Modelfile'" in e.hint.text()
    dialogs.answer = False
    assert not e.export()
    assert target.read_text("utf-8") == "keep me" and "already exists" in dialogs.asked[-1][1]
    dialogs.answer = True
    assert e.export()
    qtbot.waitUntil(lambda: not e.is_exporting(), timeout=60_000)
    assert e.last_result is not None and target.stat().st_size > 100
    assert QSettings().value("export/folder") == str(tmp_path)


def test_a_project_held_by_another_process_is_refused(main_window, tmp_path):
    """One writer per folder: `opencl-llm train --out PROJECT/checkpoint` running elsewhere keeps the app
    from opening the project (the message names the process); once it has exited, the project opens."""
    import subprocess
    import sys

    from gui.project import ProjectError

    other = tmp_path / "other"
    main_window.save_project_as(other)
    main_window.new_project()
    root = Path(__file__).resolve().parent.parent
    holder = subprocess.Popen([sys.executable, "-c", "import time; from core.folder_lock import FolderLock; "
                               f"FolderLock({str(other / 'checkpoint')!r}, 'opencl-llm train').acquire(); "
                               "print('held', flush=True); time.sleep(60)"], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ProjectError, match=f"process {holder.pid} .*opencl-llm train"):
            main_window.open_project(other)
        assert main_window.is_untitled()
    finally:
        holder.kill()
        holder.communicate()
    main_window.open_project(other)  # the dead holder's lock is stale
    assert main_window.project.folder == other


def test_export_asks_before_replacing_a_modelfile_and_its_hints_match_the_file(main_window, tmp_path, dialogs, qtbot):
    """The Modelfile beside the GGUF file is not replaced without asking either; the Export tab's
    commands are the Modelfile's own (one model name) and llama-cli's is greedy with the model's context."""
    from core.checkpoint import CheckpointMeta
    from tests.test_gui_e2e import save_tiny_checkpoint

    save_tiny_checkpoint(main_window.project.checkpoint_dir)
    ctx = CheckpointMeta.read(main_window.project.checkpoint_dir).model.context_length
    e = main_window.export_tab
    e.refresh()
    target = tmp_path / "Brindle wick.gguf"
    modelfile = tmp_path / "Brindle wick.Modelfile"
    modelfile.write_text("my own Modelfile", "utf-8")
    e.path.setText(str(target))
    assert f"llama-cli -m 'Brindle wick.gguf' -cnv --temp 0 -c {ctx}" in e.hint.text()
    e.modelfile.setChecked(True)
    dialogs.answer = False
    assert not e.export()
    assert str(modelfile) in dialogs.asked[-1][1] and "already exists" in dialogs.asked[-1][1]
    assert modelfile.read_text("utf-8") == "my own Modelfile"
    target.write_text("an older export", "utf-8")
    assert not e.export()
    assert f"{target} and {modelfile} already exist. Replace them?" == dialogs.asked[-1][1]
    dialogs.answer = True
    assert e.export()
    qtbot.waitUntil(lambda: not e.is_exporting(), timeout=60_000)
    lines = modelfile.read_text("utf-8").splitlines()
    assert "# ollama create brindle-wick -f 'Brindle wick.Modelfile' && ollama run brindle-wick" in lines
    assert "ollama create brindle-wick -f 'Brindle wick.Modelfile'" in e.hint.text()
    n = len(dialogs.asked)
    assert e.export()  # the same files again: already agreed to
    qtbot.waitUntil(lambda: not e.is_exporting(), timeout=60_000)
    assert len(dialogs.asked) == n


def _model(folder: Path, tag: str, complete: bool = True) -> Path:
    folder.mkdir()
    (folder / "weights.npz").write_text(tag)
    if complete:
        (folder / "config.json").write_text("{}")
    return folder


@pytest.mark.parametrize("pending_complete", [True, False])
def test_a_promotion_cut_between_its_renames_leaves_one_whole_model(tmp_path, pending_complete):
    """A kill after the old model went aside and before the new run came in: the complete new run
    becomes the model, else the old model comes back; nothing is left aside."""
    from core.atomic import MARK, backup_path
    from gui.project import CHECKPOINT, PENDING, recover_project

    checkpoint = tmp_path / CHECKPOINT
    _model(backup_path(checkpoint), "old")  # the state between the two renames of swap_in_folder (which marks it)
    (backup_path(checkpoint) / MARK).touch()
    _model(tmp_path / PENDING, "new", complete=pending_complete)
    recover_project(tmp_path)
    assert (checkpoint / "weights.npz").read_text() == ("new" if pending_complete else "old")
    assert not backup_path(checkpoint).exists()


def test_promote_pending_replaces_the_model_and_a_legacy_aside_copy_is_finished(tmp_path):
    from gui.project import CHECKPOINT, PENDING, promote_pending, recover_project

    checkpoint = tmp_path / CHECKPOINT
    _model(checkpoint, "old")
    promote_pending(_model(tmp_path / PENDING, "new"), checkpoint)
    assert (checkpoint / "weights.npz").read_text() == "new" and not (tmp_path / PENDING).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]
    # an older build's aside name, cut before its second rename: the old model comes back
    checkpoint.rename(tmp_path / (CHECKPOINT + ".old"))
    recover_project(tmp_path)
    assert (checkpoint / "weights.npz").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]


def test_export_suggests_the_project_folders_exports_and_never_the_home_folder(main_window, studio_env,
                                                                              monkeypatch):
    """Issue 24: Export's default path was the home folder (no Documents folder there). A saved project
    suggests its own exports/ folder; the untitled one, without a last export folder or Documents, a
    folder of its own in the home folder."""
    import platformdirs

    from gui.paths import FALLBACK_EXPORTS, default_export_dir

    home = studio_env / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(platformdirs, "user_documents_dir", lambda: str(home / "Documents"))  # not there
    QSettings().remove("export/folder")
    assert default_export_dir() == home / FALLBACK_EXPORTS
    assert default_export_dir(main_window.project.folder) == home / FALLBACK_EXPORTS  # untitled: in the data folder
    (home / "Documents").mkdir()
    assert default_export_dir() == home / "Documents"

    towns = studio_env / "towns"
    main_window.save_project_as(towns)
    main_window.new_project()  # saves towns on the way out
    meta = json.loads((towns / "project.json").read_text("utf-8"))
    meta["settings"].pop("export", None)  # a project never exported: no path of its own
    (towns / "project.json").write_text(json.dumps(meta), "utf-8")
    main_window.open_project(towns)
    assert Path(main_window.export_tab.path.text()) == towns / "exports" / "towns.gguf"


def test_a_project_whose_dataset_gives_a_name_twice_opens_and_says_so(tmp_path):
    """A hand-edited dataset.json with a name given twice in an object (JSON reads its last value) is no entry
    that cannot be read: the project opens, and the warning names the file and the name (a break-it helper found
    it refused once the dataset reader began noting repeated names)."""
    from gui.project import load_project, new_project, save_project

    p = new_project(tmp_path / "proj")
    save_project(p)
    ds = p.folder / "dataset.json"
    text = ds.read_text(encoding="utf-8")
    assert text.lstrip().startswith("{")
    ds.write_text(text.replace("{", '{"version": 1,', 1), encoding="utf-8")
    project, warnings = load_project(p.folder)
    assert project.dataset == p.dataset
    assert warnings == [f'{ds}: "version" given twice in an object; only its last value is read']
