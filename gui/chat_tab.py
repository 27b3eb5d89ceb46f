"""Chat tab: a transcript with streamed answers; hovering a generated token shows its probability
and the most likely alternatives (tooltip and side panel)."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import (QApplication, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QHeaderView,
                               QLabel, QLineEdit, QPushButton, QSpinBox, QSplitter, QTableWidget,
                               QTableWidgetItem, QTextEdit, QToolTip, QVBoxLayout, QWidget)

from gui.app_state import AppState
from gui.events import AnswerDone, AnswerPiece, ModelLoaded
from gui.workers import ChatWorker

TOKEN_PROP = QTextFormat.Property.UserProperty + 1
PLACEHOLDER_NO_MODEL = "Train a model (or open one) and ask it something."
PLACEHOLDER_MODEL = "Ask the model something: type below and press Enter."
NOTES = {"stopped": " [stopped]", "max_tokens": " [cut at max tokens]", "context": " [cut: the model's context is full]"}


def _shown(token: str) -> str:
    return repr(token)[1:-1] if token else "∅"


def token_tooltip(p: AnswerPiece) -> str:
    """Tooltip of a generated token: its probability and the top alternatives."""
    alts = "\n".join(f"  '{_shown(t)}'  {pr:.1%}" for t, pr in p.alternatives)
    return f"'{_shown(p.token)}': probability {p.prob:.1%}\nmost likely at this step:\n{alts}"


def prob_color(p: float) -> QColor:
    """Background for a token: clear when the model was sure, deeper orange the less sure it was."""
    alpha = int(max(0.0, min(1.0, 1.0 - p)) * 170)
    return QColor(255, 150, 40, alpha)


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
        self._source: str | None = None  # model the user wants to chat with
        self._loaded: str | None = None  # model the worker has loaded (or is loading)
        self._source_is_trained = False  # the source is this project's checkpoint
        self._in_worker: tuple[str, bool] | None = None  # (model the worker has loaded, is the trained one)
        self._load_failure = ""  # why the last model could not be opened, while there is none to chat with
        self._answering = False
        self._pieces: list[AnswerPiece] = []
        self._answer_text = ""
        self._seed = 0
        # the transcript, saved with the project (gui.history): {"user", "model", "note", "remembered"}
        self._turns: list[dict] = []
        # what the last Clear removed, until it is undone or a new message is sent:
        # (the transcript's document, the pieces its formats point into, the turns)
        self._cleared: tuple[QTextDocument, list[AnswerPiece], list[dict]] | None = None

        # -- transcript and input
        self.transcript = QTextEdit()
        self.transcript.setReadOnly(True)
        self.transcript.setPlaceholderText(PLACEHOLDER_NO_MODEL)
        self.transcript.viewport().setMouseTracking(True)
        self.transcript.viewport().installEventFilter(self)
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
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.transcript, 1)
        lv.addLayout(row)

        # -- side panel: model, sampling, token details
        model_box = QGroupBox("Model")
        mv = QVBoxLayout(model_box)
        self.model_label = QLabel("No model yet.")
        self.model_label.setWordWrap(True)
        mv.addWidget(self.model_label)
        mrow = QHBoxLayout()
        self.use_trained_button = QPushButton("Trained model")
        self.use_trained_button.setToolTip("Chat with the model trained in this project")
        self.use_trained_button.clicked.connect(self.use_trained_model)
        open_ckpt = QPushButton("Open folder…")
        open_ckpt.setToolTip("Open a checkpoint folder")
        open_ckpt.clicked.connect(self._open_checkpoint_dialog)
        open_gguf = QPushButton("Open GGUF…")
        open_gguf.clicked.connect(self._open_gguf_dialog)
        for b in (self.use_trained_button, open_ckpt, open_gguf):
            mrow.addWidget(b)
        mv.addLayout(mrow)

        sampling = QGroupBox("Sampling")
        form = QFormLayout(sampling)
        self.temperature = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=5.0, singleStep=0.1, value=0.0)
        self.temperature.setToolTip("0 = always the most likely token; higher = more random")
        self.top_k = QSpinBox(minimum=0, maximum=100000, value=0)
        self.top_k.setToolTip("Keep only the k most likely tokens (0 = all)")
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05, value=1.0)
        self.top_p.setToolTip("Keep the most likely tokens that together have this probability (1 = all)")
        self.repetition = QDoubleSpinBox(decimals=2, minimum=0.5, maximum=3.0, singleStep=0.05, value=1.0)
        self.repetition.setToolTip("Above 1 makes tokens already in the conversation less likely")
        self.max_tokens = QSpinBox(minimum=1, maximum=4096, value=64)
        self.max_tokens.setToolTip("Longest answer in tokens")
        form.addRow("Temperature:", self.temperature)
        form.addRow("Top-k:", self.top_k)
        form.addRow("Top-p:", self.top_p)
        form.addRow("Repetition penalty:", self.repetition)
        form.addRow("Max tokens:", self.max_tokens)

        token_box = QGroupBox("Token under the mouse")
        tv = QVBoxLayout(token_box)
        self.token_label = QLabel("Hover over a generated token.")
        self.token_label.setWordWrap(True)
        tv.addWidget(self.token_label)
        self.alternatives = QTableWidget(0, 2)
        self.alternatives.setHorizontalHeaderLabels(["Alternative", "Probability"])
        self.alternatives.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.alternatives.verticalHeader().setVisible(False)
        self.alternatives.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        tv.addWidget(self.alternatives, 1)

        side = self._side = QWidget()
        sv = QVBoxLayout(side)
        sv.setContentsMargins(0, 0, 0, 0)
        sv.addWidget(model_box)
        sv.addWidget(sampling)
        sv.addWidget(token_box, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(side)
        split.setSizes([700, 320])
        split.setStretchFactor(0, 1)
        QVBoxLayout(self).addWidget(split)
        self._update_buttons()
        state.project_changed.connect(self._on_project)
        state.model_saved.connect(self.set_trained_model)

    # ----------------------------------------------------------------------------- model
    def set_trained_model(self, path: str | None) -> None:
        """The project's checkpoint was (re)written (or the project changed, ``None``): chat with it
        unless the user opened another model."""
        if path is None:
            if self._source_is_trained:
                self._source, self._loaded, self._source_is_trained = None, None, False
                self.model_label.setText("No model yet.")
            self._update_placeholder()
            return
        if self._source is None or self._source_is_trained:
            self._source, self._source_is_trained = str(path), True
            self._loaded = None  # reload on the next question: the weights changed
            self.model_label.setText(f"Trained model of this project:\n{path}\n(loaded with the next message)")
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        """The empty transcript's hint: ask to train a model only when there is none to chat with."""
        self.transcript.setPlaceholderText(PLACEHOLDER_MODEL if self._source else PLACEHOLDER_NO_MODEL)

    def _on_project(self, project) -> None:
        """A project was opened: its sampling settings, its transcript, and its trained model (if any)."""
        self.apply_settings(project.settings.get("sampling"))
        self._restore_transcript(getattr(project, "chat", None) or [])
        self.set_trained_model(None)
        path = self.app_state.trained_model_path()
        if path is not None:
            self.set_trained_model(str(path))

    def use_trained_model(self) -> None:
        path = self.app_state.trained_model_path()
        if path is None:
            self.model_label.setText("This project has no trained model yet: train one on the Training tab.")
            return
        self._source_is_trained = True
        self.set_trained_model(str(path))

    def open_model(self, path: str) -> None:
        """Chat with a checkpoint folder or a .gguf file (if it cannot be loaded, the model in use stays)."""
        self._source, self._source_is_trained = str(path), False
        self._loaded = None
        self.model_label.setText(f"{path}\n(loaded with the next message)")
        self._update_placeholder()
        self._load_if_needed()

    def _open_checkpoint_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a checkpoint folder")
        if path:
            self.open_model(path)

    def _open_gguf_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_model(path)

    def model_source(self) -> str | None:
        return self._source

    def _ensure_worker(self) -> ChatWorker:
        if self._worker is None or not self._worker.isRunning():
            w = ChatWorker().connect_slots(model_loaded=self._on_loaded, load_failed=self._on_load_failed,
                                           piece=self._on_piece, answer_done=self._on_answer_done,
                                           failed=self._on_failed)
            self._worker = w
            w.start()
        return self._worker

    def _load_if_needed(self) -> bool:
        if self._source is None:
            return False
        device = self.app_state.device_info()
        if device is None:
            self.model_label.setText("No OpenCL device: see the Device tab.")
            return False
        if self._loaded != self._source:
            # the model takes over the conversation the transcript shows (a restored one included)
            self._ensure_worker().load(self._source, device, self.remembered_turns())
            self._loaded = self._source
            self.model_label.setText(f"Loading {self._source}…")
        return True

    def _on_loaded(self, info: ModelLoaded) -> None:
        self._load_failure = ""
        self._in_worker = (info.path, info.path == self._source and self._source_is_trained)
        self.model_label.setText(f"{info.path}\n{info.n_params:,} parameters, context "
                                 f"{info.context_length} tokens, on {info.device}")

    def _on_load_failed(self, path: str, message: str) -> None:
        """The worker kept the model it had: chat with that one again, and say so (once)."""
        text = f"Could not open {path}:\n{message}"
        if path == self._source:  # not superseded by a newer request
            if self._in_worker is not None:
                self._source, self._source_is_trained = self._in_worker
                self._loaded = self._source
                text += f"\nStill chatting with {self._source}."
            else:
                self._source, self._loaded, self._source_is_trained = None, None, False
                self._load_failure = text
        self.model_label.setText(text)
        self._update_placeholder()

    # ----------------------------------------------------------------------------- conversation
    def settings(self) -> dict:
        """Sampling settings (core.generate.SamplingSettings fields)."""
        return {"temperature": self.temperature.value(), "top_k": self.top_k.value(), "top_p": self.top_p.value(),
                "repetition_penalty": self.repetition.value(), "max_tokens": self.max_tokens.value(),
                "seed": self._seed}

    def saved_settings(self) -> dict:
        """What a project saves: the sampling settings without the seed (it counts the answers)."""
        s = self.settings()
        s.pop("seed")
        return s

    def apply_settings(self, s: object) -> None:
        """Set the sampling widgets from a project's saved settings (unreadable values are skipped)."""
        if not isinstance(s, dict):
            return
        for key, widget in (("temperature", self.temperature), ("top_k", self.top_k), ("top_p", self.top_p),
                            ("repetition_penalty", self.repetition), ("max_tokens", self.max_tokens)):
            if key in s:
                try:
                    widget.setValue(type(widget.value())(s[key]))
                except (TypeError, ValueError):
                    pass

    def send(self, message: str | None = None) -> bool:
        """Send the input line (or ``message``); False when nothing can be sent now."""
        text = (message if isinstance(message, str) else self.input.text()).strip()
        if not text or self._answering:
            return False
        if not self._load_if_needed():
            if self._source is None:  # after a failed open, its reason stays in view
                self.model_label.setText(self._load_failure or "No model: train one on the Training tab or open "
                                         "one here.")
            return False
        self.input.clear()
        self._forget_cleared()  # the new message starts the conversation Undo clear would replace
        self._append_block("You: ", text, bold_color="#1f4e9c")
        self._append_block("Model: ", "", bold_color="#2b7a2b")
        self._turns.append({"user": text, "model": "", "note": "", "remembered": False})
        self._answering = True
        self._answer_text = ""
        self._seed += 1
        self._worker.ask(text, self.settings())
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
            self._cleared = (self.transcript.document().clone(self.transcript), self._pieces, self._turns)
        self.transcript.clear()
        self._pieces = []
        self._turns = []
        self.token_label.setText("Hover over a generated token.")
        self.alternatives.setRowCount(0)
        self._tell_worker_history()
        self._focus_input()
        self._update_buttons()
        self.app_state.mark_history_changed()

    def undo_clear(self) -> None:
        """Bring back the conversation the last :meth:`clear` removed: the transcript (with its token
        probabilities) and the model's memory of it."""
        if self._cleared is None or self._answering:
            return
        doc, self._pieces, self._turns = self._cleared
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

    # ----------------------------------------------------------------------------- saved transcript
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

    def _restore_transcript(self, turns: list[dict]) -> None:
        """Show a saved transcript (token probabilities are not saved: hovering its answers shows none).
        A loaded model forgets it; the next model loaded takes it over (see :meth:`remembered_turns`)."""
        self.transcript.clear()
        self._pieces.clear()
        self._turns = [dict(t) for t in turns]
        self._forget_cleared()
        for t in self._turns:
            self._append_block("You: ", t["user"], bold_color="#1f4e9c")
            self._append_block("Model: ", t["model"], bold_color="#2b7a2b")
            if t["note"]:
                self._append_note(t["note"])
        self._tell_worker_history()
        self._update_buttons()
        self._loaded = None  # the next message loads the model again, with this conversation

    def is_answering(self) -> bool:
        return self._answering

    def last_answer(self) -> str:
        return self._answer_text

    def pieces(self) -> list[AnswerPiece]:
        """Every generated token shown so far."""
        return list(self._pieces)

    def _append_block(self, label: str, text: str, bold_color: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        if not self.transcript.document().isEmpty():
            cur.insertBlock()
        fmt = QTextCharFormat()
        fmt.setFontWeight(700)
        fmt.setForeground(QColor(bold_color))
        cur.insertText(label, fmt)
        cur.insertText(text, QTextCharFormat())
        self.transcript.setTextCursor(cur)

    def _on_piece(self, p: AnswerPiece) -> None:
        self._pieces.append(p)
        text = p.text if self._answer_text else p.text.lstrip()  # the format's space after "Assistant:"
        if not text:  # part of a multi-byte character, cut as a stop string, or that space
            return
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setBackground(prob_color(p.prob))
        fmt.setToolTip(token_tooltip(p))
        fmt.setProperty(TOKEN_PROP, len(self._pieces) - 1)
        cur.insertText(text, fmt)
        self._answer_text += text
        self.transcript.ensureCursorVisible()

    def _on_answer_done(self, d: AnswerDone) -> None:
        self._answer_text = d.text
        note = NOTES["stopped"] if d.stopped else NOTES.get(d.cut, "")
        if note:
            self._append_note(note)
        if self._turns:  # a stopped answer is not part of the model's conversation (core.chat)
            self._turns[-1].update(model=d.text, note=note, remembered=not d.stopped)
        self._finish_answer()

    def _append_note(self, text: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor("#888"))
        fmt.setFontItalic(True)
        cur.insertText(text, fmt)

    def _on_failed(self, kind: str, message: str) -> None:
        if self._answering:
            self._append_note(f" [error: {message}]")
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

    # ----------------------------------------------------------------------------- hover
    def token_at(self, pos: QPoint) -> int | None:
        """Index into :meth:`pieces` of the token drawn at viewport position ``pos``, or None."""
        cur = self.transcript.cursorForPosition(pos)
        if self.transcript.cursorRect(cur).center().x() <= pos.x():
            cur.movePosition(QTextCursor.MoveOperation.Right)
        idx = cur.charFormat().property(TOKEN_PROP)
        return idx if isinstance(idx, int) and 0 <= idx < len(self._pieces) else None

    def show_token(self, index: int) -> None:
        """Show token ``index``'s probability and alternatives in the side panel."""
        p = self._pieces[index]
        self.token_label.setText(f"Token '{_shown(p.token)}' had probability {p.prob:.1%}.")
        self.alternatives.setRowCount(len(p.alternatives))
        for r, (tok, pr) in enumerate(p.alternatives):
            self.alternatives.setItem(r, 0, QTableWidgetItem(f"'{_shown(tok)}'"))
            self.alternatives.setItem(r, 1, QTableWidgetItem(f"{pr:.1%}"))

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        if obj is self.transcript.viewport():
            if event.type() == QEvent.Type.MouseMove:
                idx = self.token_at(event.position().toPoint())
                if idx is not None:
                    self.show_token(idx)
            elif event.type() == QEvent.Type.ToolTip:
                idx = self.token_at(event.pos())
                if idx is not None:
                    QToolTip.showText(event.globalPos(), token_tooltip(self._pieces[idx]), self.transcript.viewport())
                else:
                    QToolTip.hideText()
                return True
        return super().eventFilter(obj, event)
