"""The Chat tab's transcript: the questions and the streamed answers, each generated token coloured by its
probability; hovering one shows its probability and the most likely alternatives."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QTextEdit, QToolTip, QWidget

from gui.events import AnswerPiece

TOKEN_PROP = QTextFormat.Property.UserProperty + 1
PLACEHOLDER_NO_MODEL = "Train a model (or open one) and ask it something."
PLACEHOLDER_MODEL = "Ask the model something: type below and press Enter."


def shown_token(token: str) -> str:
    """A token as the tooltips write it (escapes visible; "∅" for an empty one)."""
    return repr(token)[1:-1] if token else "∅"


def token_tooltip(p: AnswerPiece) -> str:
    """Tooltip of a generated token: its probability and the top alternatives."""
    alts = "\n".join(f"  '{shown_token(t)}'  {pr:.1%}" for t, pr in p.alternatives)
    return f"'{shown_token(p.token)}': probability {p.prob:.1%}\nmost likely at this step:\n{alts}"


def prob_color(p: float) -> QColor:
    """Background for a token: clear when the model was sure, deeper orange the less sure it was."""
    alpha = int(max(0.0, min(1.0, 1.0 - p)) * 170)
    return QColor(255, 150, 40, alpha)


class Transcript(QTextEdit):
    """A read-only QTextEdit; ``pieces`` are the generated tokens shown (each one's text format holds its
    index), ``token_hovered`` names the one under the mouse."""

    token_hovered = Signal(int)  # (index into pieces): the mouse is over this generated token

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pieces: list[AnswerPiece] = []
        self.setReadOnly(True)
        self.setPlaceholderText(PLACEHOLDER_NO_MODEL)
        self.viewport().setMouseTracking(True)
        self.viewport().installEventFilter(self)

    def append_block(self, label: str, text: str, bold_color: str) -> None:
        """A new paragraph: ``label`` in bold ``bold_color``, then ``text``."""
        cur = self.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        if not self.document().isEmpty():
            cur.insertBlock()
        fmt = QTextCharFormat()
        fmt.setFontWeight(700)
        fmt.setForeground(QColor(bold_color))
        cur.insertText(label, fmt)
        cur.insertText(text, QTextCharFormat())
        self.setTextCursor(cur)

    def append_note(self, text: str) -> None:
        """Grey italics at the end (why an answer ended, an error)."""
        cur = self.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor("#888"))
        fmt.setFontItalic(True)
        cur.insertText(text, fmt)

    def append_piece(self, p: AnswerPiece, text: str) -> None:
        """Generated token ``p`` shown as ``text`` at the end, coloured by its probability."""
        self.pieces.append(p)
        if not text:  # part of a multi-byte character, cut as a stop string, or the answer's first space
            return
        cur = self.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setBackground(prob_color(p.prob))
        fmt.setToolTip(token_tooltip(p))
        fmt.setProperty(TOKEN_PROP, len(self.pieces) - 1)
        cur.insertText(text, fmt)
        self.ensureCursorVisible()

    def token_at(self, pos: QPoint) -> int | None:
        """Index into ``pieces`` of the token drawn at viewport position ``pos``, or None."""
        cur = self.cursorForPosition(pos)
        if self.cursorRect(cur).center().x() <= pos.x():
            cur.movePosition(QTextCursor.MoveOperation.Right)
        idx = cur.charFormat().property(TOKEN_PROP)
        return idx if isinstance(idx, int) and 0 <= idx < len(self.pieces) else None

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        if obj is self.viewport():
            if event.type() == QEvent.Type.MouseMove:
                idx = self.token_at(event.position().toPoint())
                if idx is not None:
                    self.token_hovered.emit(idx)
            elif event.type() == QEvent.Type.ToolTip:
                idx = self.token_at(event.pos())
                if idx is not None:
                    QToolTip.showText(event.globalPos(), token_tooltip(self.pieces[idx]), self.viewport())
                else:
                    QToolTip.hideText()
                return True
        return super().eventFilter(obj, event)
