"""Whether training or an export runs (part of gui.app_state.AppState): the project must not change under them."""
from __future__ import annotations

from collections.abc import Callable


class BusyFlags:
    """Two flags, each set by the tab that runs the work.

    Args:
        changed: called when either flag changes.
    """

    def __init__(self, changed: Callable[[], None]) -> None:
        self._changed = changed
        self._training = False
        self._exporting = False

    def is_training(self) -> bool:
        """True from the start of a run until its worker's last signal has been handled."""
        return self._training

    def is_exporting(self) -> bool:
        """True from the start of an export until its worker's last signal has been handled."""
        return self._exporting

    def busy(self) -> bool:
        """True while training or an export runs (the project must not change under them)."""
        return self._training or self._exporting

    def set_training(self, running: bool) -> None:
        """The Training tab started (True) or finished (False) a run."""
        if running != self._training:
            self._training = running
            self._changed()

    def set_exporting(self, running: bool) -> None:
        """The Export tab started (True) or finished (False) an export."""
        if running != self._exporting:
            self._exporting = running
            self._changed()
