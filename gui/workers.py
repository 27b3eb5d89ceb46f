"""QThread workers: each calls ``core`` off the GUI thread and emits what happened as the frozen
dataclasses of :mod:`gui.events` (or plain str / core dataclasses where the comment says so).

Rules (napari / pyqtgraph style):

- signals are declared at class level, with a comment naming each argument;
- a worker never touches a widget; the GUI connects its own slots to the signals;
- :meth:`Worker.request_stop` sets a flag that the worker checks at every step;
- an exception ends the job and is emitted as ``failed(kind, message)``.

Every worker registers itself, so the main window (and the tests) can stop and wait for all of
them with :func:`stop_all` before the application exits.
"""
from __future__ import annotations

import logging
import queue
import shutil
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from PySide6.QtCore import QThread, Signal

from core.events import LogEvent, Phase, RecallProgress, RunDone, RunStarted, StageReport, StepReport, ValidationLoss
from gui.events import AnswerDone, AnswerPiece, ComparedAnswer, Comparison, Exported, ModelLoaded

if TYPE_CHECKING:
    from core.config import ModelConfig, TrainConfig
    from core.dataset import Dataset
    from core.device import DeviceInfo
    from core.lora import LoRAConfig

log = logging.getLogger(__name__)

_live: "weakref.WeakSet[Worker]" = weakref.WeakSet()


def running_workers() -> list["Worker"]:
    """Workers whose thread is still running."""
    return [w for w in list(_live) if w.isRunning()]


def stop_all() -> None:
    """Ask every running worker to stop, then wait until each thread has ended."""
    workers = running_workers()
    for w in workers:
        w.request_stop()
    for w in workers:
        w.wait()


def error_kind(exc: BaseException) -> str:
    """Classify an exception for the GUI: "no_opencl", "build", "device", "diverged" or "error".

    "device" means the OpenCL runtime failed while running (e.g. OUT_OF_RESOURCES,
    MEM_OBJECT_ALLOCATION_FAILURE): the GUI offers to switch to the CPU device.
    """
    from core.device import KernelBuildError, OpenCLUnavailableError

    if isinstance(exc, OpenCLUnavailableError):
        return "no_opencl"
    if isinstance(exc, KernelBuildError):
        return "build"
    try:
        import pyopencl as cl

        if isinstance(exc, cl.Error):
            return "device"
    except ImportError:  # pragma: no cover - pyopencl is a dependency
        pass
    if isinstance(exc, MemoryError):
        return "device"
    from core.trainer import TrainingDiverged

    if isinstance(exc, TrainingDiverged):
        return "diverged"
    return "error"


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


class Worker(QThread):
    """Base class: runs :meth:`work` in the thread and reports exceptions as ``failed``."""

    failed = Signal(str, str)  # (kind from error_kind(), message for the user)
    log_line = Signal(str, str)  # (logging level name, message)

    def __init__(self) -> None:
        super().__init__()
        self._stop = threading.Event()
        _live.add(self)

    def request_stop(self) -> None:
        """Ask the job to end at its next check (thread-safe)."""
        self._stop.set()

    def stop_requested(self) -> bool:
        """True once :meth:`request_stop` was called."""
        return self._stop.is_set()

    def connect_slots(self, **slots: Callable[..., Any]) -> "Worker":
        """Connect each signal named by a keyword (``failed=``, ``finished=``, ...) to its slot, as
        napari's ``create_worker(_connect=...)`` does; returns the worker.

        Raises:
            AttributeError: the worker has no signal of that name.
        """
        for name, slot in slots.items():
            getattr(type(self), name)  # a typo is an error here, not a silently missing connection
            getattr(self, name).connect(slot)
        return self

    def run(self) -> None:  # noqa: D102 - QThread entry point
        try:
            self.work()
        except Exception as e:  # every failure reaches the GUI as a signal, never as a crash
            log.warning("%s failed", type(self).__name__, exc_info=True)
            self.failed.emit(error_kind(e), _message(e))

    def work(self) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------------- device test

class DeviceTestWorker(Worker):
    """Builds every kernel on a device, checks ops against numpy and times a matmul."""

    progress = Signal(float, str)  # (fraction 0..1, what is happening)
    result = Signal(object)  # (core.selftest.DeviceCheck)

    def __init__(self, device_info: DeviceInfo) -> None:
        super().__init__()
        self.device_info = device_info

    def work(self) -> None:
        from core.device import open_device
        from core.selftest import CheckCancelled, check_device

        self.progress.emit(0.0, "opening the device")
        dev = open_device(self.device_info)
        try:
            check = check_device(dev, progress=self.progress.emit, should_stop=self.stop_requested)
        except CheckCancelled:
            return
        self.result.emit(check)


# ------------------------------------------------------------------------------------- before / after
class CompareWorker(Worker):
    """Greedy answers of the base model and of the model fine-tuned from it (core.from_base.before_after); a
    LoRA checkpoint's base is the one its load read (and checked by sha256), its tuned weights the merge."""

    result = Signal(object)  # (gui.events.Comparison)

    def __init__(self, device_info: DeviceInfo, checkpoint_dir: str | Path) -> None:
        super().__init__()
        self.device_info = device_info
        self.checkpoint_dir = Path(checkpoint_dir)

    def work(self) -> None:
        from core.checkpoint import load_checkpoint, load_model
        from core.checkpoint_meta import dataset_path
        from core.dataset import load_dataset
        from core.device import open_device
        from core.from_base import before_after

        tuned = load_checkpoint(self.checkpoint_dir)
        base_path = (tuned.meta or {}).get("base_model")
        if not base_path:
            raise ValueError(f"{self.checkpoint_dir}: this model was not fine-tuned from a base model")
        self.log_line.emit("INFO", f"comparing with the base model {base_path}")
        base_weights = tuned.base_weights if tuned.lora is not None else load_model(base_path).weights
        dataset, _ = load_dataset(dataset_path(self.checkpoint_dir))
        dev = open_device(self.device_info)
        rows = before_after(dev, base_weights, tuned.weights, tuned.config, tuned.tokenizer, dataset)
        self.result.emit(Comparison(tuple(ComparedAnswer(kind, question, taught, before, after)
                                          for kind, question, taught, before, after in rows)))


# ------------------------------------------------------------------------------------- training

class TrainWorker(Worker):
    """Runs (or resumes) two-stage training and saves a checkpoint at each stage end and on stop.

    A run saves into ``run_dir``. When that is not ``checkpoint_dir`` (a new run beside an older
    trained model, see gui.project), its first stage-end save replaces ``checkpoint_dir`` with it and
    later saves go to ``checkpoint_dir``; a stop before that leaves the older model in place.
    Both folders are checked first (core.checkpoint.check_output_folder): one that is not ours, holds
    files a save does not write or is read-only fails the run before it trains.

    Args:
        device_info: core.device.DeviceInfo to train on.
        checkpoint_dir: the trained model's folder (core.checkpoint's format).
        dataset, model_config: for a new run (ignored when ``resume``).
        train_config: for a new run; when resuming, the settings to continue with (None: the saved ones).
        resume: continue from ``run_dir`` at the step it was saved.
        val_every: steps between validation-loss points (0: only at stage ends).
        run_dir: where this run saves until it replaces the trained model (default ``checkpoint_dir``).
        base: a GGUF file (or checkpoint) a new run fine-tunes instead of training from scratch
            (core.from_base); ``model_config`` then gives only the training context. Its time and resident
            memory are estimated before the first step, as ``train --base`` does (core.run.Run), and the
            base's answers to core.known's general questions are replayed and checked, as there.
        lora: with ``base``, the LoRA adapters trained on the frozen base (core.lora.LoRAConfig; its block
            matrices kept in the file's formats, as ``train --base --lora``); None: every parameter.
        plan_s: ``(run_s, first_run_s)`` of the Auto plan (core.plan.Plan) a new model follows: the
            seconds it is expected to take and the one-time part of them (None: no plan).
    """

    phase = Signal(str)  # (what the run does before its first step: "reading …", "estimating …", …)
    run_started = Signal(object)  # (core.events.RunStarted)
    step = Signal(object)  # (core.events.StepReport, also gui.events.TrainingStep)
    validation = Signal(object)  # (core.events.ValidationLoss)
    stage_done = Signal(object)  # (core.events.StageReport, also gui.events.StageDone)
    recall_progress = Signal(object)  # (core.events.RecallProgress, also gui.events.RecallChecking)
    checkpoint_saved = Signal(str)  # (the trained model's folder, (re)written)
    run_done = Signal(object)  # (core.events.RunDone)

    def __init__(self, device_info: DeviceInfo, checkpoint_dir: str | Path, dataset: Dataset | None = None,
                 model_config: ModelConfig | None = None, train_config: TrainConfig | None = None, resume: bool = False, val_every: int = 0,
                 run_dir: str | Path | None = None, base: str | None = None,
                 plan_s: tuple[float, float] | None = None, lora: LoRAConfig | None = None) -> None:
        super().__init__()
        self.plan_s = plan_s
        self.device_info = device_info
        self.base, self.lora = base, lora
        self.checkpoint_dir = Path(checkpoint_dir)
        self.run_dir = Path(run_dir) if run_dir is not None else self.checkpoint_dir
        self.dataset, self.model_config, self.train_config = dataset, model_config, train_config
        self.resume = resume
        self.val_every = val_every
        self.preset: str | None = None  # the model preset's name, for the verdict's advice
        self._run = None  # the core.run.Run, once work() has made it

    def request_stop(self) -> None:
        super().request_stop()
        run = self._run
        if run is not None:
            run.request_stop()

    def _replaced(self) -> bool:
        return self.run_dir.resolve() == self.checkpoint_dir.resolve()

    def _save(self, trainer, stage_end: bool) -> str:
        from core.checkpoint import save_trainer
        from gui.project import promote_pending

        path = save_trainer(trainer, self.run_dir)
        if not self._replaced() and stage_end:
            promote_pending(self.run_dir, self.checkpoint_dir)
            self.run_dir = path = self.checkpoint_dir
            self.log_line.emit("INFO", "the new model replaces the previous one")
        if self._replaced():
            self.checkpoint_saved.emit(str(path))
            self.log_line.emit("INFO", f"checkpoint saved to {path}")
        else:
            self.log_line.emit("INFO", f"unfinished run saved to {path}; the previous trained model is kept "
                                       "until this run finishes a stage")
        return str(path)

    def _phase(self, what: str) -> None:
        self.log_line.emit("INFO", what)
        self.phase.emit(what)

    def _request(self):
        """This run as a core.run.RunRequest, as ``train`` makes it (a fine-tune's ``model_config`` gives only
        its context; it replays the general questions and trains ``lora``'s adapters, if any)."""
        from core.known import GENERAL_QUESTIONS
        from core.run import RunRequest

        mc, base = self.model_config, None if self.resume else self.base
        return RunRequest(device=self.device_info, dataset=None if self.resume else self.dataset,
                          model_config=mc, train_config=self.train_config,
                          resume=self.run_dir if self.resume else None, base=base,
                          context_length=mc.context_length if base and mc is not None else None,
                          lora=self.lora if base else None, general_questions=GENERAL_QUESTIONS if base else None,
                          val_every=self.val_every, preset=self.preset, plan_s=self.plan_s)

    def work(self) -> None:
        from core.checkpoint import check_output_folder
        from core.run import Run, RunHooks

        for folder in dict.fromkeys((self.run_dir, self.checkpoint_dir)):  # ours or refused, before training
            check_output_folder(folder)
        if not self.resume and not self._replaced() and self.run_dir.exists():
            shutil.rmtree(self.run_dir)  # an older unfinished run: this one replaces it
        self._run = run = Run(self._request(), RunHooks(save=self._save, replaced=self._replaced))
        if self.stop_requested():
            run.request_stop()
        for ev in run.events():
            self._forward(ev)

    def _forward(self, ev) -> None:
        """Emit one event of the run (core.events) as it is, through its signal."""
        if isinstance(ev, LogEvent):
            self.log_line.emit(ev.level, ev.message)
        elif isinstance(ev, Phase):
            self._phase(ev.text)
        elif type(ev) in _SIGNALS:
            getattr(self, _SIGNALS[type(ev)]).emit(ev)


_SIGNALS = {RunStarted: "run_started", StepReport: "step", ValidationLoss: "validation", StageReport: "stage_done",
            RecallProgress: "recall_progress", RunDone: "run_done"}
"""TrainWorker's signal of each event of core.run.Run (StageFinished: the run saves, no signal)."""


# ------------------------------------------------------------------------------------- chat

class _GenerationProbe:
    """Wraps a core.generate.Generator for a ChatSession and notes how the last generation ended."""

    def __init__(self, gen) -> None:
        self._gen = gen
        self.prompt_len, self.generated, self.last_token = 0, 0, -1

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def generate(self, prompt_ids, settings, stop_ids=None):
        self.prompt_len, self.generated, self.last_token = len(prompt_ids), 0, -1
        for tok, probs in self._gen.generate(prompt_ids, settings, stop_ids=stop_ids):
            self.generated += 1
            self.last_token = tok
            yield tok, probs

    def end_reason(self, max_tokens: int, eos_id: int) -> str:
        """Why the last answer was cut off: "max_tokens", "context", or "" (it ended by itself)."""
        if self.last_token == eos_id:
            return ""
        if self.generated >= max_tokens:
            return "max_tokens"
        if self.prompt_len + self.generated >= self._gen.config.context_length:
            return "context"
        return ""


class ChatWorker(Worker):
    """One long-lived thread that owns the chat model: load requests and questions are queued.

    The model (a core.generate.Generator and a core.chat.ChatSession) lives only in this thread. A
    load that fails keeps the model loaded before it.
    """

    model_loaded = Signal(object)  # (gui.events.ModelLoaded)
    load_failed = Signal(str, str)  # (path that could not be loaded, message); the previous model stays
    piece = Signal(object)  # (gui.events.AnswerPiece): one generated token
    answer_done = Signal(object)  # (gui.events.AnswerDone)

    def __init__(self) -> None:
        super().__init__()
        self._jobs: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._session = None
        self._probe: _GenerationProbe | None = None
        self._load_error = ""  # why the last model failed to load, while none is loaded (said on the next ask)

    # -- called from the GUI thread ------------------------------------------------------------
    def load(self, path: str, device_info: DeviceInfo, history: Iterable[tuple[str, str]] = ()) -> None:
        """Queue loading a checkpoint folder or .gguf file onto ``device_info``; the model continues the
        conversation ``history`` ((question, answer) pairs, oldest first; core.chat.ChatSession.history)."""
        self._jobs.put(("load", str(path), device_info, [(str(q), str(a)) for q, a in history]))

    def ask(self, message: str, settings: dict) -> None:
        """Queue a question; ``settings`` are core.generate.SamplingSettings fields."""
        self._cancel.clear()
        self._jobs.put(("ask", message, dict(settings)))

    def set_history(self, history: Iterable[tuple[str, str]]) -> None:
        """Queue replacing the model's conversation with ``history`` ((question, answer) pairs, oldest
        first): ``()`` forgets it (Clear), the cleared turns bring it back (Undo clear)."""
        self._jobs.put(("history", [(str(q), str(a)) for q, a in history]))

    def cancel(self) -> None:
        """Stop the answer being generated (at the next token)."""
        self._cancel.set()

    def request_stop(self) -> None:
        super().request_stop()
        self._cancel.set()
        self._jobs.put(None)

    # -- the thread ----------------------------------------------------------------------------
    def work(self) -> None:
        while not self.stop_requested():
            job = self._jobs.get()
            if job is None:
                break
            try:
                getattr(self, f"_do_{job[0]}")(*job[1:])
            except Exception as e:  # keep serving: a bad file or a full context is not fatal
                log.warning("chat job %s failed", job[0], exc_info=True)
                self.failed.emit(error_kind(e), _message(e))

    def _do_load(self, path: str, device_info, history: list[tuple[str, str]]) -> None:
        from core.chat import ChatSession
        from core.checkpoint import load_model
        from core.device import open_device
        from core.generate import Generator

        try:
            loaded = load_model(path)
            dev = open_device(device_info)
            probe = _GenerationProbe(Generator.for_model(dev, loaded))
        except Exception as e:  # the model loaded before stays in use
            log.warning("loading %s failed", path, exc_info=True)
            if self._session is None:
                self._load_error = _message(e).splitlines()[0]
            self.load_failed.emit(path, _message(e))
            return
        self._session, self._probe, self._load_error = ChatSession(probe, loaded.tokenizer), probe, ""
        self._session.history.extend(history)
        c = loaded.config
        self.model_loaded.emit(ModelLoaded(path, c.n_params(), c.context_length, c.vocab_size, dev.info.label))

    def _do_history(self, history: list[tuple[str, str]]) -> None:
        if self._session is not None:
            self._session.history[:] = history

    def _do_ask(self, message: str, settings: dict) -> None:
        from core.generate import SamplingSettings

        if self._session is None:
            if self._load_error:  # the reason in the tab's transcript, not only in the log
                raise RuntimeError(f"no model is loaded: {self._load_error}")
            raise RuntimeError("no model is loaded: train one or open a checkpoint or GGUF file")
        sampling = SamplingSettings(**settings)
        tok = self._session.tok
        answer, stopped = "", False
        stream = self._session.ask(message, sampling)
        for p in stream:  # one piece per token, its text exactly the text it adds
            answer += p.text
            token = tok.decode([p.token_id], skip_special=False) if p.token_id >= 0 else p.text
            self.piece.emit(AnswerPiece(p.text, token, p.token_id, p.prob,
                                        tuple((t, pr) for t, pr in p.alternatives)))
            if self._cancel.is_set() or self.stop_requested():
                stopped = True
                stream.close()  # GeneratorExit inside ask(): the turn is not added to the history
                break
        cut = "" if stopped else self._probe.end_reason(sampling.max_tokens, tok.eos_id)
        self.answer_done.emit(AnswerDone(answer.strip(), stopped, cut))


# ------------------------------------------------------------------------------------- export

class ExportWorker(Worker):
    """Writes a GGUF file (and optionally an Ollama Modelfile), or with ``fmt="hf"`` a Hugging Face
    folder, from a checkpoint, GGUF or Hugging Face folder; with ``adapter_path`` also (or, when
    ``out_path`` is None, only) a LoRA checkpoint's adapter: llama.cpp's adapter GGUF (core.lora_io,
    its Modelfile with ``modelfile``) or, with ``fmt="hf"``, a PEFT folder."""

    progress = Signal(str)  # what is happening
    exported = Signal(object)  # (gui.events.Exported)

    def __init__(self, model_path: str, out_path: str | None, dtype: str, modelfile: bool, fmt: str = "gguf",
                 adapter_path: str | None = None) -> None:
        super().__init__()
        self.model_path, self.out_path, self.dtype, self.modelfile = model_path, out_path, dtype, modelfile
        self.fmt, self.adapter_path = fmt, adapter_path

    def work(self) -> None:
        from dataclasses import replace

        from core.checkpoint import load_model

        self.progress.emit(f"reading {self.model_path}")
        loaded = load_model(self.model_path)
        if self.stop_requested():
            return
        done = self._merged(loaded) if self.out_path else None
        if self.adapter_path and not self.stop_requested():
            path, size, mf = self._adapter(loaded)
            done = (Exported(path, size, mf, ()) if done is None else done)
            done = replace(done, adapter=path, adapter_bytes=size, adapter_modelfile=mf)
        if done is not None:
            self.exported.emit(done)

    def _merged(self, loaded) -> Exported:
        """The whole model (a LoRA checkpoint's merged weights) as GGUF or a Hugging Face folder."""
        from core.gguf_io import export_gguf

        self.progress.emit(f"writing {self.out_path}")
        if self.fmt == "hf":
            from core.hf_io import export_hf

            folder = export_hf(loaded, self.out_path)
            return Exported(str(folder), _folder_bytes(folder), "", ())
        # the Export tab asked before replacing any file that exists (gui/export_tab.py)
        res = export_gguf(loaded, self.out_path, dtype=self.dtype, modelfile=self.modelfile, replace=True)
        return Exported(str(res.path), int(res.size_bytes), str(res.modelfile) if res.modelfile else "",
                        tuple(str(n) for n in res.notes))

    def _adapter(self, loaded) -> tuple[str, int, str]:
        """``(path, bytes, Modelfile or "")`` of the adapter written (core.lora_io; a PEFT folder for "hf")."""
        from core.lora_io import export_adapter_gguf, export_peft

        self.progress.emit(f"writing the adapter {self.adapter_path}")
        if self.fmt == "hf":
            folder = export_peft(loaded, self.adapter_path)
            return str(folder), _folder_bytes(folder), ""
        path, mf = export_adapter_gguf(loaded, self.adapter_path, modelfile=self.modelfile, replace=True)
        return str(path), path.stat().st_size, str(mf) if mf else ""


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files directly in ``folder`` (an export's)."""
    return int(sum(f.stat().st_size for f in folder.iterdir() if f.is_file()))


# ------------------------------------------------------------------------------------- generic

class CallWorker(Worker):
    """Calls ``fn(*args)`` once in the thread; ``done`` carries its (plain-data) result."""

    done = Signal(object)  # (the function's return value)

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        self.fn, self.args = fn, args

    def work(self) -> None:
        out = self._call()
        if not self.stop_requested():
            self.done.emit(out)

    def _call(self) -> Any:
        return self.fn(*self.args)


class ChildCallWorker(CallWorker):
    """Like :class:`CallWorker`, but ``fn(*args)`` runs in a child process (core.child_call): its Python
    work never holds the GUI's GIL, and :meth:`request_stop` ends it within 50 ms. For calls of seconds
    (:func:`call_worker`); ``fn`` must be a module-level function of ``core`` (the child imports it)."""

    def _call(self) -> Any:
        from core.child_call import call_in_child

        return call_in_child(self.fn, *self.args, stop=self.stop_requested)


CHILD_MIN_ENTRIES = 2_000
"""Datasets of at least this many entries are counted and planned in a child process. Counting 22,000
entries takes 3.5 s of Python on a 2-core Zen 1 (in a thread it held the GIL from the GUI: a search then
took 2.2 s on CI, 0.7 s without a count); 2,000 take about 0.3 s, less than a child costs to start (0.4 s for the
counts, 0.8 s more for a plan, which opens the device again)."""


def call_worker(fn: Callable[..., Any], *args: Any, entries: int) -> CallWorker:
    """A worker for ``fn(*args)`` on a dataset of ``entries`` facts and dialogues: in a thread, or in a
    child process from :data:`CHILD_MIN_ENTRIES` entries (:class:`ChildCallWorker`)."""
    return (ChildCallWorker if entries >= CHILD_MIN_ENTRIES else CallWorker)(fn, *args)

