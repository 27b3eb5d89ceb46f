"""Chat tab: a transcript with streamed answers; hovering a generated token shows its probability
and the most likely alternatives (tooltip and side panel).

The parts: the transcript (gui/transcript_view.py), the model box, the sampling form and the token panel
(gui/chat_side.py); the tab holds the conversation and talks to the ChatWorker.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor, QTextDocument
from PySide6.QtWidgets import QApplication, QHBoxLayout, QLineEdit, QPushButton, QSplitter, QVBoxLayout, QWidget

from gui.app_state import AppState
from gui.chat_side import ModelBox, SamplingForm, TokenPanel, side_panel
from gui.events import AnswerDone, AnswerPiece
from gui.transcript_view import PLACEHOLDER_MODEL, PLACEHOLDER_NO_MODEL, TOKEN_PROP, Transcript
from gui.workers import ChatWorker

# names other modules and tests import from here
__all__ = ["NOTES", "PLACEHOLDER_MODEL", "PLACEHOLDER_NO_MODEL", "TOKEN_PROP", "ChatTab"]

NOTES = {"stopped": " [stopped]", "max_tokens": " [cut at max tokens]", "context": " [cut: the model's context is full]"}
YOU, MODEL = ("You: ", "#1f4e9c"), ("Model: ", "#2b7a2b")  # a turn's labels and their colours


class ChatTab(QWidget):
    """Talks to a :class:`gui.workers.ChatWorker`; never touches the model itself.

    Args:
        state: the app state: the device to load models on, and the project's trained model (the
            tab switches to it when a project is opened or training saves it).
    """

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self._worker: ChatWorker | None = None
        self._answering = False
        self._answer_text = ""
        self._seed = 0
        # the transcript, saved with the project (gui.history): {"user", "model", "note", "remembered"}
        self._turns: list[dict] = []
        # what the last Clear removed, until it is undone or a new message is sent:
        # (the transcript's document, the pieces its formats point into, the turns)
        self._cleared: tuple[QTextDocument, list[AnswerPiece], list[dict]] | None = None
        self.transcript = Transcript()
        self.token_at, self._append_block = self.transcript.token_at, self.transcript.append_block
        self.model_box = ModelBox(state, self.transcript.setPlaceholderText, self._load_if_needed)
        self.model_label = self.model_box.label
        self.set_trained_model, self.use_trained_model = self.model_box.set_trained_model, self.model_box.use_trained_model
        self.open_model, self.model_source = self.model_box.open_model, lambda: self.model_box.source
        self.sampling = SamplingForm()
        self.temperature, self.top_k, self.top_p = self.sampling.temperature, self.sampling.top_k, self.sampling.top_p
        self.repetition, self.max_tokens = self.sampling.repetition, self.sampling.max_tokens
        self.saved_settings, self.apply_settings = self.sampling.saved, self.sampling.apply
        self.token_panel = TokenPanel()
        self.token_label, self.alternatives = self.token_panel.label, self.token_panel.alternatives
        self.transcript.token_hovered.connect(self.show_token)
        self._side = side_panel(self.model_box, self.sampling, self.token_panel)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self._build_conversation())
        split.addWidget(self._side)
        split.setSizes([700, 320])
        split.setStretchFactor(0, 1)
        QVBoxLayout(self).addWidget(split)
        self._update_buttons()
        state.project_changed.connect(self._on_project)
        state.model_saved.connect(self.set_trained_model)

    def _build_conversation(self) -> QWidget:
        """The transcript over the input line and Send / Stop / Clear / Undo clear."""
        row = QHBoxLayout()
        self.input = QLineEdit()
        self.input.setPlaceholderText("Type a message and press Enter")
        self.input.returnPressed.connect(self.send)
        row.addWidget(self.input, 1)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop_answer)
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Clear the transcript and the model's memory of the conversation "
                                     "(Undo clear brings it back)")
        self.clear_button.clicked.connect(self.clear)
        self.undo_clear_button = QPushButton("Undo clear")
        self.undo_clear_button.setToolTip("Bring back the conversation Clear removed (until the next message)")
        self.undo_clear_button.clicked.connect(self.undo_clear)
        for b in (self.send_button, self.stop_button, self.clear_button, self.undo_clear_button):
            # Enter in the input line sends; no button takes Enter (or, as Clear did, a space) by default
            b.setAutoDefault(False)
            b.setDefault(False)
            b.setFocusPolicy(Qt.FocusPolicy.TabFocus)  # a click leaves the keyboard on the input line
            row.addWidget(b)
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.transcript, 1)
        lay.addLayout(row)
        return left

    # ----------------------------------------------------------------------------- model
    def _on_project(self, project) -> None:
        """A project was opened: its sampling settings, its transcript (token probabilities are not saved:
        hovering its answers shows none; the next model loaded takes the conversation over, see
        :meth:`remembered_turns`), and its trained model (if any)."""
        self.apply_settings(project.settings.get("sampling"))
        self.transcript.clear()
        self.transcript.pieces.clear()
        self._turns = [dict(t) for t in getattr(project, "chat", None) or []]
        self._forget_cleared()
        for t in self._turns:
            self._append_block(YOU[0], t["user"], bold_color=YOU[1])
            self._append_block(MODEL[0], t["model"], bold_color=MODEL[1])
            if t["note"]:
                self.transcript.append_note(t["note"])
        self._tell_worker_history()
        self._update_buttons()
        self.model_box.loaded = None  # the next message loads the model again, with this conversation
        self.set_trained_model(None)
        path = self.app_state.trained_model_path()
        if path is not None:
            self.set_trained_model(str(path))

    def _load_if_needed(self) -> bool:
        box = self.model_box
        if box.source is None:
            return False
        device = self.app_state.device_info()
        if device is None:
            self.model_label.setText("No OpenCL device: see the Device tab.")
            return False
        if box.loaded != box.source:
            if self._worker is None or not self._worker.isRunning():
                self._worker = ChatWorker().connect_slots(
                    model_loaded=box.on_loaded, load_failed=box.on_load_failed, piece=self._on_piece,
                    answer_done=self._on_answer_done, failed=self._on_failed)
                self._worker.start()
            # the model takes over the conversation the transcript shows (a restored one included)
            self._worker.load(box.source, device, self.remembered_turns())
            box.loaded = box.source
            self.model_label.setText(f"Loading {box.source}…")
        return True

    # ----------------------------------------------------------------------------- conversation
    def send(self, message: str | None = None) -> bool:
        """Send the input line (or ``message``); False when nothing can be sent now."""
        text = (message if isinstance(message, str) else self.input.text()).strip()
        if not text or self._answering:
            return False
        if not self._load_if_needed():
            if self.model_box.source is None:  # after a failed open, its reason stays in view
                self.model_label.setText(self.model_box.load_failure or "No model: train one on the Training tab "
                                         "or open one here.")
            return False
        self.input.clear()
        self._forget_cleared()  # the new message starts the conversation Undo clear would replace
        self._append_block(YOU[0], text, bold_color=YOU[1])
        self._append_block(MODEL[0], "", bold_color=MODEL[1])
        self._turns.append({"user": text, "model": "", "note": "", "remembered": False})
        self._answering = True
        self._answer_text = ""
        self._seed += 1
        self._worker.ask(text, {**self.sampling.saved(), "seed": self._seed})
        self._focus_input()
        self._update_buttons()
        return True

    def stop_answer(self) -> None:
        if self._worker is not None and self._answering:
            self._worker.cancel()

    def clear(self) -> None:
        """Clear the transcript and the model's memory of it; :meth:`undo_clear` brings both back
        (until the next message). Nothing to clear keeps what an earlier Clear removed."""
        if self._answering:
            return
        if self._turns or not self.transcript.document().isEmpty():
            self._forget_cleared()
            self._cleared = (self.transcript.document().clone(self.transcript), self.transcript.pieces, self._turns)
        self.transcript.clear()
        self.transcript.pieces = []
        self._turns = []
        self.token_panel.reset()
        self._tell_worker_history()
        self._focus_input()
        self._update_buttons()
        self.app_state.mark_history_changed()

    def undo_clear(self) -> None:
        """Bring back the conversation the last :meth:`clear` removed: the transcript (with its token
        probabilities) and the model's memory of it."""
        if self._cleared is None or self._answering:
            return
        doc, self.transcript.pieces, self._turns = self._cleared
        self._cleared = None
        self.transcript.setDocument(doc)  # the editor's own (empty) document is deleted
        self._tell_worker_history()
        self._focus_input()
        self._update_buttons()
        self.transcript.moveCursor(QTextCursor.MoveOperation.End)
        self.transcript.ensureCursorVisible()
        self.app_state.mark_history_changed()

    def _forget_cleared(self) -> None:
        """Undo clear is no longer offered: free the kept document (a child of the transcript)."""
        if self._cleared is not None:
            self._cleared[0].deleteLater()
            self._cleared = None

    def _tell_worker_history(self) -> None:
        """The loaded model's conversation becomes :meth:`remembered_turns` (a model loaded later gets
        them at its load)."""
        if self._worker is not None and self._worker.isRunning():
            self._worker.set_history(self.remembered_turns())

    def saved_transcript(self) -> list[dict]:
        """What the project saves of the chat (gui.history.parse_chat's turns); an answer still being
        written is saved as far as it got, not remembered."""
        turns = [dict(t) for t in self._turns]
        if self._answering and turns:
            turns[-1]["model"] = self._answer_text
        return turns

    def remembered_turns(self) -> list[tuple[str, str]]:
        """(question, answer) of the turns the model's conversation holds (core.chat.ChatSession.history)."""
        return [(t["user"], t["model"]) for t in self._turns if t["remembered"]]

    def is_answering(self) -> bool:
        return self._answering

    def last_answer(self) -> str:
        return self._answer_text

    def pieces(self) -> list[AnswerPiece]:
        """Every generated token shown so far."""
        return list(self.transcript.pieces)

    # ----------------------------------------------------------------------------- worker signals
    def _on_piece(self, p: AnswerPiece) -> None:
        text = p.text if self._answer_text else p.text.lstrip()  # the format's space after "Assistant:"
        self.transcript.append_piece(p, text)
        self._answer_text += text

    def _on_answer_done(self, d: AnswerDone) -> None:
        self._answer_text = d.text
        note = NOTES["stopped"] if d.stopped else NOTES.get(d.cut, "")
        if note:
            self.transcript.append_note(note)
        if self._turns:  # a stopped answer is not part of the model's conversation (core.chat)
            self._turns[-1].update(model=d.text, note=note, remembered=not d.stopped)
        self._finish_answer()

    def _on_failed(self, kind: str, message: str) -> None:
        if self._answering:
            self.transcript.append_note(f" [error: {message}]")
            if self._turns:
                self._turns[-1].update(model=self._answer_text, note=f" [error: {message}]", remembered=False)
            self._finish_answer()
        else:
            self.model_label.setText(f"Error: {message}")

    def _finish_answer(self) -> None:
        """An answer ended (done, stopped or failed): the keyboard is back on the input line."""
        self._answering = False
        self._focus_input()  # before the buttons change: a disabled Stop would pass the focus on
        self._update_buttons()
        self.app_state.mark_history_changed()

    def _focus_input(self) -> None:
        """The keyboard goes back to the input line, unless the user is elsewhere (the side panel's
        sampling form, another tab): typing goes into the next question, never into a button such as Clear."""
        focus = QApplication.focusWidget()
        if self.input.isVisible() and not (focus is not None and self._side.isAncestorOf(focus)):
            self.input.setFocus(Qt.FocusReason.OtherFocusReason)

    def _update_buttons(self) -> None:
        """The input line stays enabled while the model answers (the next question can be typed; Enter
        sends nothing until the answer ends), so the focus never leaves it for a button."""
        self.send_button.setEnabled(not self._answering)
        self.stop_button.setEnabled(self._answering)
        self.clear_button.setEnabled(not self._answering)
        self.undo_clear_button.setVisible(self._cleared is not None)
        self.undo_clear_button.setEnabled(self._cleared is not None and not self._answering)

    def stop(self) -> None:
        """Stop the chat thread and wait for it (window closing)."""
        if self._worker is not None:
            self._worker.request_stop()
            self._worker.wait()

    def show_token(self, index: int) -> None:
        """Show token ``index``'s probability and alternatives in the side panel."""
        self.token_panel.show_piece(self.transcript.pieces[index])
