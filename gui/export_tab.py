"""Export tab: write the model as a GGUF file (F32, F16, Q8_0 or Q4_0), optionally with an Ollama Modelfile."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from gui import dialogs
from gui.workers import ExportWorker

DTYPES = [("F32", "f32", "full precision, largest"), ("F16", "f16", "half precision, half the size"),
          ("Q8_0", "q8_0", "8-bit quantized, about a quarter of F32"),
          ("Q4_0", "q4_0", "4-bit quantized, about an eighth of F32, noticeably less exact")]


class ExportTab(QWidget):
    """Runs an :class:`gui.workers.ExportWorker` for the project's trained model (or an opened one).

    Args:
        studio: the main window: ``trained_model_path()``, ``chat_model_path()``.
    """

    exported = Signal(dict)  # {"path", "size_bytes", "modelfile"}

    def __init__(self, studio, parent=None) -> None:
        super().__init__(parent)
        self.studio = studio
        self._worker: ExportWorker | None = None
        self._active = False
        self._confirmed: str | None = None  # an existing file the user agreed to replace
        self.last_result: dict | None = None

        box = QGroupBox("Export to GGUF (llama.cpp, Ollama, LM Studio)")
        form = QFormLayout(box)
        self.source_label = QLabel("No trained model yet.")
        self.source_label.setWordWrap(True)
        form.addRow("Model:", self.source_label)
        prow = QHBoxLayout()
        self.path = QLineEdit()
        self.path.setPlaceholderText("model.gguf")
        self.path.textChanged.connect(self._update_hint)
        prow.addWidget(self.path, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        prow.addWidget(browse)
        form.addRow("File:", prow)
        self.dtype = QComboBox()
        for name, key, tip in DTYPES:
            self.dtype.addItem(f"{name} — {tip}", key)
        form.addRow("Weights:", self.dtype)
        self.modelfile = QCheckBox("Also write an Ollama Modelfile next to it")
        form.addRow("", self.modelfile)
        brow = QHBoxLayout()
        self.export_button = QPushButton("Export")
        self.export_button.clicked.connect(self.export)
        brow.addWidget(self.export_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        brow.addWidget(self.progress, 1)
        form.addRow("", brow)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow("", self.status)
        self.result = QLabel("")
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Result:", self.result)
        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.hint.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.modelfile.toggled.connect(self._update_hint)
        lay = QVBoxLayout(self)
        lay.addWidget(box)
        lay.addWidget(self.hint)
        lay.addStretch(1)
        self._update_hint()
        self.refresh()

    def _update_hint(self) -> None:
        """How to use the file, with the real file names (the Modelfile is ``<stem>.Modelfile``)."""
        import shlex
        from html import escape

        out = Path(self.path.text().strip() or "model.gguf")
        gguf = out.name if out.name.lower().endswith(".gguf") else out.name + ".gguf"
        stem = Path(gguf).stem
        name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in stem.lower()) or "mymodel"

        def code(*words: str) -> str:
            return "<code>" + escape(" ".join(shlex.quote(w) for w in words), quote=False) + "</code>"

        ollama = (f"With Ollama, in that folder: {code('ollama', 'create', name, '-f', stem + '.Modelfile')}, then "
                  f"{code('ollama', 'run', name)} (tick “Also write an Ollama Modelfile”). ")
        self.hint.setText(ollama + f"With llama.cpp: {code('llama-cli', '-m', gguf, '-cnv')}.")

    def source(self) -> str | None:
        p = self.studio.trained_model_path()
        return str(p) if p else None

    def refresh(self) -> None:
        src = self.source()
        self.source_label.setText(src or "No trained model yet: train one on the Training tab.")
        self.export_button.setEnabled(src is not None and not self.is_exporting())

    def set_dtype(self, key: str) -> None:
        i = self.dtype.findData(key.lower())
        if i >= 0:
            self.dtype.setCurrentIndex(i)

    def is_exporting(self) -> bool:
        """True from the start until the worker's last signal has been handled."""
        return self._active

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export GGUF", self.path.text() or "model.gguf",
                                              "GGUF models (*.gguf)")
        if path:
            if not path.lower().endswith(".gguf"):
                path += ".gguf"
            self.path.setText(path)
            self._confirmed = path  # the file dialog asked about replacing it

    def export(self) -> bool:
        """Start the export; False when there is no model or no file name."""
        src = self.source()
        out = self.path.text().strip()
        if src is None or self.is_exporting():
            return False
        if not out:
            self.status.setText("Choose a file name first.")
            return False
        if not out.lower().endswith(".gguf"):
            out += ".gguf"
            self.path.setText(out)
        if Path(out).exists() and out != self._confirmed:
            if Path(out).is_dir():
                self.status.setText(f"{out} is a folder: choose a file name.")
                return False
            if not dialogs.ask(self, "Replace the file?", f"{out} already exists. Replace it?", yes="Replace"):
                return False
        self._confirmed = out  # exporting again to the same file replaces it without asking
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.status.setText(f"Export failed: {e}")
            return False
        w = ExportWorker(src, out, self.dtype.currentData(), self.modelfile.isChecked())
        w.progress.connect(self.status.setText)
        w.exported.connect(self._on_exported)
        w.failed.connect(self._on_failed)
        w.finished.connect(self._on_finished)
        self._worker = w
        self._active = True
        self.last_result = None
        self.result.setText("")
        self.progress.setRange(0, 0)
        self.export_button.setEnabled(False)
        w.start()
        return True

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.request_stop()
            self._worker.wait()

    def _on_exported(self, d: dict) -> None:
        self.last_result = d
        text = f"{d['path']} — {d['size_bytes'] / 1e6:.2f} MB"
        if d.get("modelfile"):
            text += f"\nModelfile: {d['modelfile']}"
        for note in d.get("notes", []):
            text += f"\nNote: {note}"
        self.result.setText(text)
        self.status.setText("Done.")
        QSettings().setValue("export/folder", str(Path(d["path"]).parent))  # the next project suggests it
        self.exported.emit(d)

    def _on_failed(self, kind: str, message: str) -> None:
        self.status.setText(f"Export failed: {message}")

    def _on_finished(self) -> None:
        self._active = False
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if self.last_result else 0)
        self.refresh()
