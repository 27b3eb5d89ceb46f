"""Every message box of the app goes through these three functions.

Questions block (the answer decides what happens next); warnings and notes do not (a window-modal
box is opened and the caller goes on), so a message shown while the window starts or while a test
waits on the event loop never stalls anything. Tests replace :func:`ask` (tests/conftest.py's
``dialogs`` fixture) and read what :func:`warn` and :func:`inform` were given.

Callers use them as ``dialogs.ask(...)`` (module attribute), so replacing them here reaches every tab.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget


def ask(parent: QWidget | None, title: str, text: str, yes: str = "Yes", no: str = "Cancel") -> bool:
    """A blocking question; True when the user chose ``yes``."""
    box = QMessageBox(QMessageBox.Icon.Question, title, text, QMessageBox.StandardButton.NoButton, parent)
    yes_button = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(no, QMessageBox.ButtonRole.RejectRole)
    box.setDefaultButton(yes_button)
    box.exec()
    return box.clickedButton() is yes_button


def _show(icon: QMessageBox.Icon, parent: QWidget | None, title: str, text: str) -> QMessageBox:
    box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    box.open()
    return box


def warn(parent: QWidget | None, title: str, text: str) -> None:
    """Show a warning without waiting for it to be closed."""
    _show(QMessageBox.Icon.Warning, parent, title, text)


def inform(parent: QWidget | None, title: str, text: str) -> None:
    """Show a note without waiting for it to be closed."""
    _show(QMessageBox.Icon.Information, parent, title, text)
