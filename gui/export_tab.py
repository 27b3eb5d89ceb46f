"""Export tab: write the model as a GGUF file (F32, F16, Q8_0 or Q4_0), optionally with an Ollama Modelfile,
or as a Hugging Face folder (transformers, multi-GPU training: docs/scale-out.md); a LoRA checkpoint's as the
merged model, its adapter (llama.cpp's adapter GGUF, or a PEFT folder), or both."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget)

from gui import dialogs
from gui.app_state import AppState
from gui.events import Exported
from gui.paths import data_dir, default_export_dir, inside, untitled_dir
from gui.project import checkpoint_meta
from gui.workers import ExportWorker

DTYPES = [("F32", "f32", "full precision, largest"), ("F16", "f16", "half precision, half the size"),
          ("Q8_0", "q8_0", "8-bit quantized, about a quarter of F32"),
          ("Q4_0", "q4_0", "4-bit quantized, about an eighth of F32, noticeably less exact")]
FORMATS = [("GGUF file — llama.cpp, Ollama, LM Studio", "gguf"),
           ("Hugging Face folder — transformers, training on many GPUs", "hf")]
WHAT = [("Merged model — the base with the adapters added in: one model", "merged"),
        ("LoRA adapter — a small file used with the base model (llama.cpp --lora, Ollama ADAPTER, PEFT)", "adapter"),
        ("Both — the merged model and, beside it, the adapter (NAME-lora)", "both")]
"""What a LoRA checkpoint exports (the choice is not shown for any other model)."""


class ExportTab(QWidget):
    """Runs an :class:`gui.workers.ExportWorker` for the project's trained model (or an opened one).

    Args:
        state: the app state: the project's trained model is what the tab exports; the tab reports
            whether an export runs (``set_exporting``) and where it wrote (``message``).
    """

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self._worker: ExportWorker | None = None
        self._active = False
        self._confirmed: set[str] = set()  # existing files (Modelfiles, folders) the user agreed to replace
        self.last_result: Exported | None = None

        box = QGroupBox("Export (GGUF for llama.cpp, Ollama, LM Studio; or a Hugging Face folder)")
        form = QFormLayout(box)
        self._build_choices(form)
        self._build_run(form)
        self.hint = QLabel()
        self.hint.setWordWrap(True)
        self.hint.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.modelfile.toggled.connect(self._update_hint)
        self.format.currentIndexChanged.connect(self._format_changed)
        self.what.currentIndexChanged.connect(self._format_changed)
        lay = QVBoxLayout(self)
        lay.addWidget(box)
        lay.addWidget(self.hint)
        lay.addStretch(1)
        self._update_hint()
        self.refresh()
        state.project_changed.connect(self._on_project)
        state.model_saved.connect(self.refresh)
        state.busy_changed.connect(self.refresh)

    def _build_choices(self, form: QFormLayout) -> None:
        """The model, format, file, weights and Modelfile rows."""
        self.source_label = QLabel("No trained model yet.")
        self.source_label.setWordWrap(True)
        form.addRow("Model:", self.source_label)
        self.what = QComboBox()
        self.what.setObjectName("export_what")
        for name, key in WHAT:
            self.what.addItem(name, key)
        form.addRow("Export:", self.what)
        self._what_label = form.labelForField(self.what)
        self.format = QComboBox()
        for name, key in FORMATS:
            self.format.addItem(name, key)
        form.addRow("Format:", self.format)
        prow = QHBoxLayout()
        self.path = QLineEdit()
        self.path.setPlaceholderText("model.gguf")
        self.path.textChanged.connect(self._update_hint)
        prow.addWidget(self.path, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        prow.addWidget(browse)
        form.addRow("File:", prow)
        self._path_label = form.labelForField(prow)
        self.dtype = QComboBox()
        for name, key, tip in DTYPES:
            self.dtype.addItem(f"{name} — {tip}", key)
        form.addRow("Weights:", self.dtype)
        self.modelfile = QCheckBox("Also write an Ollama Modelfile next to it")
        form.addRow("", self.modelfile)

    def _build_run(self, form: QFormLayout) -> None:
        """The Export button with its progress, status and result rows."""
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

    def is_hf(self) -> bool:
        """True when the chosen format is a Hugging Face folder."""
        return self.format.currentData() == "hf"

    def set_format(self, key: str) -> None:
        i = self.format.findData(key)
        if i >= 0:
            self.format.setCurrentIndex(i)

    def is_lora(self) -> bool:
        """True when the model is a LoRA checkpoint (it exports merged, as its adapter, or both)."""
        src = self.source()
        meta = checkpoint_meta(src) if src else None
        return meta is not None and meta.lora is not None

    def exports(self) -> str:
        """What Export writes: "merged" (every model but a LoRA checkpoint), "adapter" or "both"."""
        return self.what.currentData() if self.is_lora() else "merged"

    def _targets(self, out: str) -> tuple[str | None, str | None]:
        """``(merged export, adapter export)`` of the path ``out`` for :meth:`exports` (None: not written)."""
        from core.lora_io import adapter_beside

        what = self.exports()
        if what == "merged":
            return out, None
        return (None, out) if what == "adapter" else (out, str(adapter_beside(Path(out), self.is_hf())))

    def _format_changed(self) -> None:
        hf = self.is_hf()
        self.dtype.setEnabled(not hf and self.exports() != "adapter")  # Hugging Face and adapters: float32
        self.modelfile.setEnabled(not hf)
        self.path.setPlaceholderText("hf-model" if hf else "model.gguf")
        if self._path_label is not None:
            self._path_label.setText("Folder:" if hf else "File:")
        text = self.path.text().strip()
        if hf and text.lower().endswith(".gguf"):
            self.path.setText(text[:-5])
        elif not hf and text and not text.lower().endswith(".gguf"):
            self.path.setText(text + ".gguf")
        self._confirmed = set()
        self._update_hint()

    def _update_hint(self) -> None:
        """How to use the file, with the real file names (the Modelfile is ``<stem>.Modelfile``)."""
        import shlex
        from html import escape

        def code(*words: str) -> str:
            return "<code>" + escape(" ".join(shlex.quote(w) for w in words), quote=False) + "</code>"

        if self.is_hf():
            folder = self.path.text().strip() or "hf-model"
            self.hint.setText(
                "With transformers: <code>" + escape(f"AutoModelForCausalLM.from_pretrained({folder!r})", quote=False)
                + "</code>. "
                f"To train it on many GPUs: {code('accelerate', 'launch', 'examples/train_accelerate.py', '--model', folder, '--data', 'dataset.json', '--out', folder + '-tuned')} "
                f"(docs/scale-out.md); {code('opencl-llm', 'chat', '--model', folder + '-tuned')} brings it back."
                + ("" if self.exports() == "merged" else " The adapter's folder loads with PEFT: <code>" + escape(
                    f"PeftModel.from_pretrained(model, {self._targets(folder)[1]!r})", quote=False) + "</code> on "
                    "the Hugging Face export of the base model."))
            return
        from core.gguf_io import ollama_name

        out = Path(self.path.text().strip() or "model.gguf")
        gguf = out.name if out.name.lower().endswith(".gguf") else out.name + ".gguf"
        stem = Path(gguf).stem
        name = ollama_name(gguf)  # the name the Modelfile's own comment gives

        ollama = (f"With Ollama, in that folder: {code('ollama', 'create', name, '-f', stem + '.Modelfile')}, then "
                  f"{code('ollama', 'run', name)} (tick “Also write an Ollama Modelfile”). ")
        # greedy, as the Chat tab and the recall check answer; the model's own context (no warning)
        meta = checkpoint_meta(self.source()) if self.source() else None
        ctx = ["-c", str(meta.model.context_length)] if meta is not None else []
        run = ["-cnv", "--temp", "0", *ctx]
        line = code('llama-cli', '-m', gguf, *run) if self.exports() != "adapter" else ""
        if self.exports() != "merged" and meta is not None:  # the adapter on the base file it was trained on
            lora = code('llama-cli', '-m', str(meta.base.get("base_model", "base.gguf")), '--lora',
                        Path(self._targets(gguf)[1]).name, *run)
            line = f"{line}, or the adapter on its base: {lora}" if line else lora
        self.hint.setText(ollama + f"With llama.cpp: {line}.")

    def source(self) -> str | None:
        p = self.app_state.trained_model_path()
        return str(p) if p else None

    def _on_project(self, project) -> None:
        """A project was opened: its export settings; a file name outside the app's data folder."""
        export = project.settings.get("export")
        export = export if isinstance(export, dict) else {}
        self.set_dtype(str(export.get("dtype", "f16")))
        self.modelfile.setChecked(bool(export.get("modelfile", False)))
        path = str(export.get("path") or "")
        if not path or inside(Path(path), data_dir()):  # never suggest the app's own data folder
            name = "model" if project.folder.resolve() == untitled_dir().resolve() else project.folder.name
            path = str(default_export_dir(project.folder) / f"{name}.gguf")
        self.path.setText(path)
        self.refresh()

    def saved_settings(self) -> dict:
        """What a project saves: weight type, Modelfile wanted, file name."""
        return {"dtype": self.dtype.currentData(), "modelfile": self.modelfile.isChecked(), "path": self.path.text()}

    def refresh(self, *_: object) -> None:
        src = self.source()
        self.source_label.setText(src or "No trained model yet: train one on the Training tab.")
        self.export_button.setEnabled(src is not None and not self.is_exporting())
        lora = self.is_lora()  # only a LoRA checkpoint has an adapter to offer
        self.what.setVisible(lora)
        if self._what_label is not None:
            self._what_label.setVisible(lora)
        self.dtype.setEnabled(not self.is_hf() and self.exports() != "adapter")
        self._update_hint()  # the llama.cpp line names the model's context length

    def set_dtype(self, key: str) -> None:
        i = self.dtype.findData(key.lower())
        if i >= 0:
            self.dtype.setCurrentIndex(i)

    def is_exporting(self) -> bool:
        """True from the start until the worker's last signal has been handled."""
        return self._active

    def _browse(self) -> None:
        if self.is_hf():
            path, _ = QFileDialog.getSaveFileName(self, "Export Hugging Face folder", self.path.text() or "hf-model", "")
            if path:
                self.path.setText(path)
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export GGUF", self.path.text() or "model.gguf",
                                              "GGUF models (*.gguf)")
        if path:
            if not path.lower().endswith(".gguf"):
                path += ".gguf"
            self.path.setText(path)
            self._confirmed = {path}  # the file dialog asked about replacing it

    def export(self) -> bool:
        """Start the export; False when there is no model or no file name."""
        src = self.source()
        out = self.path.text().strip()
        if src is None or self.is_exporting():
            return False
        if not out:
            self.status.setText("Choose a file name first.")
            return False
        if self.is_hf():
            return self._export_hf(src, out)
        if not out.lower().endswith(".gguf"):
            out += ".gguf"
            self.path.setText(out)
        merged, adapter = self._targets(out)
        files = [Path(p) for p in (merged, adapter) if p]
        if any(p.is_dir() for p in files):
            self.status.setText(f"{next(p for p in files if p.is_dir())} is a folder: choose a file name.")
            return False
        # every existing file the export would replace, asked about once (a GGUF file when the file
        # dialog has not asked already, and the Modelfile beside each)
        if self.modelfile.isChecked():
            files += [p.with_name(p.stem + ".Modelfile") for p in files]
        replaced = [p for p in files if p.exists() and str(p) not in self._confirmed]
        if replaced:
            one = len(replaced) == 1
            text = (" and ".join(str(p) for p in replaced)
                    + (" already exists. Replace it?" if one else " already exist. Replace them?"))
            if not dialogs.ask(self, "Replace the file?", text, yes="Replace"):
                return False
        self._confirmed = {str(p) for p in files}  # exporting again to the same files replaces them without asking
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.status.setText(f"Export failed: {e}")
            return False
        self._start(ExportWorker(src, merged, self.dtype.currentData(), self.modelfile.isChecked(),
                                 adapter_path=adapter))
        return True

    def _export_hf(self, src: str, out: str) -> bool:
        merged, adapter = self._targets(out)
        folders = [Path(p) for p in (merged, adapter) if p]
        for p in folders:
            if p.exists() and not p.is_dir():
                self.status.setText(f"{p} is a file: choose a folder name.")
                return False
        full = [p for p in folders if p.is_dir() and any(p.iterdir()) and str(p) not in self._confirmed]
        if full:
            text = " and ".join(map(str, full)) + (" already holds an export. Replace it?" if len(full) == 1
                                                   else " already hold exports. Replace them?")
            if not dialogs.ask(self, "Replace the folder?", text, yes="Replace"):
                return False
        self._confirmed = {str(p) for p in folders}
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.status.setText(f"Export failed: {e}")
            return False
        self._start(ExportWorker(src, merged, "f32", False, fmt="hf", adapter_path=adapter))
        return True

    def _start(self, w: ExportWorker) -> None:
        w.connect_slots(progress=self.status.setText, exported=self._on_exported, failed=self._on_failed,
                        finished=self._on_finished)
        self._worker = w
        self._active = True
        self.app_state.set_exporting(True)
        self.last_result = None
        self.result.setText("")
        self.progress.setRange(0, 0)
        self.export_button.setEnabled(False)
        w.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.request_stop()
            self._worker.wait()

    def _on_exported(self, d: Exported) -> None:
        self.last_result = d
        text = f"{d.path} — {d.size_bytes / 1e6:.2f} MB"
        if d.modelfile:
            text += f"\nModelfile: {d.modelfile}"
        if d.adapter and d.adapter != d.path:
            text += f"\nAdapter: {d.adapter} — {d.adapter_bytes / 1e6:.2f} MB"
        if d.adapter_modelfile and d.adapter_modelfile != d.modelfile:
            text += f"\nAdapter's Modelfile: {d.adapter_modelfile}"
        for note in d.notes:
            text += f"\nNote: {note}"
        self.result.setText(text)
        self.status.setText("Done.")
        QSettings().setValue("export/folder", str(Path(d.path).parent))  # the next project suggests it
        self.app_state.message.emit(f"exported {d.path}")

    def _on_failed(self, kind: str, message: str) -> None:
        self.status.setText(f"Export failed: {message}")

    def _on_finished(self) -> None:
        self._active = False
        self.app_state.set_exporting(False)
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if self.last_result else 0)
        self.refresh()
