"""History kept (issue 9 item 6): a project's plots, log, recall table and chat transcript are saved with
it and come back in a new window; earlier runs' loss can be overlaid; nothing non-finite is written, an
unreadable history file is moved aside, not lost."""
from __future__ import annotations

import json
import math

import pytest

from gui.history import (CHAT_FILE, HISTORY_FILE, MAX_RUNS, HistoryError, chat_text, history_text, load_history,
                         parse_history)
from tests.test_gui_e2e import configure_tiny, wait_idle


def _strict_json(path):
    """The file's JSON, failing on NaN/Infinity (which json.loads would accept)."""
    def refuse(name):
        raise AssertionError(f"{path}: non-finite number {name}")

    return json.loads(path.read_text("utf-8"), parse_constant=refuse)


def _recall_rows(t) -> list[list[str]]:
    return [[t.recall.cell(r, c) for c in range(6)] for r in range(t.recall.rowCount())]


def test_plots_recall_log_and_chat_come_back_in_a_new_window(main_window, studio_env, qtbot, dialogs):
    from gui.main_window import MainWindow

    w, t, c = main_window, main_window.training_tab, main_window.chat_tab
    configure_tiny(w, pretrain=4, dialogues=2, batch=2)
    assert t.start()
    wait_idle(qtbot, t)
    assert t.banner.isHidden(), t.banner_text.text()
    assert c.send("Where is Brindlewick?")
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    loss = (list(t.plots.loss.x), list(t.plots.loss.y))
    lr, layers = list(t.plots.lr.y), [list(s.y) for s in t.plots.layers]
    val = list(t.plots.val["dialogues"].y)
    rows, summary = _recall_rows(t), t.recall_label.text()
    log, verdict, speed = t.log.toPlainText(), t.stage_label.text(), t.speed_label.text()
    transcript, answer = c.transcript.toPlainText(), c.last_answer()
    assert len(loss[0]) == 6 and rows and val and "starting training" in log and answer
    folder = w.project.folder
    w.close()
    for name in (HISTORY_FILE, CHAT_FILE):
        _strict_json(folder / name)

    again = MainWindow()
    qtbot.addWidget(again)
    try:
        t2, c2 = again.training_tab, again.chat_tab
        assert again.project.folder == folder
        assert (list(t2.plots.loss.x), list(t2.plots.loss.y)) == loss
        assert t2.plots.point_count() == 6  # drawn, not only kept
        assert list(t2.plots.lr.y) == lr and [list(s.y) for s in t2.plots.layers] == layers
        assert list(t2.plots.val["dialogues"].y) == val
        assert _recall_rows(t2) == rows and t2.recall_label.text() == summary
        assert t2.log.toPlainText().startswith(log)
        assert t2.stage_label.text() == verdict and not verdict.startswith("Training finished")
        assert t2.speed_label.text() == speed
        assert c2.transcript.toPlainText() == transcript and "Where is Brindlewick?" in transcript
        assert c2.remembered_turns() == [("Where is Brindlewick?", answer)]

        # the model takes over the restored conversation: its history holds the old turn and the new one
        assert c2.send("Where is Brindlewick?")
        qtbot.waitUntil(lambda: not c2.is_answering(), timeout=60_000)
        assert [q for q, _ in c2._worker._session.history] == ["Where is Brindlewick?"] * 2

        # a second run: the first one's loss can be overlaid faintly
        assert not t2.earlier_check.isEnabled()
        dialogs.answer = True
        configure_tiny(again, pretrain=3, dialogues=0, batch=2)
        assert t2.start()
        wait_idle(qtbot, t2)
        assert t2.plots.point_count() == 3
        assert t2.earlier_check.isEnabled() and t2.plots.earlier_runs_shown() == 0
        t2.earlier_check.setChecked(True)
        assert t2.plots.earlier_runs_shown() == 1
        xs, ys = t2.plots.earlier_curves[0].getData()
        assert list(xs) == loss[0] and list(ys) == loss[1]
        again.save()
        runs = _strict_json(folder / HISTORY_FILE)["runs"]
        assert len(runs) == 2 and list(runs[0]["series"]) == ["loss"] and runs[0]["series"]["loss"] == [*loss]
        assert runs[1]["series"]["loss"][1] == list(t2.plots.loss.y)
        assert len(runs[1]["recall"]) == t2.recall.rowCount() and {r[0] for r in runs[1]["recall"]} == {"pretrain"}
    finally:
        again.close()


def test_a_model_without_kept_plots_does_not_say_training_finished(main_window, studio_env, qtbot):
    from gui.main_window import MainWindow
    from gui.training_tab import NO_PLOTS_NOTE

    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=2, dialogues=1, batch=2)
    assert t.start()
    wait_idle(qtbot, t)
    folder = w.project.folder
    w.close()
    (folder / HISTORY_FILE).unlink()  # as a model trained before the app kept its history
    again = MainWindow()
    qtbot.addWidget(again)
    try:
        t2 = again.training_tab
        assert again.trained_model_path() is not None and not t2.plots.loss.x
        assert t2.stage_label.text() == NO_PLOTS_NOTE and "Training finished" not in NO_PLOTS_NOTE
    finally:
        again.close()


def test_an_unreadable_history_is_moved_aside_and_named(tmp_path):
    (tmp_path / HISTORY_FILE).write_text("{not json", "utf-8")
    (tmp_path / CHAT_FILE).write_text(json.dumps({"format": "opencl-llm-studio-chat", "version": 1,
                                                  "turns": [{"user": 3}]}), "utf-8")
    history, chat, warnings = load_history(tmp_path)
    assert history == {"runs": [], "log": []} and chat == []
    assert len(warnings) == 2
    assert str(tmp_path / HISTORY_FILE) in warnings[0] and "training-history.json.unreadable" in warnings[0]
    assert "turns[0].user: not text" in warnings[1]
    assert (tmp_path / "training-history.json.unreadable").read_text("utf-8") == "{not json"
    assert not (tmp_path / HISTORY_FILE).exists()


def test_history_refuses_non_finite_numbers_and_names_the_field():
    run = {"series": {"loss": [[1, 2], [2.5, math.nan]]}}
    with pytest.raises(ValueError):
        history_text({"runs": [run], "log": []})
    with pytest.raises(HistoryError, match=r"runs\[0\]\.series\.loss: nan is not a finite number"):
        parse_history({"runs": [run]})
    with pytest.raises(HistoryError, match=r"runs\[0\]\.series\.loss: not two lists"):
        parse_history({"runs": [{"series": {"loss": [[1, 2], [2.5]]}}]})
    with pytest.raises(HistoryError, match=r"runs\[0\]\.recall\[0\]"):
        parse_history({"runs": [{"recall": [["tune", "dialogue", "q", "a", "a", "yes"]]}]})


def test_history_keeps_the_latest_run_whole_and_earlier_losses():
    runs = [{"started": str(i), "series": {"loss": [[1, 2], [3.0, 2.0 - i / 100]], "lr": [[1, 2], [0.1, 0.2]]},
             "recall": [["dialogues", "dialogue", "q", "a", "b", False]], "status": f"run {i}"} for i in range(MAX_RUNS + 5)]
    data = json.loads(history_text({"runs": runs, "log": ["a", "b"]}))
    back = parse_history(data)["runs"]
    assert len(back) == MAX_RUNS and back[-1]["started"] == str(MAX_RUNS + 4)
    assert back[-1]["series"]["lr"] == [[1, 2], [0.1, 0.2]] and back[-1]["recall"] == runs[-1]["recall"]
    assert all(list(r["series"]) == ["loss"] and not r["recall"] for r in back[:-1])
    assert back[0]["series"]["loss"] == runs[5]["series"]["loss"] and back[0]["status"] == "run 5"
    assert json.loads(chat_text([{"user": "q", "model": "a", "note": "", "remembered": True}]))["turns"][0]["model"] == "a"


def test_save_as_takes_the_history_along_and_a_new_project_starts_without(main_window, tmp_path, dialogs):
    from gui.events import TrainingStep

    w, t, c = main_window, main_window.training_tab, main_window.chat_tab
    t._new_run()  # as Start does
    for i in (1, 2):
        t.plots.add_step(TrainingStep(stage="pretrain", step=i, total_steps=2, global_step=i, loss=3.0 / i,
                                      grad_norm=1.0, lr=1e-3, layer_grad_norms=(1.0, 2.0)))
    t.plots.add_step(TrainingStep(stage="pretrain", step=3, total_steps=3, global_step=3, loss=math.inf,
                                  grad_norm=math.nan, lr=1e-3, layer_grad_norms=(math.nan, 2.0), skipped=True))
    c._turns = [{"user": "Q?", "model": "A.", "note": "", "remembered": True}]
    untitled = w.project.folder
    w.save_project_as(tmp_path / "named")
    runs = _strict_json(tmp_path / "named" / HISTORY_FILE)["runs"]  # the skipped step's inf/nan are not kept
    assert runs[-1]["series"]["loss"] == [[1, 2], [3.0, 1.5]] and runs[-1]["series"]["skipped"] == [[3], [1.5]]
    assert _strict_json(tmp_path / "named" / CHAT_FILE)["turns"][0]["user"] == "Q?"
    assert t.plots.loss.y == [3.0, 1.5] and c.remembered_turns() == [("Q?", "A.")]
    assert not (untitled / HISTORY_FILE).exists()  # the untitled project's own files went with it
    dialogs.answer = True
    w._new_project_dialog()
    assert not t.plots.loss.x and not c.saved_transcript() and c.transcript.toPlainText() == ""
