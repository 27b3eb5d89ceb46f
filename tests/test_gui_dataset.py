"""Dataset tab: editing, reordering, search, validation highlights, import/export round trip, autosave."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLineEdit

from core.dataset import Dataset, Dialogue, default_dataset, load_dataset
from gui.dataset_models import BAD, dialogue_summary


# The lists are Qt views on models over the dataset; these read and edit them as the user sees them
# (QListWidget items before: item(i).text(), .setText(), .isHidden(), .background()).
def _cell(view, row: int, col: int = 0):
    model = view.source() if hasattr(view, "source") else view.model()
    return model, model.index(row, col)


def _text(view, row: int, col: int = 0) -> str:
    model, idx = _cell(view, row, col)
    return model.data(idx)


def _set(view, row: int, text: str, col: int = 0) -> None:
    model, idx = _cell(view, row, col)
    assert model.setData(idx, text)


def _background(view, row: int, col: int = 0):
    model, idx = _cell(view, row, col)
    return model.data(idx, Qt.ItemDataRole.BackgroundRole)


def _hidden(view, row: int) -> bool:
    return not view.is_shown(row)


@pytest.fixture
def tab(main_window):
    main_window.tabs.setCurrentWidget(main_window.dataset_tab)
    return main_window.dataset_tab


def test_starts_with_default_dataset(tab):
    assert tab.dataset() == default_dataset()
    assert tab.facts.count() == len(default_dataset().facts)
    assert tab.dialogues.count() == len(default_dataset().dialogues)


def test_edit_reorder_and_round_trip(tab, tmp_path, qtbot):
    tab.set_dataset(Dataset(["Fact one.", "Fact two."], [Dialogue([("Hi?", "Hello.")])]))
    tab.add_fact()
    _set(tab.facts, 2, "Fact three.")
    assert tab.dataset().facts == ["Fact one.", "Fact two.", "Fact three."]
    tab.facts.setCurrentRow(2)
    tab._move_fact(-1)
    assert tab.dataset().facts == ["Fact one.", "Fact three.", "Fact two."]
    tab.facts.setCurrentRow(0)
    tab.remove_fact()
    assert tab.dataset().facts == ["Fact three.", "Fact two."]

    tab.add_dialogue()
    assert tab.dialogues.currentRow() == 1
    _set(tab.turns, 0, col=0, text="What is two plus two?")
    _set(tab.turns, 0, col=1, text="Four.")
    tab.add_turn()
    _set(tab.turns, 1, col=0, text="And three plus three?")
    _set(tab.turns, 1, col=1, text="Six.")
    tab.system.setText("Be brief.")
    tab.system.textEdited.emit("Be brief.")
    want = Dialogue([("What is two plus two?", "Four."), ("And three plus three?", "Six.")], "Be brief.")
    assert tab.dataset().dialogues[1] == want
    assert "What is two plus two?" in _text(tab.dialogues, 1)
    tab._move_dialogue(-1)
    assert tab.dataset().dialogues[0] == want

    expected = tab.dataset_copy()
    for name in ("out.json", "out.jsonl", "out.txt"):
        path = tmp_path / name
        tab.export_file(path)
        assert load_dataset(path) == (expected, [])
        tab.set_dataset(Dataset())
        assert tab.import_file(path) == ([], [])
        assert tab.dataset() == expected
    tab.import_file(tmp_path / "out.json", replace=False)
    assert len(tab.dataset().facts) == 2 * len(expected.facts)


def test_search_filters_both_lists(tab):
    tab.search.setText("octopus")
    visible_facts = [_text(tab.facts, i) for i in range(tab.facts.count()) if not _hidden(tab.facts, i)]
    assert visible_facts and all("octopus" in f.lower() for f in visible_facts)
    visible_dlg = [i for i in range(tab.dialogues.count()) if not _hidden(tab.dialogues, i)]
    assert len(visible_dlg) == 1
    tab.search.clear()
    assert not any(_hidden(tab.facts, i) for i in range(tab.facts.count()))


def test_validation_highlights_the_offending_entry(tab, qtbot):
    _set(tab.facts, 3, "   ")
    qtbot.waitUntil(lambda: any(p.kind == "fact" and p.index == 3 for p in tab.problems()), timeout=3000)
    assert _background(tab.facts, 3) == BAD
    assert _background(tab.facts, 2) != BAD
    assert "fact 4" in tab.problem_list.item(0).text()
    tab._goto_problem(tab.problem_list.item(0))
    assert tab.facts.currentRow() == 3

    tab.dialogues.setCurrentRow(2)
    _set(tab.turns, 1, col=1, text="")  # dialogue 3 has two turns; empty the second answer
    qtbot.waitUntil(lambda: any(p.kind == "dialogue" and p.index == 2 and p.turn == 1 for p in tab.problems()),
                    timeout=3000)
    assert _background(tab.dialogues, 2) == BAD
    assert _background(tab.turns, 1, 1) == BAD and _background(tab.turns, 0, 0) != BAD

    _set(tab.facts, 3, "Fixed fact.")
    _set(tab.turns, 1, col=1, text="Fixed answer.")
    qtbot.waitUntil(lambda: not tab.problems(), timeout=3000)
    assert _background(tab.facts, 3) != BAD


def test_special_token_text_is_reported(tab, qtbot):
    _set(tab.facts, 0, "hello <|eos|> world")
    qtbot.waitUntil(lambda: any("reserved" in p.message for p in tab.problems()), timeout=3000)


def test_training_refuses_a_dataset_with_problems(main_window, qtbot):
    _set(main_window.dataset_tab.facts, 0, "")
    assert not main_window.training_tab.start()
    assert "Fix the dataset" in main_window.training_tab.banner_text.text()


def test_edits_are_autosaved_and_restored(main_window, studio_env, qtbot):
    from gui.main_window import MainWindow

    tab = main_window.dataset_tab
    tab.add_fact()
    _set(tab.facts, tab.facts.count() - 1, "An autosaved fact.")
    folder = main_window.project.folder
    qtbot.waitUntil(lambda: "An autosaved fact." in (folder / "dataset.json").read_text("utf-8"), timeout=5000)
    main_window.close()
    again = MainWindow()
    qtbot.addWidget(again)
    try:
        assert again.project.folder == folder
        assert again.dataset_tab.dataset().facts[-1] == "An autosaved fact."
    finally:
        again.close()


def test_unsaved_edit_is_written_on_close(main_window):
    main_window.dataset_tab.add_fact()
    _set(main_window.dataset_tab.facts, main_window.dataset_tab.facts.count() - 1, "Written on close.")
    folder = main_window.project.folder
    main_window.close()  # before the autosave timer fires
    data = json.loads((folder / "dataset.json").read_text("utf-8"))
    assert data["facts"][-1] == "Written on close."


def _visible(view) -> list[int]:
    return [i for i in range(view.count()) if view.is_shown(i)]


def test_search_hides_the_selection_and_remove_acts_only_on_visible_facts(tab):
    tab.set_dataset(Dataset(["apple one", "pear two", "apple three", "pear four"], []))
    tab.facts.setCurrentRow(1)  # "pear two"
    tab.search.setText("apple")
    assert tab.facts.currentRow() == -1 and not tab.fact_remove.isEnabled()
    tab.remove_fact()
    assert tab.dataset().facts == ["apple one", "pear two", "apple three", "pear four"]
    tab.facts.setCurrentRow(0)
    assert tab.fact_remove.isEnabled() and not tab.fact_up.isEnabled() and tab.fact_down.isEnabled()
    tab._move_fact(1)  # swaps with the next *visible* fact, the hidden one stays where it is
    assert tab.dataset().facts == ["apple three", "pear two", "apple one", "pear four"]
    assert tab.facts.currentRow() == 2 and _text(tab.facts, 2) == "apple one"
    assert not tab.fact_down.isEnabled()  # no visible fact below
    tab._move_fact(1)
    assert tab.dataset().facts == ["apple three", "pear two", "apple one", "pear four"]
    tab.remove_fact()
    assert tab.dataset().facts == ["apple three", "pear two", "pear four"]
    assert tab.facts.currentRow() == -1 or not _hidden(tab.facts, tab.facts.currentRow())
    assert [_text(tab.facts, i) for i in _visible(tab.facts)] == ["apple three"]


def test_search_hides_the_selected_dialogue_and_its_editor(tab):
    d = [Dialogue([("apple?", "Yes.")]), Dialogue([("pear?", "No.")]), Dialogue([("apple pie?", "Yum.")])]
    tab.set_dataset(Dataset([], d))
    tab.dialogues.setCurrentRow(1)
    assert tab.turns.rowCount() == 1 and tab.dialogue_remove.isEnabled()
    tab.search.setText("apple")
    assert tab.dialogues.currentRow() == -1
    assert tab.turns.rowCount() == 0 and not tab.turns.isEnabled()
    assert not tab.dialogue_remove.isEnabled() and not any(b.isEnabled() for b in tab.turn_buttons)
    tab.remove_dialogue()
    tab.add_turn()
    assert len(tab.dataset().dialogues) == 3 and len(tab.dataset().dialogues[1].turns) == 1
    tab.dialogues.setCurrentRow(2)
    tab._move_dialogue(-1)
    assert [x.turns[0][0] for x in tab.dataset().dialogues] == ["apple pie?", "pear?", "apple?"]
    assert "apple?" in _text(tab.dialogues, 2) and tab.dialogues.currentRow() == 0
    tab.remove_dialogue()
    assert [x.turns[0][0] for x in tab.dataset().dialogues] == ["pear?", "apple?"]


def test_importing_an_empty_file_says_so_and_changes_nothing(tab, tmp_path, dialogs, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from core.dataset import DatasetError

    before = tab.dataset_copy()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", "utf-8")
    with pytest.raises(DatasetError, match="no facts or dialogues"):
        tab.import_file(empty)
    assert tab.dataset() == before
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(empty), "")))
    tab._import_dialog(replace=True)
    assert dialogs.warned and "no facts or dialogues" in dialogs.warned[0][1]
    assert tab.dataset() == before
    broken = tmp_path / "broken.json"  # its message did not say that nothing changed
    broken.write_text("", "utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(broken), "")))
    tab._import_dialog(replace=True)
    assert dialogs.warned[-1][1].startswith(f"{broken}") and dialogs.warned[-1][1].endswith(
        "(Expecting value). The dataset was not changed."), dialogs.warned[-1][1]
    assert tab.dataset() == before
    gone = tmp_path / "gone.txt"  # chosen, then removed before it was read
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(gone), "")))
    tab._import_dialog(replace=True)
    message = dialogs.warned[-1][1]
    assert message.startswith(f"{gone}: No such file") and "Errno" not in message and "not changed" in message
    assert tab.dataset() == before


def test_add_fact_opens_an_empty_editor_for_typing(tab, qtbot):
    from PySide6.QtWidgets import QLineEdit

    from gui.dataset_models import FACT_HINT

    tab.search.setText("octopus")
    tab.add_fact()
    row = tab.facts.count() - 1
    assert not _hidden(tab.facts, row)  # the search is cleared for the new entry
    editor = tab.facts.indexWidget(tab.facts.view_index(row))
    assert isinstance(editor, QLineEdit) and editor.text() == ""  # a hint is shown, never content
    assert _text(tab.facts, row) == FACT_HINT and tab.dataset().facts[row] == ""
    qtbot.wait(400)  # validation highlights every entry meanwhile; the open editor must not be reset
    editor.insert("Typed")  # replaces the selection, as typing does
    qtbot.wait(400)
    assert editor.text() == "Typed"


def test_summary_and_problem_wording(tab):
    assert dialogue_summary(Dialogue([("A?", "B."), ("C?", "D.")])).endswith("(+1 turn)")
    assert dialogue_summary(Dialogue([("A?", "B."), ("C?", "D."), ("E?", "F.")])).endswith("(+2 turns)")
    tab.set_dataset(Dataset())
    texts = [tab.problem_list.item(i).text() for i in range(tab.problem_list.count())]
    assert texts == ["⚠ The dataset is empty: add facts or dialogues."]


def test_a_new_dialogue_is_empty_until_typed_and_the_checker_says_so(tab, qtbot):
    """Placeholder text is not content: a new dialogue's turn is empty, shows grey hints, and is reported
    by the checker (and refused by Start) until its question and answer are typed."""
    from gui.dataset_models import TURN_HINTS

    tab.add_dialogue()
    row = len(tab.dataset().dialogues) - 1
    assert tab.dataset().dialogues[row].turns == [("", "")]
    assert [tab.turn_model.index(0, c).data() for c in (0, 1)] == list(TURN_HINTS)
    tab.validate_now()
    found = {p.message for p in tab.problems() if p.kind == "dialogue" and p.index == row}
    assert found == {"empty question", "empty answer"}
    tab.add_turn()
    tab.validate_now()
    assert sum(p.kind == "dialogue" and p.index == row and p.turn == 1 for p in tab.problems()) == 2
    _set(tab.turns, 0, col=0, text="Who?")
    _set(tab.turns, 0, col=1, text="Me.")
    tab.remove_turn()  # the selected (second, still empty) turn
    qtbot.waitUntil(lambda: not tab.problems(), timeout=3000)


def test_edit_menu_undoes_and_redoes_dataset_edits(main_window, tmp_path):
    """Remove asks nothing but can be undone: Edit ▸ Undo (Ctrl+Z) / Redo (Ctrl+Shift+Z) over every edit."""
    from PySide6.QtGui import QKeySequence

    w, tab = main_window, main_window.dataset_tab
    undo, redo = w.undo_action, w.redo_action
    assert undo.shortcut() == QKeySequence(QKeySequence.StandardKey.Undo)
    assert QKeySequence("Ctrl+Shift+Z") in redo.shortcuts()
    assert "&Edit" in [a.text() for a in w.menuBar().actions()]
    d0, d1 = Dialogue([("A?", "B.")]), Dialogue([("C?", "D.")], "Be brief.")
    tab.set_dataset(Dataset(["one", "two", "three"], [d0, d1]))
    tab.undo_stack.clear()
    assert not undo.isEnabled()

    tab.facts.setCurrentRow(1)
    tab.remove_fact()
    assert tab.dataset().facts == ["one", "three"] and undo.isEnabled()
    assert "remove fact" in undo.text()
    undo.trigger()
    assert tab.dataset().facts == ["one", "two", "three"] and tab.facts.currentRow() == 1
    redo.trigger()
    assert tab.dataset().facts == ["one", "three"]
    undo.trigger()

    _set(tab.facts, 0, "ONE")
    tab.facts.setCurrentRow(2)
    tab._move_fact(-1)
    assert tab.dataset().facts == ["ONE", "three", "two"]
    undo.trigger()
    undo.trigger()
    assert tab.dataset().facts == ["one", "two", "three"]

    # a turn edited in one dialogue is undone with that dialogue back in the editor
    tab.dialogues.setCurrentRow(0)
    _set(tab.turns, 0, col=1, text="Changed.")
    tab.dialogues.setCurrentRow(1)
    undo.trigger()
    assert tab.dialogues.currentRow() == 0 and tab.dataset().dialogues[0].turns == [("A?", "B.")]
    assert tab.turn_model.index(0, 1).data() == "B."

    # removing a dialogue brings back the same one, turns and system message
    tab.dialogues.setCurrentRow(1)
    tab.remove_dialogue()
    assert tab.dataset().dialogues == [d0]
    undo.trigger()
    assert tab.dataset().dialogues[1] is d1 and d1.system == "Be brief." and tab.dialogues.currentRow() == 1

    # typing a system message is one step
    n = tab.undo_stack.index()
    for text in ("B", "Be", "Be short."):
        tab.system.setText(text)
        tab.system.textEdited.emit(text)
    assert tab.undo_stack.index() == n + 1 and d1.system == "Be short."
    undo.trigger()
    assert d1.system == "Be brief." and tab.system.text() == "Be brief."

    # an import that replaced everything is undone too
    path = tmp_path / "other.txt"
    path.write_text("A fact from a file.\n", "utf-8")
    before = tab.dataset()
    tab.import_file(path)
    assert tab.dataset().facts == ["A fact from a file."]
    undo.trigger()
    assert tab.dataset() is before and w.project.dataset is before
    tab.import_file(path, replace=False)
    assert tab.dataset().facts[-1] == "A fact from a file."
    undo.trigger()
    assert tab.dataset().facts == ["one", "two", "three"]

    # another project starts with nothing to undo
    w.save_project_as(tmp_path / "elsewhere")
    assert not undo.isEnabled()


def test_an_import_that_skips_one_entry_says_entry(tab, tmp_path, dialogs, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    path = tmp_path / "one_bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}\n'
                    "not json\n", "utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))
    tab._import_dialog(replace=True)
    assert dialogs.informed and dialogs.informed[-1][1].startswith("1 entry was skipped:\n")


def test_an_import_tells_a_name_given_twice(tab, tmp_path, dialogs, monkeypatch):
    """The command line warned of a JSON name given twice in an object (only its last value read); the app's
    Import said nothing of it, so a user could not tell why a fact went missing."""
    from PySide6.QtWidgets import QFileDialog

    path = tmp_path / "twice.jsonl"
    path.write_text('{"text": "Luna is a grey cat.", "text": "Biscuit is a brown beagle."}\n', "utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))
    tab._import_dialog(replace=True)
    assert tab.dataset().facts == ["Biscuit is a brown beagle."]
    assert dialogs.informed and dialogs.informed[-1][1] == (f'{path}:1: "text" given twice in an object; only its last '
                                                            "value is read")
    path.write_text('{"text": "Luna is a grey cat.", "text": "Biscuit is a brown beagle."}\nnot json\n', "utf-8")
    tab._import_dialog(replace=False)
    message = dialogs.informed[-1][1]
    assert message.startswith("1 entry was skipped:\n") and message.endswith('"text" given twice in an object; only its '
                                                                            "last value is read"), message
    # a note on every line: the first ten, then how many more (500 made a message box 14,056 pixels tall)
    path.write_text('{"text": "a.", "text": "b."}\n' * 500, "utf-8")
    tab._import_dialog(replace=True)
    lines = dialogs.informed[-1][1].splitlines()
    assert len(lines) == 11 and lines[-1] == "… and 490 more" and lines[9].startswith(f"{path}:10: "), lines
    # an import that reads nothing says the note that tells why (the second "facts" was empty)
    before = tab.dataset_copy()
    lost = tmp_path / "lost.json"
    lost.write_text('{"version": 1, "facts": ["Luna is a grey cat."], "facts": [], "dialogues": []}', "utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(lost), "")))
    tab._import_dialog(replace=False)
    assert dialogs.warned[-1][1] == (f"{lost}: no facts or dialogues found. The dataset was not changed.\n"
                                     f'{lost}: "facts" given twice in an object; only its last value is read')
    assert tab.dataset() == before


def _counted_tokens(tab) -> str:
    import re

    m = re.search(r"([\d,]+) tokens \(", tab.stats_label.text())
    return m.group(1) if m else ""


def _counts_settled(tab) -> bool:
    """No count due or running, and the last one's signals handled (a finished thread's queued result may not
    have reached the label yet)."""
    worker = tab._stats_worker
    return not tab._stats_timer.isActive() and (worker is None or tab.check.stats_delivered is worker)


@pytest.mark.parametrize("where", ["fact", "turn"])
def test_token_counts_follow_the_entry_being_typed(main_window, qtbot, where):
    """Issue 24: the token and vocabulary counts lagged one edit behind: a fact or turn reached the
    dataset only when its editor closed, so while the next one was typed the counts showed the one
    before. The text is written while it is typed; the cursor stays where the user types, and the
    typing is one undo step."""
    from core.estimates import dataset_stats

    w, tab = main_window, main_window.dataset_tab
    tab.set_dataset(Dataset(["Brindlewick lies north of the river."], [Dialogue([("Where is it?", "North.")])]))
    w.tabs.setCurrentWidget(tab)
    qtbot.waitUntil(lambda: "tokens" in tab.stats_label.text() and _counts_settled(tab), timeout=30_000)
    before_undo = tab.undo_stack.index()
    if where == "fact":
        view, index, read = tab.facts, tab.facts.view_index(0), lambda: tab.dataset().facts[0]
    else:
        tab.dialogues.setCurrentRow(0)
        view, index, read = tab.turns, tab.turn_model.index(0, 1), lambda: tab.dataset().dialogues[0].turns[0][1]
    old = read()
    view.setCurrentIndex(index)
    view.edit(index)
    editor = view.indexWidget(index) or QApplication.focusWidget()
    assert isinstance(editor, QLineEdit)
    editor.setCursorPosition(0)
    qtbot.keyClicks(editor, "Zyzzyva quorple ")
    qtbot.waitUntil(lambda: read() == "Zyzzyva quorple " + old, timeout=5_000)  # the editor is still open
    assert view.state() == QAbstractItemView.State.EditingState
    assert editor.cursorPosition() == len("Zyzzyva quorple ")  # the write did not reset the editor
    qtbot.waitUntil(lambda: _counts_settled(tab) and _counted_tokens(tab) != "", timeout=30_000)
    s = dataset_stats(tab.dataset_copy(), *w.hyper_tab.limits())
    qtbot.waitUntil(lambda: _counted_tokens(tab) == f"{s.fact_tokens + s.dialogue_tokens:,}"
                    and f"vocabulary {s.vocab_size} tokens" in tab.stats_label.text(), timeout=30_000)

    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert read() == "Zyzzyva quorple " + old
    assert tab.undo_stack.index() == before_undo + 1  # typing one entry is one step
    tab.undo_stack.undo()
    assert read() == old


LONG_FACT = " ".join(f"word{i}" for i in range(400))  # far past the default context (128 tokens)


def _too_long(tab) -> list:
    return [(p.kind, p.index) for p in tab.problems() if p.message.startswith("too long")]


def _counted(tab) -> bool:
    return "tokens" in tab.stats_label.text() and _counts_settled(tab)


def test_a_count_of_the_dataset_before_an_edit_is_never_shown(tab, qtbot):
    """Token counts run on a snapshot; one that ends after an edit (or after another dataset was opened)
    counted what is gone: its too-long marks and numbers are not shown, and an entry fixed since the last
    count loses its mark at the next check, not only at the next count."""
    tab.set_dataset(Dataset([LONG_FACT, "Short fact."], []))
    qtbot.waitUntil(lambda: _counted(tab), timeout=30_000)
    assert _too_long(tab) == [("fact", 0)]
    counted_long = tab.stats_label.text()

    tab._stats_timer.stop()
    tab._start_stats()  # a count of [LONG_FACT, "Short fact."] in a thread (2 entries)
    stale = tab._stats_worker
    _set(tab.facts, 0, "Now short.")  # an edit while it counts
    qtbot.waitUntil(stale.isFinished, timeout=10_000)
    qtbot.wait(400)  # the check after the edit (250 ms) has run; the next count is due 700 ms after the edit
    assert _too_long(tab) == [], "the count of the dataset before the edit was shown"
    qtbot.waitUntil(lambda: _counted(tab) and tab._stats_worker is not stale, timeout=30_000)
    assert _too_long(tab) == [] and tab.stats_label.text() != counted_long

    tab.set_dataset(Dataset([LONG_FACT, "Short fact."], []))
    qtbot.waitUntil(lambda: _counted(tab) and _too_long(tab) == [("fact", 0)], timeout=30_000)
    tab._stats_timer.stop()
    tab._start_stats()
    stale = tab._stats_worker
    tab.set_dataset(Dataset(["Alpha.", "Beta.", "Gamma."], []))  # another dataset while it counts
    qtbot.waitUntil(stale.isFinished, timeout=10_000)
    qtbot.wait(100)
    assert _too_long(tab) == [], "the old dataset's count was shown on the new one"
    qtbot.waitUntil(lambda: _counted(tab) and "3 facts" in tab.stats_label.text(), timeout=30_000)
    assert _too_long(tab) == []
