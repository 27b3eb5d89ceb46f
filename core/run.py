"""One training run, driven once for ``opencl-llm train`` and the app's TrainWorker.

The caller turns its input (command-line options, the app's form) into a :class:`RunRequest`, gives the
few things only it knows as :class:`RunHooks` (where a checkpoint is saved, how the first matmul tuning
and the memory check are shown), and iterates :meth:`Run.events`::

    run = Run(RunRequest(dataset=data, model_config=mc, train_config=tc), RunHooks(save=my_save))
    for event in run.events():   # Phase, LogEvent, RunStarted, StepReport, RecallProgress, ValidationLoss,
        show(event)              # StageFinished, StageReport, RunDone (core.events)
    run.request_stop()           # from another thread or a signal handler: stops after the step

The run opens the device, plans the model (Auto), builds the trainer (a new model, a fine-tune of a base
model, with LoRA adapters, or a resumed checkpoint), trains, saves at every stage end (before the recall
check: a stop during it loses nothing), on a stop and on divergence, and ends with the verdict.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ModelConfig
from core.events import (LogEvent, Phase, RecallProgress, RunDone, RunStarted, StageFinished, StageReport,
                         StepReport, ValidationLoss)
from core.stages import Stage
from core.wording import count_words

if TYPE_CHECKING:
    from core.config import TrainConfig
    from core.dataset import Dataset
    from core.device import Device
    from core.lora import LoRAConfig
    from core.trainer import Trainer

log = logging.getLogger(__name__)

Event = Phase | LogEvent | RunStarted | StepReport | RecallProgress | ValidationLoss | StageFinished | StageReport | RunDone


@dataclass(frozen=True)
class RunRequest:
    """What to train, and how.

    Attributes:
        device: an index, a name, a core.device.DeviceInfo or an open Device (None: the best one found).
        dataset: a new run's data (None: core.dataset.default_dataset()); for a resume, data that replaces
            the checkpoint's (needs ``allow_new_data`` unless it is the same).
        model_config, train_config: a new run's configs (``auto``: made by the plan); a fine-tune's
            ``train_config``; a resume's settings to continue with (None: the saved ones).
        resume: a checkpoint folder to continue exactly where it stopped.
        base: a GGUF file or checkpoint folder to fine-tune (core.from_base), with ``context_length``
            (None: core.from_base's default) and optionally ``lora`` adapters, whose base matrices stay in
            the file's formats on the device unless ``lora_base`` is "f32".
        general_questions: a fine-tune's questions whose base answers are replayed and checked
            (core.known; None: none).
        auto: plan the model and the steps (core.plan.plan_for, within ``time_budget_s``, 0: its default;
            ``vocab_size``), then ``adjust(model_config, train_config)`` applies the caller's own options;
            ``learn_heldout`` trains the fact questions the plan holds out.
        val_every: None: no validation loss; 0: at each stage end; N: also every N steps.
        save_at_end: save once more at the end (and on a stop before the first step) when the trainer's
            state (stage, step, AdamW step, dataset) is not the last save's (never a new model no step trained:
            nothing is saved of a run stopped during its setup), e.g. a resumed run with nothing
            left to train saving into another folder (``train`` does; the app keeps the checkpoint it has;
            ``train`` refuses new data with nothing to train on it before this).
        resume_in_place: the run saves into the folder it resumes, so the resumed state counts as saved
            (a finished run resumed there is not written again).
        preset: the preset's name for the verdict's advice (the plan's when ``auto``).
        plan_s: ``(run_s, first_run_s)`` of a plan made before (the app's Auto plan) for RunStarted.
    """

    device: Any = None
    dataset: Dataset | None = None
    model_config: ModelConfig | None = None
    train_config: TrainConfig | None = None
    resume: str | Path | None = None
    allow_new_data: bool = False
    base: str | None = None
    context_length: int | None = None
    lora: LoRAConfig | None = None
    lora_base: str = "gguf"
    general_questions: tuple[str, ...] | None = None
    auto: bool = False
    time_budget_s: float = 0.0
    vocab_size: int = ModelConfig.vocab_size
    adjust: Callable[[ModelConfig, TrainConfig], tuple[ModelConfig, TrainConfig]] | None = None
    learn_heldout: bool = False
    val_every: int | None = None
    save_at_end: bool = False
    resume_in_place: bool = False
    preset: str | None = None
    plan_s: tuple[float, float] | None = None


_SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length", "rope_theta")
"""The model's shape fields that train's options can set over an Auto plan's (core.cli._configs)."""


def _as_given(v: float) -> str:
    """A number as given on the command line: 1000000, not 1e+06; 0.5 as 0.5."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def dataset_line(dataset: Dataset) -> str:
    """The run's dataset line: the facts and dialogues it trains ("dataset: 25 facts, 13 dialogues"), and how many
    entries hold nothing to train (an empty fact, a dialogue without a turn of text; each named in a warning)."""
    facts, dialogues = dataset.trained_counts()
    empty = len(dataset.facts) - facts + len(dataset.dialogues) - dialogues
    return (f"dataset: {count_words(facts, 'fact')}, {count_words(dialogues, 'dialogue')}"
            + (f" ({count_words(empty, 'entry', 'entries')} with nothing to train left out)" if empty else ""))


def _set_steps(trainer: Trainer) -> bool:
    """Whether ``trainer`` trains a new model for set steps (a named preset or given sizes: no recall checks during
    its stages, no fact questions written), where Auto would plan the run and train until learned."""
    return not trainer.train_config.check_every and not trainer.base_meta


def _no_memory_check(dev: Device, mc: ModelConfig, tc: TrainConfig, lora: LoRAConfig | None,
                     planned: dict, max_seq: int) -> None:
    """The default: no check before the trainer (the Model refuses what does not fit, core.model.check_fits)."""


@dataclass(frozen=True)
class RunHooks:
    """What only the caller knows.

    Attributes:
        save: ``save(trainer, stage_end) -> folder`` writes a checkpoint (``stage_end``: the stage's steps
            are all done; else a stop or a divergence) and returns the folder it wrote.
        replaced: whether the last save went to the trained model the caller keeps (RunDone.replaced).
        tune: the device's first matmul tuning, shown as the caller likes (default: done when first used).
        check_memory: ``(device, model_config, train_config, lora, planned base formats, max_seq)`` before
            a new run's or a fine-tune's model is built (``max_seq``: the longest row it is built for,
            core.trainer.max_seq_of the run's data); raises to refuse it.
    """

    save: Callable[[Trainer, bool], str]
    replaced: Callable[[], bool] = field(default=lambda: True)
    tune: Callable[[Device], None] = field(default=lambda dev: None)
    check_memory: Callable[..., None] = field(default=_no_memory_check)


class Run:
    """One run of a :class:`RunRequest` (see the module's docstring). ``trainer`` is set once it is built."""

    def __init__(self, request: RunRequest, hooks: RunHooks) -> None:
        self.request, self.hooks = request, hooks
        self.trainer: Trainer | None = None
        self.plan = None  # the Auto plan (core.plan.Plan), when ``auto``
        self.saved = ""  # the folder saved last
        self._stop = False
        self._replay = None  # core.known.Replay of a fine-tune's general questions
        self._resident_before: int | None = None  # a fine-tune's resident bytes before its trainer
        self._saved_state: tuple | None = None  # Run._state of the last save
        self.new_data = False  # a resume that continues on another dataset than the checkpoint's
        self.resumed_at = (0, 0)  # a resume's (stage index, stage step) at its start

    def request_stop(self) -> None:
        """Stop after the step in progress (or the recall prompt), with a checkpoint (thread-safe flag)."""
        self._stop = True
        if self.trainer is not None:
            self.trainer.request_stop()

    def events(self) -> Iterator[Event]:
        """Set up, train and end the run, as events (core.events). Raises what the setup or the
        training raises (core.trainer.TrainingDiverged after a save of the last good weights)."""
        base = yield from self._read_base()
        from core.device import Device, open_device

        req = self.request
        dev = req.device if isinstance(req.device, Device) else open_device(req.device)
        yield LogEvent("INFO", f"device: {dev.info.label}")
        mc, tc = yield from self._configs(dev)
        builds, build_s = dev.builds, dev.build_seconds
        trainer = yield from (self._resumed(dev) if req.resume else self._new(dev, mc, tc, base))
        self.trainer = trainer
        if self._stop:
            trainer.request_stop()
        yield from self._started(dev, trainer, base, (builds, build_s))
        if self._stop:
            if self._save_at_end(trainer):
                self._save(trainer, False)
            yield self._done(True, None)
            return
        yield from self._train(trainer)

    # ------------------------------------------------------------------ setup
    def _read_base(self):
        """``(loaded, model_config, base_meta)`` of a fine-tune's base model (None for any other run)."""
        req = self.request
        if not req.base or req.resume:
            return None
        from core.from_base import load_base, lora_base_meta

        yield Phase("read", f"reading {req.base}")
        loaded, mc, meta = load_base(req.base, req.context_length)
        if req.lora is not None:
            meta = lora_base_meta(req.base, meta, req.lora)
        return loaded, mc, meta

    def _configs(self, dev: Device):
        """``(model_config, train_config)``: the request's, or the Auto plan's with ``adjust`` applied."""
        req = self.request
        if not req.auto:
            self.hooks.tune(dev)
            return req.model_config, req.train_config
        from core.dataset import default_dataset
        from core.plan import plan_for

        yield Phase("plan", "planning: counting tokens and measuring this device's training speed (on a "
                            "device's first run this compiles the kernels too)…")
        data = req.dataset if req.dataset is not None else default_dataset()
        self.plan, _ = plan_for(data, dev, req.time_budget_s, req.vocab_size)
        mc, tc = self.plan.model_config, self.plan.train_config
        if req.adjust is not None:
            mc, tc = req.adjust(mc, tc)
        if req.learn_heldout:
            tc = replace(tc, heldout=0)
        yield LogEvent("INFO", f"plan: {self.plan.summary()}")
        for note in self.plan.notes:
            yield LogEvent("INFO", f"note: {note}")
        planned = self.plan.train_config
        # a stage with data (planned steps) whose most steps the caller set to another number than the plan's
        given = [f"{name} {count_words(now.steps, 'step')} (planned {plan:,})" for name, now, old, plan in
                 (("pretrain", tc.pretrain, planned.pretrain, self.plan.planned_steps[0]),
                  ("tune", tc.dialogues, planned.dialogues, self.plan.planned_steps[1]))
                 if plan and now.steps != old.steps and now.steps != plan]
        pm = self.plan.model_config  # the plan's line names its model's size, not the one trained
        shape = [f"{f} {_as_given(getattr(mc, f))} (planned {_as_given(getattr(pm, f))})" for f in _SHAPE_FIELDS
                 if getattr(mc, f) != getattr(pm, f)]
        size = f": {mc.n_params():,} parameters (planned {pm.n_params():,})" if mc.n_params() != pm.n_params() else ""
        asked = [", ".join(shape) + size] if shape else []
        if given:
            asked.append(" and ".join(given))
        if asked:  # the shape and steps asked for replace the plan's (its estimate is of the plan's)
            yield LogEvent("INFO", f"note: as you asked, {'; '.join(asked)}; the estimate above is the plan's")
        self.hooks.tune(dev)
        return mc, tc

    def _memory_check(self, dev: Device, mc: ModelConfig, tc: TrainConfig, base) -> Callable[[int], None]:
        """The trainer's ``check_memory``: the hook's, given what this run builds and the trainer's max_seq."""
        req, planned = self.request, {}
        if base is not None and req.lora is not None and req.lora_base == "gguf":
            from core.model import quantized_plan

            planned = quantized_plan(base[1], req.lora, base[0].quantized)
        mc, lora = (base[1], req.lora) if base is not None else (mc, None)
        return lambda max_seq: self.hooks.check_memory(dev, mc, tc, lora, planned, max_seq)

    def _resumed(self, dev: Device):
        """The trainer of a resumed checkpoint, at its saved step."""
        from core.checkpoint import load_checkpoint, resume_trainer

        req = self.request
        # the datasets trained before (read as a load reads them: a folder a save left half swapped too)
        earlier = load_checkpoint(req.resume).checkpoint.previous_dataset_hashes if req.allow_new_data else None
        trainer = resume_trainer(req.resume, dev, train_config=req.train_config, dataset=req.dataset,
                                 allow_new_data=req.allow_new_data)
        self.new_data = earlier is not None and trainer.previous_dataset_hashes != earlier
        if self.new_data and trainer.previous_dataset_hashes[-1:] and not trainer.done:  # (done: nothing trains on it)
            yield LogEvent("INFO", f"continuing on a new dataset ({count_words(len(trainer.dataset.facts), 'fact')}, "
                                   f"{count_words(len(trainer.dataset.dialogues), 'dialogue')}); the checkpoint records it")
        if req.resume_in_place:  # what the folder holds: the trainer's position, and the data it was saved with
            self._saved_state = (*self._state(trainer)[:3],
                                 trainer.previous_dataset_hashes[-1] if self.new_data else trainer.dataset_hash)
        self._restore_replay(trainer)
        self.resumed_at = (trainer.stage_index, trainer.stage_step)
        where = "both stages complete" if trainer.done else \
            f"stage {trainer.stage_index + 1} of 2, step {trainer.stage_step}"
        ran = trainer.stages_run[trainer.stage_index] if trainer.stage_index < len(trainer.stages_run) else None
        if not trainer.done and ran is not None and ran < trainer.stage_step:  # a stage that ended early, extended
            where += (f" (the stage had ended after {count_words(ran, 'step')}; its steps up to "
                      f"{trainer.stage_step} count as done)")
        yield LogEvent("INFO", f"resuming {req.resume} at {where}")
        return trainer

    def _new(self, dev: Device, mc: ModelConfig, tc: TrainConfig, base):
        """The trainer of a new model, or of a fine-tune of ``base`` (with its general questions replayed)."""
        from core.dataset import default_dataset
        from core.trainer import Trainer

        req = self.request
        dataset = req.dataset if req.dataset is not None else default_dataset()
        yield LogEvent("INFO", dataset_line(dataset))
        if base is None:
            yield Phase("build", "training the tokenizer and building the model")
            return Trainer(dataset, mc, tc, dev, check_memory=self._memory_check(dev, mc, tc, base))
        from core import chat_format, known
        from core.estimates import resident_bytes
        from core.from_base import base_trainer, with_data_mix

        loaded, mc, meta = base
        own = "its own chat template" if chat_format.uses_file_template(loaded.tokenizer) else "our chat format"
        yield LogEvent("INFO", f"base: {req.base} ({type(loaded.tokenizer).__name__}, {own})")
        tc = with_data_mix(tc, loaded.tokenizer, dataset, mc.context_length)  # (before the memory check: its rows)
        check = self._memory_check(dev, mc, tc, base)
        dataset = yield from self._with_general_questions(dev, mc, loaded, dataset)
        self._resident_before = resident_bytes()  # the base's weights and libraries, before the device's buffers
        trainer = base_trainer(loaded, mc, meta, dataset, tc, dev, lora=req.lora, quantized=req.lora_base == "gguf",
                               check_memory=check)
        if self._replay is not None and self._replay.pairs:
            trainer.replayed_from = self._replay.first_dialogue  # its stage lines count them apart
            trainer.base_meta["general_replay"] = known.replay_meta(self._replay)  # (for a resume)
        return trainer

    def _restore_replay(self, trainer: Trainer) -> None:
        """A resumed fine-tune's replayed general questions (config.json's ``base.general_replay``) as the run it
        continues had them, where its dataset still ends with them; else (a new dataset) none."""
        from core.known import replay_of

        if "general_replay" not in trainer.base_meta:
            return
        self._replay = replay_of(trainer.base_meta["general_replay"], trainer.dataset)
        if self._replay is None:
            del trainer.base_meta["general_replay"]
        else:
            trainer.replayed_from = self._replay.first_dialogue

    def _with_general_questions(self, dev: Device, mc: ModelConfig, loaded, dataset: Dataset):
        """``dataset`` with the base model's answers to the general questions appended (core/known.py)."""
        questions = self.request.general_questions
        if questions is None:
            return dataset
        from core import known

        yield Phase("ask", f"asking the base model {count_words(len(questions), 'general question')} (its answers are "
                           "replayed and checked, so it keeps what it knew)…")
        pairs, unfinished = known.base_answers(dev, mc, loaded.weights, loaded.tokenizer, questions)
        dataset, self._replay = known.with_replay(dataset, pairs, unfinished)
        return dataset

    def _started(self, dev: Device, trainer: Trainer, base, built: tuple[int, float]):
        """The estimate (a fine-tune's measured now, a plan's), the kernels compiled since ``built``
        (``(dev.builds, dev.build_seconds)`` before), the model line and :class:`RunStarted`."""
        req, estimate = self.request, (0.0, 0.0, 0)
        if base is not None:
            estimate = yield from self._measured_estimate(dev, trainer)
        elif self.plan is not None:
            estimate = (self.plan.run_s, self.plan.first_run_s, 0)
        elif req.plan_s and not req.resume:
            estimate = (*req.plan_s, 0)
        elif not req.resume:  # a named preset or given sizes: no plan timed the device, so time this model
            estimate = yield from self._measured_estimate(dev, trainer, "estimating the run: timing a few passes of "
                                                                        "the model")
        if dev.build_seconds - built[1] >= 1.0:
            yield LogEvent("INFO", f"compiled {count_words(dev.builds - built[0], 'kernel program')} in "
                                   f"{dev.build_seconds - built[1]:.0f} s (first run on this device; cached for the next)")
        c, tc = trainer.model_config, trainer.train_config
        yield LogEvent("INFO", f"model: {c.n_params():,} parameters (d_model {c.d_model}, {count_words(c.n_layers, 'layer')}, "
                               f"{count_words(c.n_heads, 'head')}, vocab {c.vocab_size}, context {c.context_length})")
        unasked, n_facts = len(trainer.batches.unasked), trainer.dataset.trained_counts()[0]
        if unasked:
            first = " ".join(trainer.dataset.facts[trainer.batches.unasked[0]].split())
            first = first if len(first) <= 60 else first[:59].rstrip() + "…"
            if tc.fact_questions or not _set_steps(trainer):
                advice = ("no question was written for them, so the model may not answer questions about them; add a "
                          "dialogue asking about one fact of each kind (questions for the others of that kind are then "
                          "written for you)")
            else:  # a new model of a named preset (set steps): its mix writes none, Auto's does
                advice = ("this run writes no questions for facts, so the model may not answer questions about them; "
                          "with a dialogue asking about one fact of each kind, the Auto preset (the default) writes "
                          "them for the others")
            yield LogEvent("INFO", f"questions: no dialogue asks about {unasked:,} of {count_words(n_facts, 'fact')} "
                                   f"(such as \"{first}\") and {advice}")
        yield RunStarted(dev.info.label, c.n_params(), c.vocab_size, (tc.pretrain.steps, tc.dialogues.steps),
                         trainer.stage_index, trainer.stage_step, bool(req.resume), *estimate)

    def _measured_estimate(self, dev: Device, trainer: Trainer,
                           phase: str = "estimating the fine-tune: timing a few passes of the base model"):
        """``(estimated_s, first_run_s, peak_resident_bytes)`` of a fine-tune (or of a new model of a named preset,
        which no plan timed), measured on its own model before the first step (core.from_base.estimate_time;
        a fine-tune's resident memory: estimate_resident) after the Phase ``phase``; its one-time costs are paid."""
        from core.from_base import estimate_resident, estimate_time

        yield Phase("estimate", phase)
        est = estimate_time(trainer)
        trainer.check_speed = est.decoding  # its recall checks decode as this speed says is faster (core.recall)
        yield LogEvent("INFO", f"plan: {est.summary()}")
        before = self._resident_before
        if before is None:
            return est.total_s, 0.0, 0
        r = estimate_resident(trainer, before, dev.is_cpu)
        where = f"the device's buffers up to rows of {r.longest} tokens, " if r.device_on_host else ""
        yield LogEvent("INFO", f"resident memory: at most about {r.peak_bytes / 2**30:.2f} GiB in this process "
                               f"({where}then a checkpoint save's {r.save_bytes / 2**30:.2f} GiB copy of the weights "
                               f"and moments or a recall check's {r.check_bytes / 2**30:.2f} GiB of logits)")
        return est.total_s, 0.0, r.peak_bytes

    # ------------------------------------------------------------------ training
    def _train(self, trainer: Trainer):
        """The trainer's events, with validation losses, saves at stage ends, on a stop and on divergence."""
        from core.trainer import TrainingDiverged

        stopped = progressed = False
        final = None
        try:
            for ev in trainer.run():
                if isinstance(ev, StepReport):
                    progressed = True
                    yield ev
                    every = self.request.val_every
                    if every and ev.step % every == 0 and ev.step < ev.total_steps and not self._stop:
                        yield self._validation(trainer, ev.stage, ev.global_step)
                elif isinstance(ev, StageFinished):  # saved before the recall check, so a stop cannot lose it
                    self._save(trainer, True)
                    yield ev
                elif isinstance(ev, StageReport):
                    stopped, final = ev.stopped, ev
                    if not ev.stopped and self.request.val_every is not None:
                        offset = 0 if ev.stage is Stage.PRETRAIN else trainer.train_config.pretrain.steps
                        yield self._validation(trainer, ev.stage, offset + ev.steps_done)
                    yield ev
                else:
                    yield ev
                if self._stop:
                    trainer.request_stop()
        except TrainingDiverged:
            self._save(trainer, False)  # the weights of the last good step are kept
            raise
        # a stop between two stages (after the first one's check, before the next one's first step) ends the
        # trainer with no stopped StageReport: the run said "model saved" and its verdict, exit 0, as if finished
        stopped = stopped or (self._stop and not trainer.done)
        if ((stopped and progressed) or self._save_at_end(trainer)) and self._saved_state != self._state(trainer):
            self._save(trainer, False)
        yield self._done(stopped, final)

    def _save_at_end(self, trainer: Trainer) -> bool:
        """``save_at_end``'s save: the trainer's state is not the last save's, and it is not a new model that no
        step trained yet (a stop during setup: an untrained model would take the folder, and refuse the next
        `train` into it as "a trained model")."""
        untrained = not self.request.resume and trainer.model.adam_step == 0
        return self.request.save_at_end and self._saved_state != self._state(trainer) and not untrained

    @staticmethod
    def _state(trainer: Trainer) -> tuple[int, int, int, str]:
        """What a save records of the run's progress: (stage, step, AdamW step, dataset hash)."""
        return trainer.stage_index, trainer.stage_step, trainer.model.adam_step, trainer.dataset_hash

    def _save(self, trainer: Trainer, stage_end: bool) -> None:
        self.saved = self.hooks.save(trainer, stage_end)
        self._saved_state = self._state(trainer)

    @staticmethod
    def _validation(trainer: Trainer, stage: Stage, global_step: int) -> ValidationLoss:
        losses = trainer.validation_loss()
        return ValidationLoss(global_step, stage, losses.get("facts"), losses.get("dialogues"))

    def _without_replay(self, final: StageReport) -> StageReport:
        """``final`` with its answers and conversation counts of the user's dialogues only: the replayed general
        questions (core.known, appended after them) have their own line, "general questions: n of N answered as
        before", and were counted as answers too ("14 of 14 answers" of a dataset with 4 dialogues)."""
        from dataclasses import replace

        from core.known import split_replayed

        return replace(final, recall=tuple(split_replayed(final.recall, self._replay.first_dialogue)[0]))

    def _done(self, stopped: bool, final: StageReport | None) -> RunDone:
        """:class:`RunDone` with the verdict of the last stage's full recall table (core.plan.verdict_of)."""
        from core.plan import verdict_of

        t = self.trainer
        v, general = None, ""
        if final is not None and (final.recall or any(final.recall_left_out.values())) and not final.recall_stopped:
            preset = self.plan.preset if self.plan is not None else self.request.preset
            if self._replay is not None and self._replay.pairs:
                from core.known import verdict_line

                general = verdict_line(final.recall, self._replay)
                final = self._without_replay(final)
            unasked = set(t.batches.unasked)  # of the facts checked (a fact of one word is not: the count exceeded theirs)
            checked = sum(1 for r in final.recall if r.kind == "fact" and r.index in unasked)
            v = verdict_of(final, t.train_config.recall_target, preset, checked, _set_steps(t))
        return RunDone(stopped, t.done, self.saved, t.stage_index, t.stage_step, self.hooks.replaced(),
                       v.learned if v else False, v.text if v else "", v.advice if v else "", general)
