"""OpenCL LLM Studio desktop app (PySide6 + pyqtgraph) on top of ``core``.

Widgets live in the GUI thread; every long job (kernel builds, training, generation, export) runs
in a :mod:`gui.workers` QThread that calls ``core`` and emits :mod:`gui.events` dataclasses. The
tabs share one :class:`gui.app_state.AppState`.
"""
