"""Chat tab: a failed open keeps the working model; how answers are shown."""
from __future__ import annotations

from gui.chat_tab import TOKEN_PROP
from gui.events import AnswerDone, AnswerPiece
from tests.test_gui_e2e import save_tiny_checkpoint


def test_a_failed_open_keeps_the_model_in_use(main_window, qtbot, tmp_path):
    c = main_window.chat_tab
    good = tmp_path / "good"
    save_tiny_checkpoint(good)
    c.open_model(str(good))
    qtbot.waitUntil(lambda: "parameters" in c.model_label.text(), timeout=60_000)

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    for open_bad in (lambda: c.open_model(str(bad)), lambda: c.open_model(str(tmp_path / "missing"))):
        open_bad()
        qtbot.waitUntil(lambda: "Could not open" in c.model_label.text(), timeout=30_000)
        assert "Still chatting with" in c.model_label.text() and c.model_source() == str(good)
        assert c.send("Where is Brindlewick?")
        qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
        assert "error" not in c.transcript.toPlainText(), c.transcript.toPlainText()
        assert "Could not open" in c.model_label.text()  # reported once, not reloaded on send


def _piece(text: str) -> AnswerPiece:
    return AnswerPiece(text=text, token=text, token_id=1, prob=0.9, alternatives=((text, 0.9),))


def test_answer_has_no_double_space_and_notes_a_cut(main_window):
    c = main_window.chat_tab
    c._append_block("Model: ", "", bold_color="#000")
    c._answering = True
    for text in (" Brind", "lewick", " is"):
        c._on_piece(_piece(text))
    c._on_answer_done(AnswerDone(text="Brindlewick is", stopped=False, cut="max_tokens"))
    assert c.transcript.toPlainText() == "Model: Brindlewick is [cut at max tokens]"
    assert not c.is_answering()


def test_generation_probe_tells_why_an_answer_ended():
    from types import SimpleNamespace

    from gui.workers import _GenerationProbe

    class FakeGen:
        config = SimpleNamespace(context_length=10)

        def __init__(self, tokens):
            self.tokens = tokens

        def generate(self, prompt_ids, settings, stop_ids=None):
            for t in self.tokens:
                yield t, None

    def reason(tokens, prompt_len, max_tokens):
        probe = _GenerationProbe(FakeGen(tokens))
        for _ in probe.generate([0] * prompt_len, None):
            pass
        return probe.end_reason(max_tokens, eos_id=2)

    assert reason([5, 6, 2], 3, 8) == ""  # EOS
    assert reason([5, 6, 7], 3, 3) == "max_tokens"
    assert reason([5, 6, 7], 7, 8) == "context"
    assert reason([5, 6], 3, 8) == ""  # a stop string ended it


def test_focus_returns_to_the_input_after_an_answer_and_clear_can_be_undone(main_window, qtbot, tmp_path):
    """Issue 24: after an answer the focus fell on Clear, and the next space typed cleared the
    conversation. Now the keyboard is back on the input line after every answer, and a Clear is undone."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    c = main_window.chat_tab
    ckpt = tmp_path / "tiny"
    save_tiny_checkpoint(ckpt)
    main_window.tabs.setCurrentWidget(c)
    main_window.activateWindow()
    qtbot.waitUntil(lambda: main_window.isActiveWindow(), timeout=5_000)
    c.open_model(str(ckpt))
    assert not c.clear_button.autoDefault() and not c.clear_button.isDefault()
    assert not c.undo_clear_button.isVisible()  # nothing cleared yet

    c.input.setFocus()
    qtbot.keyClicks(c.input, "Where is Brindlewick?")
    qtbot.mouseClick(c.send_button, Qt.MouseButton.LeftButton)  # the button, not Enter: the old trap
    assert c.is_answering()
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    assert QApplication.focusWidget() is c.input
    qtbot.keyClicks(QApplication.focusWidget(), " next")  # a space goes into the next question
    assert c.input.text() == " next" and "Where is Brindlewick?" in c.transcript.toPlainText()
    c.input.clear()

    # Stop passes the focus back too (Stop itself is disabled when the answer ends)
    c.max_tokens.setValue(4096)
    assert c.send("Where is Brindlewick?")
    qtbot.mouseClick(c.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    assert QApplication.focusWidget() is c.input

    shown, turns, pieces = c.transcript.toPlainText(), c.saved_transcript(), c.pieces()
    remembered = c.remembered_turns()
    assert len(turns) == 2 and remembered and pieces
    qtbot.mouseClick(c.clear_button, Qt.MouseButton.LeftButton)
    assert c.transcript.toPlainText() == "" and c.saved_transcript() == [] and c.remembered_turns() == []
    assert c.undo_clear_button.isVisible() and QApplication.focusWidget() is c.input
    c.clear()  # clearing an empty conversation keeps what can be undone
    qtbot.mouseClick(c.undo_clear_button, Qt.MouseButton.LeftButton)
    assert c.transcript.toPlainText() == shown and c.saved_transcript() == turns
    assert c.remembered_turns() == remembered and c.pieces() == pieces
    assert not c.undo_clear_button.isVisible()
    # the restored transcript still points its tokens at their probabilities
    cur = c.transcript.textCursor()
    marked = []
    for pos in range(1, len(shown) + 1):
        cur.setPosition(pos)
        marked.append(isinstance(cur.charFormat().property(TOKEN_PROP), int))
    assert any(marked)

    # the model remembers the restored conversation (the stopped answer is not part of it)
    assert c.send("And who lives there?")
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    assert c.saved_transcript()[:2] == turns and len(c.saved_transcript()) == 3
    assert [q for q, _ in c._worker._session.history] == ["Where is Brindlewick?", "And who lives there?"]
    c.clear()
    assert c.send("Hello")  # a new message ends what Undo clear could bring back
    qtbot.waitUntil(lambda: not c.is_answering(), timeout=60_000)
    assert not c.undo_clear_button.isVisible()
