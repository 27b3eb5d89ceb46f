"""Dataset tab: editing, reordering, search, validation highlights, import/export round trip, autosave."""
from __future__ import annotations

import json

import pytest

from core.dataset import Dataset, Dialogue, default_dataset, load_dataset
from gui.dataset_tab import BAD


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
    tab.facts.item(2).setText("Fact three.")
    assert tab.dataset().facts == ["Fact one.", "Fact two.", "Fact three."]
    tab.facts.setCurrentRow(2)
    tab._move_fact(-1)
    assert tab.dataset().facts == ["Fact one.", "Fact three.", "Fact two."]
    tab.facts.setCurrentRow(0)
    tab.remove_fact()
    assert tab.dataset().facts == ["Fact three.", "Fact two."]

    tab.add_dialogue()
    assert tab.dialogues.currentRow() == 1
    tab.turns.item(0, 0).setText("What is two plus two?")
    tab.turns.item(0, 1).setText("Four.")
    tab.add_turn()
    tab.turns.item(1, 0).setText("And three plus three?")
    tab.turns.item(1, 1).setText("Six.")
    tab.system.setText("Be brief.")
    tab.system.textEdited.emit("Be brief.")
    want = Dialogue([("What is two plus two?", "Four."), ("And three plus three?", "Six.")], "Be brief.")
    assert tab.dataset().dialogues[1] == want
    assert "What is two plus two?" in tab.dialogues.item(1).text()
    tab._move_dialogue(-1)
    assert tab.dataset().dialogues[0] == want

    expected = tab.dataset_copy()
    for name in ("out.json", "out.jsonl", "out.txt"):
        path = tmp_path / name
        tab.export_file(path)
        assert load_dataset(path) == (expected, [])
        tab.set_dataset(Dataset())
        assert tab.import_file(path) == []
        assert tab.dataset() == expected
    tab.import_file(tmp_path / "out.json", replace=False)
    assert len(tab.dataset().facts) == 2 * len(expected.facts)


def test_search_filters_both_lists(tab):
    tab.search.setText("octopus")
    visible_facts = [tab.facts.item(i).text() for i in range(tab.facts.count()) if not tab.facts.item(i).isHidden()]
    assert visible_facts and all("octopus" in f.lower() for f in visible_facts)
    visible_dlg = [i for i in range(tab.dialogues.count()) if not tab.dialogues.item(i).isHidden()]
    assert len(visible_dlg) == 1
    tab.search.clear()
    assert not any(tab.facts.item(i).isHidden() for i in range(tab.facts.count()))


def test_validation_highlights_the_offending_entry(tab, qtbot):
    tab.facts.item(3).setText("   ")
    qtbot.waitUntil(lambda: any(p.kind == "fact" and p.index == 3 for p in tab.problems()), timeout=3000)
    assert tab.facts.item(3).background() == BAD
    assert tab.facts.item(2).background() != BAD
    assert "fact 4" in tab.problem_list.item(0).text()
    tab._goto_problem(tab.problem_list.item(0))
    assert tab.facts.currentRow() == 3

    tab.dialogues.setCurrentRow(2)
    tab.turns.item(1, 1).setText("")  # dialogue 3 has two turns; empty the second answer
    qtbot.waitUntil(lambda: any(p.kind == "dialogue" and p.index == 2 and p.turn == 1 for p in tab.problems()),
                    timeout=3000)
    assert tab.dialogues.item(2).background() == BAD
    assert tab.turns.item(1, 1).background() == BAD and tab.turns.item(0, 0).background() != BAD

    tab.facts.item(3).setText("Fixed fact.")
    tab.turns.item(1, 1).setText("Fixed answer.")
    qtbot.waitUntil(lambda: not tab.problems(), timeout=3000)
    assert tab.facts.item(3).background() != BAD


def test_special_token_text_is_reported(tab, qtbot):
    tab.facts.item(0).setText("hello <|eos|> world")
    qtbot.waitUntil(lambda: any("reserved" in p.message for p in tab.problems()), timeout=3000)


def test_training_refuses_a_dataset_with_problems(main_window, qtbot):
    main_window.dataset_tab.facts.item(0).setText("")
    assert not main_window.training_tab.start()
    assert "Fix the dataset" in main_window.training_tab.banner_text.text()


def test_edits_are_autosaved_and_restored(main_window, studio_env, qtbot):
    from gui.main_window import MainWindow

    tab = main_window.dataset_tab
    tab.add_fact()
    tab.facts.item(tab.facts.count() - 1).setText("An autosaved fact.")
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
    main_window.dataset_tab.facts.item(main_window.dataset_tab.facts.count() - 1).setText("Written on close.")
    folder = main_window.project.folder
    main_window.close()  # before the autosave timer fires
    data = json.loads((folder / "dataset.json").read_text("utf-8"))
    assert data["facts"][-1] == "Written on close."
