"""Issue 9 item 7, the smaller fixes: the chat's placeholder, the lr plot's legend, a stale ETA after
Stop, one default preset for the app and the CLI."""
from __future__ import annotations

from tests.test_gui_e2e import configure_tiny, save_tiny_checkpoint, wait_idle


def test_the_chat_placeholder_asks_to_train_only_without_a_model(main_window):
    from gui.chat_tab import PLACEHOLDER_MODEL, PLACEHOLDER_NO_MODEL

    c = main_window.chat_tab
    assert c.model_source() is None and c.transcript.placeholderText() == PLACEHOLDER_NO_MODEL
    save_tiny_checkpoint(main_window.project.checkpoint_dir)
    main_window.state.notify_model_saved(str(main_window.project.checkpoint_dir))
    assert c.model_source() is not None
    assert c.transcript.placeholderText() == PLACEHOLDER_MODEL and "Train" not in PLACEHOLDER_MODEL


def test_a_reopened_project_with_a_model_does_not_ask_to_train(main_window, studio_env, qtbot):
    from gui.chat_tab import PLACEHOLDER_MODEL
    from gui.main_window import MainWindow

    save_tiny_checkpoint(main_window.project.checkpoint_dir)
    main_window.close()
    again = MainWindow()
    qtbot.addWidget(again)
    try:
        assert again.chat_tab.transcript.placeholderText() == PLACEHOLDER_MODEL
    finally:
        again.close()


def test_the_lr_plot_has_no_legend_over_its_curve(main_window):
    plots = main_window.training_tab.plots
    assert plots.lr_plot.getPlotItem().legend is None  # one curve, named by the title
    assert plots.lr_plot.getPlotItem().titleLabel.text == "Learning rate"
    assert plots.loss_plot.getPlotItem().legend is not None  # several series there


def test_no_eta_is_left_standing_after_stop(main_window, qtbot):
    w, t = main_window, main_window.training_tab
    configure_tiny(w, pretrain=400, dialogues=0, batch=2)
    assert t.start()
    qtbot.waitUntil(lambda: "ETA" in t.speed_label.text(), timeout=120_000)
    t.stop()
    t._update_labels()  # the next redraw while the last step finishes
    assert "ETA" not in t.speed_label.text() and t.stage_label.text().startswith("Stopping")
    wait_idle(qtbot, t, timeout=60_000)
    assert "ETA" not in t.speed_label.text() and t.stage_label.text().startswith("Stopped")


def test_the_app_and_the_cli_default_to_auto(main_window):
    from core.cli import build_parser
    from core.plan import AUTO

    assert main_window.hyper_tab.preset.currentText() == AUTO
    args = build_parser().parse_args(["train"])
    assert args.preset is None  # the CLI's Auto (see core.cli: None or "Auto" plans)
    assert "default: Auto" in build_parser()._subparsers._group_actions[0].choices["train"].format_help()


def test_a_stop_in_the_last_recall_check_is_named_not_called_no_check(main_window):
    """A stop during the last stage's recall check ends the run finished but without a verdict; the label said
    "Training finished (no recall check)", as of a run that never checks. It says the check was stopped."""
    from core.events import RunDone, StageReport

    t = main_window.training_tab
    status = t.status
    t._on_stage_done(StageReport("dialogues", 2, False, (), recall_stopped=True))
    status.run_done(RunDone(stopped=False, finished=True, checkpoint="ck", stage_index=2, stage_step=0, replaced=True))
    assert status.stage_label.text().startswith("Training finished; its last recall check was stopped, so there is "
                                                "no verdict")
    status.finished(True)  # the worker's end after a stop request: the run's end stays (it became "Stopped")
    assert status.stage_label.text().startswith("Training finished; its last recall check was stopped")
    status.begin(False, 0.0)  # a new run forgets it
    status.run_done(RunDone(stopped=False, finished=True, checkpoint="ck", stage_index=2, stage_step=0, replaced=True))
    assert status.stage_label.text().startswith("Training finished (no recall check)")
