"""The Chat tab's side panel: the model in use (and opening another), the sampling settings, the token
under the mouse."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import (QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from gui.app_state import AppState
from gui.events import AnswerPiece, ModelLoaded
from gui.transcript_view import PLACEHOLDER_MODEL, PLACEHOLDER_NO_MODEL, shown_token

NO_TOKEN = "Hover over a generated token."


class ModelBox(QGroupBox):
    """Which model the chat uses: the project's trained one or a file the user opened (``source``), the
    one the worker has loaded or is loading (``loaded``); ``label`` says which and how it went.

    Args:
        state: the app state (the project's trained model).
        placeholder: sets the empty transcript's hint.
        load: asks the worker to load ``source`` now (after Open…).
    """

    def __init__(self, state: AppState, placeholder: Callable[[str], None], load: Callable[[], object]) -> None:
        super().__init__("Model")
        self.app_state, self._placeholder, self._load = state, placeholder, load
        self.source: str | None = None  # model the user wants to chat with
        self.loaded: str | None = None  # model the worker has loaded (or is loading)
        self._source_is_trained = False  # the source is this project's checkpoint
        self._in_worker: tuple[str, bool] | None = None  # (model the worker has loaded, is the trained one)
        self.load_failure = ""  # why the last model could not be opened, while there is none to chat with
        lay = QVBoxLayout(self)
        self.label = QLabel("No model yet.")
        self.label.setWordWrap(True)
        lay.addWidget(self.label)
        row = QHBoxLayout()
        self.use_trained_button = QPushButton("Trained model")
        self.use_trained_button.setToolTip("Chat with the model trained in this project")
        self.use_trained_button.clicked.connect(self.use_trained_model)
        open_ckpt = QPushButton("Open folder…")
        open_ckpt.setToolTip("Open a checkpoint folder")
        open_ckpt.clicked.connect(lambda: self._open(QFileDialog.getExistingDirectory(self, "Open a checkpoint folder")))
        open_gguf = QPushButton("Open GGUF…")
        open_gguf.clicked.connect(lambda: self._open(QFileDialog.getOpenFileName(
            self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")[0]))
        for b in (self.use_trained_button, open_ckpt, open_gguf):
            row.addWidget(b)
        lay.addLayout(row)

    def set_trained_model(self, path: str | None) -> None:
        """The project's checkpoint was (re)written (or the project changed, ``None``): chat with it
        unless the user opened another model."""
        if path is None:
            if self._source_is_trained:
                self.source, self.loaded, self._source_is_trained = None, None, False
                self.label.setText("No model yet.")
        elif self.source is None or self._source_is_trained:
            self.source, self._source_is_trained = str(path), True
            self.loaded = None  # reload on the next question: the weights changed
            self.label.setText(f"Trained model of this project:\n{path}\n(loaded with the next message)")
        self._placeholder(PLACEHOLDER_MODEL if self.source else PLACEHOLDER_NO_MODEL)

    def use_trained_model(self) -> None:
        path = self.app_state.trained_model_path()
        if path is None:
            self.label.setText("This project has no trained model yet: train one on the Training tab.")
            return
        self._source_is_trained = True
        self.set_trained_model(str(path))

    def open_model(self, path: str) -> None:
        """Chat with a checkpoint folder or a .gguf file (if it cannot be loaded, the model in use stays)."""
        self.source, self._source_is_trained = str(path), False
        self.loaded = None
        self.label.setText(f"{path}\n(loaded with the next message)")
        self._placeholder(PLACEHOLDER_MODEL)
        self._load()

    def _open(self, path: str) -> None:
        if path:
            self.open_model(path)

    def on_loaded(self, info: ModelLoaded) -> None:
        self.load_failure = ""
        self._in_worker = (info.path, info.path == self.source and self._source_is_trained)
        self.label.setText(f"{info.path}\n{info.n_params:,} parameters, context "
                           f"{info.context_length} tokens, on {info.device}")

    def on_load_failed(self, path: str, message: str) -> None:
        """The worker kept the model it had: chat with that one again, and say so (once)."""
        text = f"Could not open {path}:\n{message}"
        if path == self.source:  # not superseded by a newer request
            if self._in_worker is not None:
                self.source, self._source_is_trained = self._in_worker
                self.loaded = self.source
                text += f"\nStill chatting with {self.source}."
            else:
                self.source, self.loaded, self._source_is_trained = None, None, False
                self.load_failure = text
        self.label.setText(text)
        self._placeholder(PLACEHOLDER_MODEL if self.source else PLACEHOLDER_NO_MODEL)


class SamplingForm(QGroupBox):
    """Temperature, top-k, top-p, repetition penalty and max tokens (core.generate.SamplingSettings)."""

    def __init__(self) -> None:
        super().__init__("Sampling")
        form = QFormLayout(self)
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
        self._fields = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                        "repetition_penalty": self.repetition, "max_tokens": self.max_tokens}
        for label, w in zip(("Temperature:", "Top-k:", "Top-p:", "Repetition penalty:", "Max tokens:"),
                            self._fields.values()):
            form.addRow(label, w)

    def saved(self) -> dict:
        """What a project saves: the sampling settings (the seed counts the answers and is not saved)."""
        return {key: w.value() for key, w in self._fields.items()}

    def apply(self, s: object) -> None:
        """Set the widgets from a project's saved settings (unreadable values are skipped)."""
        if not isinstance(s, dict):
            return
        for key, widget in self._fields.items():
            if key in s:
                try:
                    widget.setValue(type(widget.value())(s[key]))
                except (TypeError, ValueError):
                    pass


class TokenPanel(QGroupBox):
    """The token under the mouse: its probability (``label``) and the alternatives (a few rows)."""

    def __init__(self) -> None:
        super().__init__("Token under the mouse")
        lay = QVBoxLayout(self)
        self.label = QLabel(NO_TOKEN)
        self.label.setWordWrap(True)
        lay.addWidget(self.label)
        self.alternatives = QTableWidget(0, 2)
        self.alternatives.setHorizontalHeaderLabels(["Alternative", "Probability"])
        self.alternatives.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.alternatives.verticalHeader().setVisible(False)
        self.alternatives.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        lay.addWidget(self.alternatives, 1)

    def show_piece(self, p: AnswerPiece) -> None:
        self.label.setText(f"Token '{shown_token(p.token)}' had probability {p.prob:.1%}.")
        self.alternatives.setRowCount(len(p.alternatives))
        for r, (tok, pr) in enumerate(p.alternatives):
            self.alternatives.setItem(r, 0, QTableWidgetItem(f"'{shown_token(tok)}'"))
            self.alternatives.setItem(r, 1, QTableWidgetItem(f"{pr:.1%}"))

    def reset(self) -> None:
        self.label.setText(NO_TOKEN)
        self.alternatives.setRowCount(0)


def side_panel(*boxes: QWidget) -> QWidget:
    """The boxes one under the other, the last one taking the height left."""
    side = QWidget()
    lay = QVBoxLayout(side)
    lay.setContentsMargins(0, 0, 0, 0)
    for i, box in enumerate(boxes):
        lay.addWidget(box, 1 if i == len(boxes) - 1 else 0)
    return side
