"""Chat tab: a failed open keeps the working model; how answers are shown."""
from __future__ import annotations

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
