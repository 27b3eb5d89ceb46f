"""Small widgets the tabs and the main window share."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """A one-line label that never clips: text wider than the label ends in "…", and the whole text
    is the tooltip. ``text()`` / ``setText()`` speak in the whole text.

    Args:
        text: the initial text.
        min_chars: the width it asks for, in average characters (a layout may give it less or more).
    """

    def __init__(self, text: str = "", parent: QWidget | None = None, min_chars: int = 20) -> None:
        super().__init__(parent)
        self._full = ""
        self._min_chars = min_chars
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def text(self) -> str:  # noqa: D102 - QLabel API
        return self._full

    def setText(self, text: str) -> None:  # noqa: N802 - QLabel API
        self._full = text or ""
        self._elide()

    def shown_text(self) -> str:
        """What is drawn now (elided to the width)."""
        return super().text()

    def is_elided(self) -> bool:
        return self.shown_text() != self._full

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        fm = self.fontMetrics()
        return QSize(fm.horizontalAdvance(self._full) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(self.fontMetrics().averageCharWidth() * self._min_chars, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(0, self.contentsRect().width())
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, width)
        super().setText(shown)
        self.setToolTip(self._full if shown != self._full else "")


class Banner(QFrame):
    """A yellow message strip over a tab: the text (``text_label``), an optional action button and Dismiss.

    Args:
        action: the action button's text (hidden unless ``show_message(..., action=True)``).
        on_action: called when it is clicked (the banner hides first).
    """

    def __init__(self, action: str, on_action: Callable[[], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setStyleSheet("QFrame { background: #fff3cd; border: 1px solid #e0c060; border-radius: 4px; }")
        row = QHBoxLayout(self)
        self.text_label = QLabel()
        self.text_label.setWordWrap(True)
        row.addWidget(self.text_label, 1)
        self.action_button = QPushButton(action)
        self.action_button.clicked.connect(self.hide)
        self.action_button.clicked.connect(on_action)
        row.addWidget(self.action_button)
        close = QPushButton("Dismiss")
        close.clicked.connect(self.hide)
        row.addWidget(close)
        self.hide()

    def show_message(self, text: str, action: bool) -> None:
        """Show ``text``, with the action button when ``action``."""
        self.text_label.setText(text)
        self.action_button.setVisible(action)
        self.show()
