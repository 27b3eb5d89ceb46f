"""``opencl-llm``: the headless command line (devices, train, chat, export).

Every command has ``--help``. Errors from bad input are printed as one clear line (exit code 2);
no raw tracebacks for things a user can fix.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the commands import what they need when they run (a fast --help)
    from core.batches import Batches
    from core.config import ModelConfig, TrainConfig
    from core.device import Device

from core.stages import STAGES
from core.wording import count_words, memory_size

DEFAULT_MODEL_DIR = "opencl-llm-model"


def _fail(msg: str) -> int:
    print(f"opencl-llm: error: {msg}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------- devices
def cmd_devices(args: argparse.Namespace) -> int:
    from core.device import list_devices, no_usable_device_message, speed_note

    devices = list_devices()
    for d in devices:
        default = "  (default)" if d.index == 0 and not d.problem else ""
        print(f"[{d.index}] {d.label}{default}")
        if d.problem:
            print(f"     unusable: {d.problem}")
        if speed_note(d, devices):
            print(f"     speed: {speed_note(d, devices)}")
        print(f"     vendor {d.vendor.strip()}, {d.opencl_version.strip()}")
        print(f"     compute units {d.compute_units}, global memory {memory_size(d.global_mem_bytes)}, "
              f"local memory {d.local_mem_bytes // 1024} KiB, max work-group size {d.max_work_group_size}")
    if all(d.problem for d in devices):
        print("\n" + no_usable_device_message(devices).splitlines()[-1])
    return 0


TUNE_LINE_EVERY_S = 10.0  # not a terminal (a log file): a tuning progress line at most this often, and the last


def _tune_matmul(dev) -> None:
    """First use of a device: time the matmul kernels once (cached), with a progress line (rewritten in
    place on a terminal; a line every ``TUNE_LINE_EVERY_S`` seconds in a file or pipe)."""
    import time

    from core.kernels import matmul_autotune

    shown, tty, last = [], sys.stderr.isatty(), [-math.inf]

    def line(fraction: float, message: str) -> None:
        shown.append(message)
        if tty:
            print(f"\r{message:<72s}", end="" if fraction < 1.0 else "\n", file=sys.stderr, flush=True)
        elif fraction >= 1.0 or time.monotonic() - last[0] >= TUNE_LINE_EVERY_S:
            last[0] = time.monotonic()
            print(message, file=sys.stderr, flush=True)

    result = matmul_autotune.tuned_configs(dev, progress=line)
    if shown and "seconds" in result:
        cut = (f"; {count_words(result['skipped'], 'candidate')} left out by the time budget" if result.get("skipped")
               else "")
        default = f"; defaults kept for {', '.join(result['defaulted'])}" if result.get("defaulted") else ""
        print(f"matmul tuned in {result['seconds']:.1f} s{cut}{default} (cached for this device and driver)",
              file=sys.stderr)


# ----------------------------------------------------------------------------- train
def _configs(args, planned=None):
    """Model and training configs: the preset's (or ``planned``, the Auto plan's) with the options given."""
    from core.config import PRESETS, replace

    mc, tc = planned if planned is not None else PRESETS[args.preset]
    mfields = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
               "n_kv_heads": args.n_kv_heads, "ffn_dim": args.ffn_dim, "context_length": args.context_length,
               "rope_theta": args.rope_theta}
    mc = replace(mc, **{k: v for k, v in mfields.items() if v is not None})
    pre, tune = tc.pretrain, tc.dialogues
    if getattr(args, "steps", None) is not None:
        pre, tune = replace(pre, steps=args.steps), replace(tune, steps=args.steps)
    if args.pretrain_steps is not None:
        pre = replace(pre, steps=args.pretrain_steps)
    if args.tune_steps is not None:
        tune = replace(tune, steps=args.tune_steps)
    if args.pretrain_lr is not None:
        pre = replace(pre, lr=args.pretrain_lr)
    if args.tune_lr is not None:
        tune = replace(tune, lr=args.tune_lr)
    if args.batch_size is not None:
        pre, tune = replace(pre, batch_size=args.batch_size), replace(tune, batch_size=args.batch_size)
    tfields = {"seed": args.seed, "replay_share": args.replay_share, "grad_clip": args.grad_clip,
               "weight_decay": args.weight_decay, "vocab_size": args.vocab_size,
               "grad_accum": getattr(args, "grad_accum", None),
               "freeze_embeddings": True if getattr(args, "freeze_embeddings", False) else None}
    tc = replace(tc, pretrain=pre, dialogues=tune, **{k: v for k, v in tfields.items() if v is not None})
    return mc, replace(tc, **_budget(args))


_MODEL_OPTIONS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length", "rope_theta",
                  "vocab_size", "seed")


def _resume_config(args, saved, new_data: bool = False):
    """The saved TrainConfig with the training options given on the command line applied; ``new_data``: --data
    is another dataset than the checkpoint's (the same one given again is no change)."""
    from core.config import replace

    fixed = [f"--{n.replace('_', '-')}" for n in _MODEL_OPTIONS if getattr(args, n) is not None]
    if new_data and not args.allow_new_data and not (args.preset or fixed):
        raise ValueError(f"--data: {args.data} is not the dataset this run was trained on (its dataset.json); give "
                         "--allow-new-data to continue on it")
    if (new_data and not args.allow_new_data) or args.preset or fixed:
        what = ", ".join(fixed + (["--data"] if new_data and not args.allow_new_data else [])
                         + (["--preset"] if args.preset else []))
        raise ValueError(f"{what}: cannot change when resuming (the checkpoint fixes the model, dataset and "
                         "tokenizer); only steps, lr, batch size, clipping, weight decay and replay share can "
                         "(and the dataset, with --allow-new-data)")
    stages = {}
    for stage in STAGES:
        given = {"steps": getattr(args, f"{stage.flag}_steps"), "lr": getattr(args, f"{stage.flag}_lr"),
                 "batch_size": args.batch_size}
        stages[stage.value] = replace(getattr(saved, stage.value), **{k: v for k, v in given.items() if v is not None})
    extra = {k: getattr(args, k) for k in ("replay_share", "grad_clip", "weight_decay") if getattr(args, k) is not None}
    tc = replace(saved, **stages, **extra, **_budget(args))
    if getattr(args, "learn_heldout", False):
        from core.plan import with_heldout_trained

        tc = with_heldout_trained(tc) if args.tune_steps is None else replace(tc, heldout=0)
    return tc


PROGRESS_LINE_S = 10.0
"""Seconds between two progress lines when the output is not a terminal (:class:`ProgressLines`)."""


class ProgressLines:
    """Training progress as plain lines for output that is not a terminal (a log file, a pipe), where
    rich's live bars show nothing until the run ends: a stage's first and last step, a line at most every
    ``every_s`` seconds between them (step, loss, speed, passes, elapsed and the stage's time left at the
    speed so far), and a line when a recall check starts and every ``every_s`` seconds while it runs.

    Args:
        every_s: seconds between two lines (:data:`PROGRESS_LINE_S`).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, every_s: float = PROGRESS_LINE_S, clock=None):
        import time

        self.every_s, self.clock = every_s, clock or time.monotonic
        self.last = -math.inf
        self.first: dict[str, tuple[float, int]] = {}  # stage -> (clock, step) of its first step seen
        self.checking = False

    def _due(self, now: float, force: bool) -> bool:
        if force or now - self.last >= self.every_s:
            self.last = now
            return True
        return False

    def step(self, ev, passes: float) -> str | None:
        """The line for a :class:`core.trainer.StepReport` (``passes``: over the stage's data), or None."""
        from core.plan import format_duration

        now = self.clock()
        self.checking = False
        t0, s0 = self.first.setdefault(ev.stage, (now, ev.step))
        if not self._due(now, ev.step in (s0, ev.total_steps)):
            return None
        left = ""
        if ev.step > s0 and ev.step < ev.total_steps:  # the speed after the first step (which compiles kernels)
            left = f", about {format_duration((now - t0) / (ev.step - s0) * (ev.total_steps - ev.step))} left"
        return (f"{ev.stage} step {ev.step}/{ev.total_steps}: loss {ev.loss:.3f}, {ev.tokens_per_s:,.0f} tok/s, "
                f"{passes:.1f} passes, {format_duration(ev.elapsed_s)} elapsed{left}")

    def check(self, ev) -> str | None:
        """The line for a :class:`core.trainer.RecallProgress`, or None."""
        start = not self.checking
        self.checking = ev.done < ev.total
        if ev.total == 0 or not self._due(self.clock(), start) or (not start and ev.done == ev.total):
            return None
        if start:
            return f"{ev.stage}: checking recall of {count_words(ev.total, 'prompt')}"
        return f"{ev.stage}: checking recall, {ev.done:,} of {ev.total:,} prompts"


def _at_step(stage_index: int, stage_step: int) -> str:
    """" at pretrain step 70" (as the step lines name it), or "" once both stages are done (``stage_index`` 2)."""
    return f" at {STAGES[stage_index]} step {stage_step:,}" if stage_index < len(STAGES) else ""


TRAIN_HOLDER = "opencl-llm train"
"""What ``train`` names itself in the lock of the folder it writes (core.folder_lock)."""

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
"""Signals that stop a training run with a checkpoint: Ctrl-C, and what a logout (SIGHUP) or
``systemctl stop`` / ``kill`` (SIGTERM) sends."""


class _CtrlC:
    """A stop signal during training (:data:`STOP_SIGNALS`: Ctrl-C, SIGTERM, SIGHUP): the first asks the
    run to stop between two steps (or recall prompts), so the checkpoint resumes exactly; a second
    one interrupts at once, except during a save, which is finished first (a checkpoint is never left
    half replaced, and a finished stage never lost).

    Args:
        run: what to stop (core.run.Run, or anything with ``request_stop()``).
    """

    def __init__(self, run):
        self.run, self.count, self.saving, self.pending = run, 0, False, False
        self.saved = False  # a checkpoint was saved by this run
        self.saved_at = ""  # where the last save was: " at pretrain step 70", " at the end of the pretrain stage"
        self.signum = 2  # the first stop signal's number (SIGINT until one comes)

    @property
    def exit_code(self) -> int:
        """The shell's code of a process ended by the first stop signal: 128 + its number (130 Ctrl-C, 143 SIGTERM,
        129 SIGHUP)."""
        return 128 + self.signum

    def __call__(self, signum=None, *_):
        if self.count == 0 and isinstance(signum, int):
            self.signum = signum
        self.count += 1
        self.run.request_stop()
        if self.count >= 2:
            if self.saving:
                self.pending = True
            else:
                raise KeyboardInterrupt

    def save(self, trainer, out: Path, stage_end: bool = False) -> str:
        """Save ``trainer`` to ``out`` (a second signal waits until the save is whole); returns the folder.
        ``stage_end``: the save of a stage's end (core.run.RunHooks.save), for :attr:`saved_at`."""
        from core.checkpoint import save_trainer

        self.saving = True
        try:
            save_trainer(trainer, out)
            self.saved = True
            si = trainer.stage_index
            self.saved_at = (f" at the end of the {STAGES[si - 1]} stage" if stage_end else
                             _at_step(si, trainer.stage_step))
        except OSError as e:  # a full disk, a read-only folder: the previous checkpoint is still whole
            raise OSError(e.errno, f"cannot save the checkpoint to {out}: {e.strerror or e}; the folder keeps "
                          "its previous checkpoint (if any)") from None
        finally:
            self.saving = False
        if self.pending:
            raise KeyboardInterrupt
        return str(out)


def _by_line(problems: list) -> list:
    """A file's skipped entries (core.dataset.Problem) in line order (the reader finds some in an earlier pass)."""
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))


def _load_data(path: str):
    """``train --data``'s dataset and, where entries of the file were skipped, the line that says so again after
    the verdict (the warnings scroll away above a run's lines: a new user's run said it learned everything of a
    file whose half was skipped). Raises ValueError when nothing could be read."""
    from core.dataset import load_dataset

    notes: list[str] = []
    dataset, problems = load_dataset(path, notes, located=True)  # the trainer's warnings name FILE:LINE
    for p in [*notes, *_by_line(problems)]:
        print(f"warning: {p}", file=sys.stderr)
    if not dataset.facts and not dataset.dialogues:
        raise ValueError(f"{path}: no facts or dialogues could be read")
    n = len(problems)
    skipped = (f"{count_words(n, 'entry')} of {path} {'was' if n == 1 else 'were'} skipped and not trained on "
               "(the warnings above the run say which and why)") if n else None
    return dataset, skipped


def _base_config(args):
    """The TrainConfig of ``train --base FILE`` (core.from_base's defaults with the options given)."""
    from core.config import replace
    from core.from_base import default_train_config

    shape = [f"--{n.replace('_', '-')}" for n in ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                                  "rope_theta", "vocab_size") if getattr(args, n) is not None]
    if shape or args.preset:
        raise ValueError(f"{', '.join(shape + (['--preset'] if args.preset else []))}: the --base model fixes "
                         "the architecture and vocabulary")
    tc = default_train_config(args.steps, _lora_lr(args), args.batch_size, grad_accum=args.grad_accum or 1,
                              freeze_embeddings=bool(args.freeze_embeddings),
                              **{k: getattr(args, k) for k in ("seed", "replay_share", "grad_clip", "weight_decay")
                                 if getattr(args, k) is not None})
    stages = {}
    for stage in STAGES:
        steps, lr = getattr(args, f"{stage.flag}_steps"), getattr(args, f"{stage.flag}_lr")
        given = {k: v for k, v in (("steps", steps), ("lr", lr)) if v is not None}
        stages[stage.value] = replace(getattr(tc, stage.value), **given)
    return replace(tc, **stages, **_budget(args))


def _budget(args) -> dict:
    """``--time-budget MIN`` as TrainConfig's ``time_budget_s`` (empty when not given): a fine-tune and a
    resumed run stop at it as an Auto run does (core.trainer; it was ignored there)."""
    return {"time_budget_s": 60.0 * args.time_budget} if args.time_budget is not None else {}


def _lora_lr(args) -> float | None:
    """The default peak lr of ``train --base --lora`` (core.from_base.LORA_LR); None without --lora."""
    from core.from_base import LORA_LR

    return LORA_LR if getattr(args, "lora", False) else None


def _lora_config(args):
    """The LoRAConfig of ``train --base FILE --lora`` (None without --lora); raises ValueError or
    core.lora.LoRAError (one line) for a bad setting."""
    if not args.lora:
        if args.lora_rank is not None or args.lora_alpha is not None or args.lora_targets:
            raise ValueError("--lora-rank, --lora-alpha and --lora-targets need --lora")
        return None
    from core.lora import TARGETS, LoRAConfig, LoRAError

    targets = tuple(t for item in (args.lora_targets or [",".join(TARGETS)]) for t in item.split(",") if t)
    try:
        return LoRAConfig(rank=LoRAConfig.rank if args.lora_rank is None else args.lora_rank,
                          alpha=LoRAConfig.alpha if args.lora_alpha is None else args.lora_alpha, targets=targets)
    except LoRAError as e:  # named as the option that sets it ("lora rank: ..." -> "--lora-rank: ...")
        field, _, problem = str(e).partition(": ")
        raise ValueError(f"--{field.replace(' ', '-')}: {problem}") from None


def _general_questions(args) -> tuple[str, ...] | None:
    """The general questions whose base answers ``train --base`` replays (core/known.py); None with
    --no-general-questions."""
    from core import known

    if args.no_general_questions:
        return None
    return known.GENERAL_QUESTIONS + (known.read_questions(args.general_questions) if args.general_questions
                                      else ())


def _print_lora_memory(dev: Device, mc: ModelConfig, tc: TrainConfig, lora, planned: dict, max_seq: int) -> None:
    """The memory line of a LoRA run (core.model.memory_bytes with the adapters and the base matrices
    ``planned`` in their GGUF formats, core.model.quantized_plan, rows of ``max_seq`` tokens), beside a full
    fine-tune of the same rows; refuses one that does not fit."""
    from core.lora import adapter_params
    from core.model import memory_bytes, memory_problem
    from core.quant_base import device_bytes, member_types

    b = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
    micro = -(-b // tc.grad_accum)
    if planned:
        quant, floats = device_bytes(mc, planned)
        kinds = ", ".join(sorted({q.name for names, qtype in planned.values() for q in member_types(names, qtype)}))
        print(f"base: {len(planned)} block matrices kept in {kinds} on the device ({quant / 2**20:.1f} MiB; "
              f"float32: {4 * floats / 2**20:.1f} MiB)")
    need = memory_bytes(mc, micro, True, lora=lora, quantized=planned, max_seq=max_seq)[0]
    full = memory_bytes(mc, micro, True, max_seq=max_seq)[0]
    print(f"memory: about {need / 2**30:.2f} GiB of {memory_size(dev.global_mem_size)} on the device (LoRA rank "
          f"{lora.rank} on {', '.join(lora.targets)}: {adapter_params(mc, lora):,} trained parameters; batch {micro} "
          f"x rows of up to {max_seq} tokens; a full fine-tune of them needs {full / 2**30:.2f} GiB)")
    problem = memory_problem(mc, micro, dev.global_mem_size, dev.max_alloc_bytes, dev.info.name, lora=lora,
                             quantized=planned, max_seq=max_seq)
    if problem:
        raise ValueError(f"{problem} (or lower --lora-rank)")


def _print_memory(dev: Device, mc: ModelConfig, tc: TrainConfig, max_seq: int | None = None) -> None:
    """The memory line of a full training run (rows of ``max_seq`` tokens, None: the context); refuses one
    that does not fit."""
    from core.estimates import training_memory_bytes, training_memory_problem

    max_seq = mc.context_length if max_seq is None else max_seq
    b = max(tc.pretrain.batch_size, tc.dialogues.batch_size)
    need = training_memory_bytes(mc, b, tc.grad_accum, tc.freeze_embeddings, max_seq=max_seq)
    have = dev.global_mem_size
    print(f"memory: about {need / 2**30:.2f} GiB of {memory_size(have)} on the device "
          f"(batch {b} in {tc.grad_accum} micro-batch{'es' if tc.grad_accum > 1 else ''}, rows of up to "
          f"{max_seq} tokens, context {mc.context_length}{', embeddings frozen' if tc.freeze_embeddings else ''})")
    problem = training_memory_problem(mc, b, tc.grad_accum, tc.freeze_embeddings, have, dev.max_alloc_bytes,
                                      dev.info.name, max_seq=max_seq)
    if problem:
        lighter = training_memory_bytes(mc, b, max(tc.grad_accum, b), True, max_seq=max_seq)
        raise ValueError(f"{problem}; with --freeze-embeddings --grad-accum {b} it needs about "
                         f"{lighter / 2**30:.2f} GiB (or lower --context-length / --batch-size)")


def _print_line(lines: ProgressLines, ev) -> None:
    """Print ``ev``'s progress line, if it has one now (output that is not a terminal)."""
    from core.events import RecallProgress, StepReport

    line = None
    if isinstance(ev, StepReport):
        line = lines.step(ev, ev.passes)
    elif isinstance(ev, RecallProgress):
        line = lines.check(ev)
    if line:
        print(line, flush=True)



def _check_memory(dev: Device, mc: ModelConfig, tc: TrainConfig, lora, planned: dict, max_seq: int) -> None:
    """The memory line before the model is built (core.run.RunHooks.check_memory); refuses what does not fit."""
    if lora is not None:
        _print_lora_memory(dev, mc, tc, lora, planned, max_seq)
    else:
        _print_memory(dev, mc, tc, max_seq)


def cmd_train(args: argparse.Namespace) -> int:
    from core.checkpoint import check_output_folder
    from core.atomic import readable_folder
    from core.checkpoint_meta import is_checkpoint_folder, resume_problem
    from core.folder_lock import FolderBusyError, FolderLock

    # --resume of a folder no run saved into says so, not check_output_folder's advice for --out; a folder a save
    # was cut in (its backup beside it) or with a damaged checkpoint passes, to be recovered or named by the load
    if args.resume and (why := resume_problem(args.resume)):
        return _fail(why)
    # symlinks and ".." resolved once: every later use (lock, save, messages) is of the real folder, and
    # it is ours (or new, or empty) and writable, or refused here, before any training
    out = check_output_folder(args.out or args.resume or DEFAULT_MODEL_DIR)
    if args.resume:
        args.resume = os.path.realpath(args.resume)
    # a trained model is replaced only on request: a second `train` with the same (or the default) --out lost it
    if not args.overwrite and (not args.resume or Path(args.resume) != out) and \
            is_checkpoint_folder(readable_folder(out)):
        return _fail(f"{out}: holds a trained model; continue it with --resume {out}, give --overwrite to replace it, "
                     "or give another --out")
    locks = []
    try:
        for folder in dict.fromkeys([out] + ([Path(args.resume)] if args.resume else [])):
            locks.append(FolderLock(folder, TRAIN_HOLDER if folder == out else
                                    f"{TRAIN_HOLDER}, resuming from it into {out}").acquire())
    except FolderBusyError as e:
        for lk in locks:
            lk.release()
        return _fail(str(e))
    from core.atomic import recover_folder

    for folder in dict.fromkeys([out] + ([Path(args.resume)] if args.resume else [])):
        recover_folder(folder)  # the writer finishes what a cut save left (a finished run is not saved again)
    try:
        return _train(args, out)
    finally:
        for lk in locks:
            lk.release()


def _run_request(args):
    """``train``'s options as a core.run.RunRequest; raises ValueError for options that do not go together
    (a bad setting: "--OPTION: ...", :func:`_setting_error`)."""
    from core.checkpoint import load_checkpoint
    from core.config import ConfigError, ModelConfig
    from core.run import RunRequest

    if args.base and args.resume:
        raise ValueError("--base and --resume: give one (a resumed run already knows its base model)")
    if args.lora and not args.base:
        raise ValueError("--lora needs --base FILE.gguf (the model whose adapters are trained)")
    auto = not args.resume and not args.base and args.preset in (None, "Auto")
    mc = tc = lora = questions = None
    data, args.skipped = _load_data(args.data) if args.data else (None, None)
    try:
        if args.base:
            tc, lora, questions = _base_config(args), _lora_config(args), _general_questions(args)
        elif args.resume:
            from core.dataset import dataset_hash

            saved = load_checkpoint(args.resume).checkpoint
            tc = _resume_config(args, saved.train, data is not None and dataset_hash(data) != saved.dataset_hash)
        elif not auto:
            mc, tc = _configs(args)
    except ConfigError as e:
        raise _setting_error(e, args) from None
    return RunRequest(device=args.device, dataset=data, model_config=mc,
                      train_config=tc, resume=args.resume, allow_new_data=args.allow_new_data, base=args.base,
                      context_length=args.context_length, lora=lora, lora_base=args.lora_base,
                      general_questions=questions, auto=auto,
                      time_budget_s=60.0 * args.time_budget if args.time_budget else 0.0,
                      vocab_size=args.vocab_size or ModelConfig.vocab_size, adjust=_plan_adjust(args),
                      learn_heldout=bool(args.learn_heldout), preset=args.preset, save_at_end=True,
                      resume_in_place=bool(args.resume) and Path(args.resume) == Path(args.out or args.resume).resolve())


def _plan_adjust(args):
    """The options given, applied to the Auto plan's configs (core.run.RunRequest.adjust)."""
    from core.config import ConfigError

    def adjust(mc, tc):
        try:
            return _configs(args, (mc, tc))
        except ConfigError as e:
            raise _setting_error(e, args) from None

    return adjust


_OPTION_OF_FIELD = {"pretrain.steps": "--pretrain-steps", "dialogues.steps": "--tune-steps",
                    "pretrain.lr": "--pretrain-lr", "dialogues.lr": "--tune-lr",
                    "pretrain.batch_size": "--batch-size", "dialogues.batch_size": "--batch-size"}


def _setting_error(e, args) -> ValueError:
    """A bad setting (core.config.ConfigError) as the one-line message of the option that sets it
    ("--batch-size: must be >= 1, got 0"); a field no option of ``args`` sets keeps its own name."""
    option = _OPTION_OF_FIELD.get(e.field) or "--" + e.field.rsplit(".", 1)[-1].replace("_", "-")
    if hasattr(args, option[2:].replace("-", "_")):
        return ValueError(f"{option}: {e.problem}")
    return ValueError(f"invalid setting {e}")


def _print_setup(ev, quiet: bool) -> None:
    """Print an event of a run's setup (core.run.Run.events before RunStarted)."""
    from core.events import LogEvent, Phase

    if isinstance(ev, Phase) and (ev.name == "ask" or (ev.name == "plan" and not quiet)):
        print(ev.text)
    elif isinstance(ev, LogEvent):
        print(("warning: " if ev.level == "WARNING" else "") + ev.message)


def _train(args, out: Path) -> int:
    """``train`` after its folders are locked: the run (core.run.Run) and its lines, bars and exit code; standard
    output through :class:`_LostReader` (a reader that goes away stops the run)."""
    from core.run import Run, RunHooks

    ctrl_c = None
    run = Run(_run_request(args), RunHooks(save=lambda trainer, stage_end: ctrl_c.save(trainer, out, stage_end),
                                           tune=_tune_matmul, check_memory=_check_memory))
    ctrl_c = _CtrlC(run)
    stdout, sys.stdout = sys.stdout, _LostReader(sys.stdout, lambda: ctrl_c(_SIGPIPE))
    try:
        return _train_lines(args, out, run, ctrl_c)
    finally:
        sys.stdout = stdout


def _train_lines(args, out: Path, run, ctrl_c: _CtrlC) -> int:
    """:func:`_train`'s run, its setup lines, then its training (:func:`_follow`) and the last notes."""
    from core.events import RunStarted

    events = run.events()
    for ev in events:
        _print_setup(ev, args.quiet)
        if isinstance(ev, RunStarted):
            break
    more = f"--tune-steps above {run.trainer.train_config.dialogues.steps:,}, the most it was given"
    data = args.data or str(Path(args.resume or "") / "dataset.json")  # the new data: --data, or an edited copy
    if run.trainer.done and run.new_data:  # saving would record a dataset the model was never trained on
        events.close()
        what = f"--data {args.data}" if args.data else f"the changed {data}"
        return _fail(f"{args.resume}: both stages are complete, so {what} would not be trained on; nothing saved (give "
                     f"{more}, to train on it, or start a new run: {_new_run(run.trainer, data)})")
    if run.trainer.done:  # a stage that ended early (learned, time budget) counts as all its steps done
        print(f"nothing left to train in {args.resume}: both stages are complete (give {more}, to continue)")
    code = _follow(args, out, run, events, ctrl_c)
    if code == 0 and run.new_data and run.resumed_at[0] >= 1:  # (a resume within pretraining trains them there)
        print("note: the facts stage was over before this dataset came, so facts new in it are trained only as tuning "
              f"replays facts, and slowly; a new run learns them in its facts stage: {_new_run(run.trainer, data)}")
    return code


def _new_run(trainer, data: str) -> str:
    """The command of a new run on ``data`` of the kind ``trainer``'s is: from its base file, with LoRA adapters of
    its rank where it has them (a fine-tune's new run keeps its base)."""
    import shlex

    base, lora = trainer.base_meta.get("base_model"), trainer.model.lora
    of_base = f" --base {shlex.quote(str(base))}" + (f" --lora --lora-rank {lora.rank}" if lora else "") if base else ""
    return f"opencl-llm train{of_base} --data {shlex.quote(data)} --out NEW_FOLDER"


_SIGPIPE = 13
"""SIGPIPE's number (POSIX; Windows has no such signal): a run whose output's reader went away exits 128 + it, as
a process that SIGPIPE ends does."""


class _LostReader:
    """``sys.stdout`` while ``train`` runs: a write or flush that finds the reader gone (``train ... | head``:
    BrokenPipeError) calls ``on_lost`` once (a stop request, as SIGHUP's for a closed terminal: the run stops after
    the step and saves) and sends the rest to the null device. Every writer (print, rich's console, which would
    otherwise exit 1 on a broken pipe) goes through it. The run was lost: "error: Broken pipe" (exit 2), or exit 1
    from rich, with nothing saved (a new user, then a break-it helper)."""

    def __init__(self, stream, on_lost) -> None:
        self._stream, self._on_lost, self.lost = stream, on_lost, False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        null = os.open(os.devnull, os.O_WRONLY)  # what is still buffered goes nowhere, not to a broken pipe at exit
        try:
            os.dup2(null, self._stream.fileno())
        finally:
            os.close(null)
        self._on_lost()

    def __getattr__(self, name: str):  # isatty, fileno, encoding ...: the stream's
        return getattr(self._stream, name)


def _follow(args, out: Path, run, events, ctrl_c: _CtrlC) -> int:
    """The run's training events as bars or lines, with stop signals caught; then its end (:func:`_finish`)."""
    import signal

    from rich.console import Console

    from core.events import RunDone
    from core.trainer import TrainingDiverged

    stops = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    previous = {sig: signal.signal(sig, ctrl_c) for sig in stops}
    console = Console()  # a terminal gets rich's live bars; a file or a pipe plain lines (ProgressLines)
    console.soft_wrap = not console.is_terminal  # and whole lines, not wrapped at 80 columns
    lines = None if args.quiet or console.is_terminal else ProgressLines()
    done = None
    try:
        with _Bars(console, disabled=args.quiet or lines is not None) as bars:
            for ev in events:
                if isinstance(ev, RunDone):
                    done = ev
                elif lines is not None:
                    _print_line(lines, ev)
                bars.show(ev)
    except KeyboardInterrupt:  # a second Ctrl-C: the step may be half done, so nothing more is saved
        # (it said "the last completed stage" of a stop's save at pretrain step 70: a new user)
        what = f"the checkpoint saved{ctrl_c.saved_at}" if ctrl_c.saved else "its previous checkpoint (if any)"
        print(f"interrupted; {out} keeps {what}" + (f" (continue with: opencl-llm train --resume {out})"
                                                    if ctrl_c.saved else ""))
        return ctrl_c.exit_code
    except TrainingDiverged as e:  # the run saved the last good step's weights
        return _fail(f"{e}; checkpoint saved to {out}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _finish(done, out, bars.recall_stopped, ctrl_c.exit_code, args.skipped)


def _finish(done, out: Path, recall_stopped, stopped_code: int = 130, skipped: str | None = None) -> int:
    """The end of ``train`` (core.events.RunDone, the run saved): a stopped run's message (exit ``stopped_code``:
    128 + the stop signal's number), or "model saved" and the verdict, then ``skipped`` (entries of the file not
    trained on, :func:`_load_data`) as a warning."""
    if recall_stopped is not None and done.finished:  # the last stage's check: a resume finds nothing to train
        print(f"stopped during the final recall check; model saved to {out}, without its verdict (what it learned: "
              f"opencl-llm recall --model {out})")
        return stopped_code
    if recall_stopped is not None:
        print(f"stopped during the recall check; checkpoint of the finished {recall_stopped} stage saved to "
              f"{out} (continue with: opencl-llm train --resume {out})")
        return stopped_code
    if done.stopped:
        if done.checkpoint:
            print(f"stopped{_at_step(done.stage_index, done.stage_step)}; checkpoint saved to {out} (continue with: opencl-llm train --resume {out})")
        elif out.exists():  # a resumed run stopped before its first new step
            print(f"stopped before any step; {out} is as it was (continue with: opencl-llm train --resume {out})")
        else:
            print("stopped before any step; nothing saved")
        return stopped_code
    print(f"model saved to {out}" if done.checkpoint else f"model unchanged in {out}" if out.exists()
          else "no steps to train; nothing saved")  # (a new run of --steps 0 said 'unchanged in' a folder never made)
    if done.verdict:
        print(done.verdict.replace(" — try the model on the Chat tab", ""))
        if done.advice:
            print(f"to learn the rest: {done.advice}")
        if done.general:
            print(done.general)
        if " as text only: " in done.verdict:  # (core.plan.verdict's words)
            print(f"the facts learned as text only: opencl-llm recall --model {out} --text-only")
    if skipped:
        print(f"warning: {skipped}", file=sys.stderr)
    return 0


class _Bars:
    """rich's live bars of a run: one per stage (steps, passes, loss, speed), one per recall check; the
    log lines above them. ``recall_stopped``: the stage whose recall check a stop cut short (or None)."""

    def __init__(self, console, disabled: bool):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        # one text column for what a row has (a stage's passes, loss and speed; a check's "checking recall…"): an
        # 80-column terminal cut the times and shrank the bar to one cell while the check's row carried '- tok/s'
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn()]
        self.progress = Progress(*columns, console=console, disable=disabled)
        self.tasks, self.check_task, self.recall_stopped = {}, None, None

    def __enter__(self) -> _Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def show(self, ev) -> None:
        """Show one event of the run (core.events)."""
        from core.events import LogEvent, RecallProgress, StageReport, StepReport

        if isinstance(ev, StepReport):
            self._step(ev)
        elif isinstance(ev, RecallProgress):
            self._check(ev)
        elif isinstance(ev, LogEvent):
            self.progress.console.print(("warning: " if ev.level == "WARNING" else "") + ev.message)
        elif isinstance(ev, StageReport) and ev.recall_stopped:
            self.recall_stopped = ev.stage
        elif isinstance(ev, StageReport) and not ev.stopped and ev.recall and ev.end_reason != "steps":
            why = STAGE_LEARNED.get(ev.stage, ev.end_reason) if ev.end_reason == "learned" else ev.end_reason
            self.progress.console.print(f"{ev.stage}: ended after {count_words(ev.steps_done, 'step')} ({why})")
            if ev.stage in self.tasks:  # a stage over before its most steps: its bar full, nothing "left"
                self.progress.update(self.tasks[ev.stage], total=ev.steps_done, completed=ev.steps_done)

    def _step(self, ev) -> None:
        if self.check_task is not None:
            self.progress.remove_task(self.check_task)
            self.check_task = None
        if ev.stage not in self.tasks:
            self.tasks[ev.stage] = self.progress.add_task(str(ev.stage), total=ev.total_steps, info="")
        self.progress.update(self.tasks[ev.stage], completed=ev.step,
                             info=f"{ev.passes:.1f} passes  loss {ev.loss:.3f}  {ev.tokens_per_s:,.0f} tok/s")

    def _check(self, ev) -> None:
        if self.check_task is None:
            self.check_task = self.progress.add_task(str(ev.stage), total=max(ev.total, 1), info="checking recall…")
        self.progress.update(self.check_task, completed=ev.done, total=max(ev.total, 1))  # a new check: its own total
        if ev.final and ev.done == ev.total:
            self.progress.remove_task(self.check_task)
            self.check_task = None


# ----------------------------------------------------------------------------- chat
def _unfinished(loaded) -> str | None:
    """A note for chat and export of a checkpoint whose run stopped before both stages ended (Ctrl-C, a stop, a save
    between stages), naming where and how to continue it, or of one that another process is training now; None for a
    finished run or another kind of file."""
    from core.folder_lock import live_holder, lock_path

    meta = loaded.checkpoint
    if meta is None:
        return None
    # a train writing into the folder itself holds it as TRAIN_HOLDER (an app holds its project, above it; a train
    # resuming from the folder into another holds it by another name)
    holder = live_holder(loaded.path)
    if holder is not None and holder.pid and holder.path == lock_path(loaded.path) and holder.what == TRAIN_HOLDER:
        return (f"note: {loaded.path} is being trained now by {holder.describe()}; this is its last save"
                f"{_at_step(meta.stage_index, meta.stage_step)}, "
                "so its answers may change once the run saves again")  # (it said "continue it" of a running run)
    if meta.done:
        return None
    stage = ("pretrain", "tune")[meta.stage_index]
    steps = (meta.train.pretrain, meta.train.dialogues)[meta.stage_index].steps
    return (f"note: {loaded.path} is a run that stopped in its {stage} stage at step {meta.stage_step:,} of "
            f"{steps:,}, so its answers may be poor; continue it: opencl-llm train --resume {loaded.path}")


def cmd_chat(args: argparse.Namespace) -> int:
    from core.chat import ChatSession
    from core.checkpoint import load_model
    from core.device import open_device
    from core.generate import ContextFullError, Generator, SamplingSettings

    loaded = load_model(args.model)
    if note := _unfinished(loaded):
        print(note, file=sys.stderr)  # (stdout: only answers, for a pipe)
    dev = open_device(args.device)
    _tune_matmul(dev)
    gen = Generator.for_model(dev, loaded)
    session = ChatSession(gen, loaded.tokenizer, system=args.system)
    settings = SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                repetition_penalty=args.repetition_penalty, max_tokens=args.max_tokens,
                                seed=args.seed)
    if args.prompt is not None:
        print(session.answer(args.prompt, settings))
        return 0
    # piped input (``echo -e "hi\nwho are you" | opencl-llm chat``): one answer line per input line and
    # nothing else on stdout; input()'s prompts and the banner are for a person at a terminal only
    interactive = sys.stdin.isatty()
    if interactive:
        print("Chat with the model. An empty line, /exit or Ctrl-D quits; /clear forgets the conversation.")
    while True:
        try:
            line = input("User: ") if interactive else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not interactive and not line:  # end of the input
            return 0
        line = line.strip()
        if not line and not interactive:  # a blank line between piped messages is skipped
            continue
        if not line or line in ("/exit", "/quit"):
            return 0
        if line == "/clear":
            session.clear()
            if interactive:
                print("(the conversation is forgotten; the next message starts a new one)")
            continue
        if interactive:
            print("Assistant:", end="", flush=True)
        answer = ""
        try:
            for piece in session.ask(line, settings):
                # the chat format puts a space after "Assistant:"; an answer line starts without it
                text = piece.text if answer or interactive else piece.text.lstrip()
                answer += text
                print(text, end="", flush=True)
        except (ContextFullError, ValueError, FloatingPointError) as e:  # one bad message does not end the chat
            print(f" [{e}]" if answer or interactive else f"[{e}]", end="")
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()


# ----------------------------------------------------------------------------- recall
def cmd_recall(args: argparse.Namespace) -> int:
    """Which facts and dialogue answers of a dataset file a model reproduces (greedy, batched on the
    device, core.recall): e.g. questions held out of training. A checkpoint folder's own dataset (no ``--data``):
    also the questions its run wrote for facts, trained and held out (core.batches.Batches, its run's data mix),
    as the run's checks asked them."""
    from core.checkpoint import load_model
    from core.checkpoint_meta import DATASET_FILE
    from core.dataset import load_dataset
    from core.device import open_device
    from core.model import Model
    from core.plan import KIND_NOUN
    from core.recall import recall_check, sampled, tally

    loaded = load_model(args.model)
    if args.text_only:
        return _text_only(loaded, args)
    own = args.data is None
    if own:  # a checkpoint folder: the dataset it was trained on
        args.data = _own_dataset(loaded)
        if args.data is None:
            return _fail(f"{args.model}: has no dataset of its own (a checkpoint folder keeps the one it was trained "
                         "on); give the dataset to check with --data FILE")
        general = (" with the base model's replayed answers to the general questions, checked as dialogues"
                   if loaded.meta.get("base_model") else "")  # a fine-tune's dataset.json holds them (core.known)
        print(f"checking the dataset it was trained on ({Path(args.model) / DATASET_FILE}){general}")
    notes: list[str] = []
    dataset, problems = load_dataset(args.data, notes)
    for p in [*notes, *_by_line(problems)]:
        print(f"warning: {p}", file=sys.stderr)
    if not any(dataset.trained_counts()):  # (printed nothing and exited 0)
        return _fail(f"{args.data}: no facts or dialogues with text could be read, so there is nothing to check")
    dev = open_device(args.device)
    _tune_matmul(dev)
    model = Model(dev, loaded.config, batch_size=16, weights=loaded.weights, training=False)
    kinds = tuple(k for k in ("fact", "dialogue") if getattr(dataset, k + "s"))
    # its own dataset: also the questions its run wrote for facts, trained and held out (as its checks asked them)
    mix, changed = _run_mix(loaded, dataset, args.data) if own else (None, None)
    if changed:
        print(f"warning: {changed}; they are not asked", file=sys.stderr)
    questions, heldout = (mix.question_pairs, mix.heldout_pairs) if mix else ((), ())
    kinds += ("question",) * bool(questions) + ("heldout",) * bool(heldout)
    items, sizes, left_out = [], {}, {}
    for _done, _total, items in recall_check(model, loaded.tokenizer, dataset, kinds, sizes=sizes, left_out=left_out,
                                             questions=questions, heldout=heldout):
        pass
    of_all = sampled(sizes, items)
    if args.show_wrong:
        for r in items:
            if not r.ok:
                print(f"[{r.kind} {r.index + 1}] {r.prompt!r}: got {r.got!r}, expected {r.expected!r}")
    for k in ("dialogue", "fact", "question", "heldout"):
        ok, n, noun = *tally(items, k), KIND_NOUN[k]
        why = left_out.get(k)  # what the check could not ask (too long for the model's context, one word)
        skipped = f"; not checked: {', '.join(f'{c:,} {reason}' for reason, c in why.items())}" if why else ""
        if n:
            some = f" (a sample: {n:,} of {of_all[k][1]:,} checked)" if k in of_all else ""
            print(f"{ok:,} of {n:,} {noun} ({100 * ok / n:.1f} %){some}{skipped}")
        elif why:
            print(f"0 {noun} checked{skipped}")
    return 0


def _own_dataset(loaded) -> Path | None:
    """The dataset.json a checkpoint folder keeps (the one its run trained on); None for other models or without one."""
    from core.checkpoint_meta import DATASET_FILE

    own = loaded.path / DATASET_FILE if loaded.checkpoint is not None else None
    return own if own is not None and own.is_file() else None


def _run_mix(loaded, dataset, path) -> tuple[Batches | None, str | None]:
    """The data mix of ``loaded``'s run (core.batches.Batches: the questions it wrote for facts, the facts it learned as
    text only) rebuilt from ``dataset``, its folder's dataset.json read from ``path``; ``(None, why)`` when that file
    changed after the run (its hash is not config.json's dataset_hash): questions rebuilt from it would be ones the
    run never wrote."""
    from core.batches import Batches
    from core.dataset import dataset_hash

    trained = loaded.checkpoint.dataset_hash
    if trained and dataset_hash(dataset) != trained:
        return None, (f"{path}: changed since the run trained on it (its hash is not config.json's dataset_hash), "
                      "so the questions the run wrote for facts cannot be told from it")
    return Batches(loaded.tokenizer, dataset, loaded.config.context_length, loaded.checkpoint.train), None


def _text_only(loaded, args) -> int:
    """``recall --text-only``: the facts of ``loaded``'s own dataset that its run learned as text only
    (core.batches.Batches.unasked, in the run's data mix: what its questions line and verdict count)."""
    from core.dataset import load_dataset

    if args.data is not None or args.show_wrong:
        return _fail("--text-only lists the facts of the dataset the run was trained on: give it without --data "
                     "and --show-wrong")
    own = _own_dataset(loaded)
    if own is None:
        return _fail(f"{args.model}: --text-only needs a checkpoint folder (its dataset and its run's data mix say "
                     "which questions were written)")
    dataset, _ = load_dataset(own)
    mix, changed = _run_mix(loaded, dataset, own)
    if changed:
        return _fail(f"{changed}, nor which facts it learned as text only")
    unasked = mix.unasked
    n = dataset.trained_counts()[0]
    if not unasked:
        print(f"none of its {count_words(n, 'fact')} was learned as text only: a dialogue or a written question asks "
              f"about {'it' if n == 1 else 'each'}")
        return 0
    them = "it" if len(unasked) == 1 else "them"
    print(f"{len(unasked):,} of {count_words(n, 'fact')} learned as text only (no dialogue or written question asks "
          f"about {them}, so the model may not answer questions about {them}):")
    for i in unasked:
        print(f"[fact {i + 1}] {' '.join(dataset.facts[i].split())}")
    return 0


# ----------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from core.checkpoint import load_model
    from core.checkpoint_meta import export_target
    from core.gguf_io import export_gguf, gguf_path

    if why := _out_problem(args.out):
        return _fail(why)
    if args.adapter:
        return _export_adapter(args)
    if args.format == "hf":
        from core.hf_io import FILES as HF_FILES
        from core.hf_io import export_hf

        if args.dtype not in (None, "f32") or args.modelfile:
            return _fail("--format hf writes float32 weights only; --dtype and --modelfile are for GGUF")
        with export_target(args.out) as target:  # held from the check to the end: the check still holds then
            if why := _existing_folder(target, args, HF_FILES):
                return _fail(why)
            loaded = load_model(args.model)
            folder = export_hf(loaded, target)
        if note := _unfinished(loaded):
            print(note)
        print(f"wrote {folder} (Hugging Face LlamaForCausalLM folder, float32; see docs/scale-out.md)")
        return 0
    chosen, args.dtype = args.dtype, args.dtype or "f32"
    out = Path(args.out)
    # a folder: <model name>.gguf inside it; else the file export_gguf writes (".gguf" added when missing)
    out = out / (Path(args.model).resolve().stem + ".gguf") if out.is_dir() else gguf_path(out)
    # held from the check to the end of the export
    with export_target(out, base=_base_file(args.model), modelfile=args.modelfile):
        if why := _existing_exports(out, args):
            return _fail(why)
        loaded = load_model(args.model)
        earlier = _gguf_file_type(out)  # with --overwrite: what the replaced export was
        modelfile_before = out.with_name(out.stem + ".Modelfile")
        modelfile_before = modelfile_before.read_bytes() if args.modelfile and modelfile_before.is_file() else None
        result = export_gguf(loaded, out, dtype=args.dtype, modelfile=args.modelfile)
    for note in getattr(result, "notes", []) or []:
        print(f"note: {note}")
    if note := _unfinished(loaded):
        print(note)
    replaced = f"; replaced the earlier {earlier} export" if earlier else ""
    print(f"wrote {result.path} ({result.size_bytes / 1e6:.2f} MB, {args.dtype}{replaced})")
    if chosen is None and result.size_bytes > BIG_EXPORT_BYTES:  # the exact default of a model to share: the choice
        print(f"note: f32 is exact; --dtype q8_0 writes about {result.size_bytes * 0.27 / 1e6:.0f} MB (slightly less "
              "exact), q4_0 about an eighth")
    if result.modelfile:
        import shlex

        from core.gguf_io import ollama_name

        changed = modelfile_before is not None and modelfile_before != result.modelfile.read_bytes()
        print(f"wrote {result.modelfile} (ollama create {ollama_name(result.path)} -f "
              f"{shlex.quote(str(result.modelfile))}" + ("; replaced the earlier one, which differed: edits to it "
                                                         "are gone" if changed else "") + ")")
    return 0


STAGE_LEARNED = {"pretrain": "facts learned",
                 "dialogues": "answers learned, and the facts the facts stage left learned kept"}
"""What a stage's "learned" end means, as the line a stage ended early prints it: tuning ends once its answers are
learned and the facts pretraining reproduced are kept (core.trainer), which is not every fact when pretraining was
short (a new user read "dialogues: ended after 25 steps (learned)" before "Not fully learned: ... 9 of 35 facts")."""

BIG_EXPORT_BYTES = 100e6
"""An F32 export by default larger than this gets a note on --dtype (SmolLM2-135M: 540 MB, its Q8_0 145 MB)."""


def _out_problem(out: str) -> str | None:
    """``export --out``'s refusal of a name that means no file: empty, or a folder ("exports/", "exports/.") that
    does not exist (it wrote exports.gguf); None when it is fine."""
    if not out.strip():
        return "--out: empty; give a file or folder name"
    folder_meant = out.endswith(("/", "\\")) or Path(out).name in (".", "..") or out.endswith(("/.", "\\."))
    if folder_meant and not Path(out).is_dir():
        return f"{out}: folder does not exist; create it first, or give a file name"
    return None


def _base_file(model: str) -> str | None:
    """The base file a fine-tuned checkpoint ``model`` reads (its config.json's ``base.base_model``), so an export
    over it is refused before the model is loaded; None where there is none or it cannot be read now (the load
    then says why)."""
    from core.checkpoint_meta import CheckpointMeta

    try:
        return (CheckpointMeta.read(model).base or {}).get("base_model") if Path(model).is_dir() else None
    except (ValueError, OSError):  # core.checkpoint_meta.CheckpointError is one
        return None


def _existing_exports(target: Path, args: argparse.Namespace) -> str | None:
    """``export``'s refusal to replace a file that exists (``target``, the .gguf file the export writes, and its
    Modelfile with --modelfile) unless
    ``--overwrite``: a user's earlier export, or a Modelfile they edited, is theirs. A file this app did not write
    is refused even then (core.checkpoint_meta.check_export_target). None when nothing would be replaced."""
    if args.overwrite:
        return None
    targets = [target] + ([target.with_name(target.stem + ".Modelfile")] if args.modelfile else [])
    found = [p for p in targets if p.is_file()]
    if not found:
        return None
    what = " and ".join(str(p) for p in found)
    return (f"{what}: {'exists' if len(found) == 1 else 'exist'}; give --overwrite to replace "
            f"{'it' if len(found) == 1 else 'them'}, or another --out")


def _existing_folder(folder: Path, args: argparse.Namespace, files: tuple[str, ...]) -> str | None:
    """``export --format hf``'s refusal to replace an earlier export (a folder holding only ``files``, what
    such an export writes) unless ``--overwrite``, as :func:`_existing_exports`. A folder with other files is
    refused by the export itself (core.hf_io, core.lora_io), with --overwrite too."""
    from core.atomic import is_mark

    if args.overwrite or not folder.is_dir() or not (names := {p.name for p in folder.iterdir() if not is_mark(p)}) \
            or names - set(files):
        return None
    return f"{folder}: holds an earlier export; give --overwrite to replace it, or another --out"


def _gguf_file_type(path: Path) -> str | None:
    """What an existing GGUF file at ``path`` holds, as "q8_0" or "f32" (its ``general.file_type``, llama.cpp's
    ``llama_ftype``), "GGUF" when it has none; None when there is no file there."""
    if not path.is_file():
        return None
    try:
        import gguf

        field = gguf.GGUFReader(path).get_field(gguf.Keys.General.FILE_TYPE)
        return gguf.LlamaFileType(int(field.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    except Exception:  # unreadable or without a file type: export_gguf decides whether it may be replaced
        return "GGUF"


def _export_adapter(args: argparse.Namespace) -> int:
    """``export --adapter``: a LoRA checkpoint's adapters as llama.cpp's adapter GGUF (with --modelfile an
    Ollama Modelfile: FROM the base, ADAPTER the file), or with --format hf as a PEFT folder."""
    from core.checkpoint import load_model
    from core.checkpoint_meta import export_target
    from core.gguf_io import gguf_path
    from core.lora_io import PEFT_CONFIG, PEFT_WEIGHTS, adapter_beside, export_adapter_gguf, export_peft

    if args.dtype not in (None, "f32"):
        return _fail("--adapter writes float32 adapters; --dtype is for the merged export")
    if args.format != "hf" and Path(args.out).is_dir():  # a folder: <model name>-lora.gguf inside it (as the
        args.out = str(adapter_beside(Path(args.out) / f"{Path(args.model).resolve().stem}.gguf"))  # merged export)
    target = args.out if args.format == "hf" else gguf_path(args.out)  # the folder or file it writes
    with export_target(target, base=_base_file(args.model), modelfile=args.modelfile and args.format != "hf") \
            as resolved:  # held from the check to the end of the export
        if args.format != "hf" and (why := _existing_exports(Path(target), args)):
            return _fail(why)
        if args.format == "hf" and (why := _existing_folder(resolved, args, (PEFT_CONFIG, PEFT_WEIGHTS))):
            return _fail(why)
        loaded = load_model(args.model)
        if note := _unfinished(loaded):
            print(note)
        if args.format == "hf":
            folder = export_peft(loaded, resolved)
            print(f"wrote {folder} (PEFT LoRA adapter for the --format hf export of the base model)")
            return 0
        path, mf = export_adapter_gguf(loaded, target, modelfile=args.modelfile)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, LoRA adapter rank {loaded.lora.rank}; llama.cpp: "
          f"--lora {path.name} on {loaded.meta['base_model']})")
    if mf:
        print(f"wrote {mf}")
    return 0


# ----------------------------------------------------------------------------- compare
def cmd_compare(args: argparse.Namespace) -> int:
    """Greedy answers of a base model and a model fine-tuned from it, side by side."""
    from core.checkpoint import load_model
    from core.device import open_device
    from core.from_base import before_after

    tuned = load_model(args.model)
    base_path = args.base or (tuned.meta or {}).get("base_model")
    if not base_path:
        return _fail(f"{args.model}: not fine-tuned from a base model; give --base")
    base = load_model(base_path)
    if base.config.param_shapes() != tuned.config.param_shapes():
        return _fail(f"{base_path} and {args.model} have different architectures")
    from core.checkpoint_meta import dataset_path
    from core.dataset import Dataset, load_dataset

    dataset = Dataset()
    if args.data:
        dataset, _ = load_dataset(args.data)
    elif dataset_path(args.model).is_file():
        dataset, _ = load_dataset(dataset_path(args.model))
    dev = open_device(args.device)
    for kind, q, want, before, after in before_after(dev, base.weights, tuned.weights, tuned.config,
                                                     tuned.tokenizer, dataset, max_tokens=args.max_tokens):
        print(f"[{kind}] {q}" + (f"  (taught: {want})" if want else ""))
        print(f"  before: {before}")
        print(f"  after:  {after}")
    return 0


# ----------------------------------------------------------------------------- tokenize
def cmd_tokenize(args: argparse.Namespace) -> int:
    """Print the token ids of a text, one per line (llama.cpp's llama-tokenize defaults: the model's
    BOS/EOS rule applies and special-token text is parsed)."""
    if args.file is not None:
        try:
            text = Path(args.file).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            return _fail(f"{args.file}: not UTF-8 text ({e})")
    elif args.text is not None:
        text = args.text
    else:
        return _fail("give the TEXT to tokenize or --file FILE")
    model = Path(args.model)
    if model.is_file() and model.suffix.lower() == ".gguf":
        from core.gguf_import import read_vocab
        from core.gguf_tokenizer import GGUFTokenizer

        tok = GGUFTokenizer(read_vocab(model), str(model))
        ids = tok.encode(text, parse_special=not args.no_parse_special, add_special=not args.no_bos)
    else:
        from core.checkpoint import load_model

        tok = load_model(model).tokenizer
        if hasattr(tok, "add_bos"):  # a checkpoint fine-tuned from a GGUF keeps that file's tokenizer
            ids = tok.encode(text, parse_special=not args.no_parse_special, add_special=not args.no_bos)
        else:  # our own models: texts start with BOS (the GGUF export says add_bos_token true)
            ids = ([] if args.no_bos else [tok.bos_id]) + tok.encode(text, parse_special=not args.no_parse_special)
    sys.stdout.write("".join(f"{i}\n" for i in ids))
    return 0


# ----------------------------------------------------------------------------- main
def finite_float(text: str) -> float:
    """argparse type of every float flag: a finite number (argparse names the flag in its error).

    Raises:
        argparse.ArgumentTypeError: not a number, or NaN / infinite (``--repetition-penalty nan`` was
            accepted and answered nothing).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def non_negative_int(text: str) -> int:
    """argparse type of ``--seed`` and ``--top-k``: an integer 0 or more.

    Raises:
        argparse.ArgumentTypeError: not an integer, or negative.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


PRESET_NAMES = ("Auto", "Tiny", "Small", "Larger")


def _preset_name(text: str) -> str:
    """``--preset``'s value in any case ("tiny" is Tiny); argparse's choices check the rest."""
    return next((p for p in PRESET_NAMES if p.lower() == text.lower()), text)


def build_parser() -> argparse.ArgumentParser:
    """The ``opencl-llm`` parser: one sub-parser per command (``_add_<command>``)."""
    p = argparse.ArgumentParser(prog="opencl-llm", description="Train, chat with and export small llama-style "
                                "language models on any OpenCL device.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_devices, _add_train, _add_chat, _add_recall, _add_export, _add_compare, _add_tokenize):
        add(sub)
    return p


def _unknown_options(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit (2) with ``command``'s usage and "unrecognized arguments: --lora-rnak 8 (did you mean
    --lora-rank?)": argparse's own message came from the top-level parser, with its usage of the commands."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    hints = [m[0] for u in unknown if u.startswith("--")
             for m in [difflib.get_close_matches(u.split("=", 1)[0], known, n=1, cutoff=0.6)] if m]
    if {"-v", "--verbose"} & set(unknown):
        hints.append(f"opencl-llm -v {command} ... (-v goes before the command)")
    sub.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


def _add_devices(sub) -> None:
    """``devices``: list the OpenCL devices."""
    s = sub.add_parser("devices", help="list OpenCL devices", description="List every OpenCL device, preferred first.")
    s.set_defaults(func=cmd_devices)


def _add_train(sub) -> None:
    """``train``: its run options (the fine-tune's in :func:`_add_finetune_options`)."""
    s = sub.add_parser("train", help="train a model", description="Train a model from scratch: pretrain on facts, "
                       "then tune on dialogues. Uses the built-in default dataset when --data is not given.")
    s.add_argument("--data", help="dataset file: the app's .json, plain text, or chat .jsonl")
    s.add_argument("--device", help="device index or name (see `opencl-llm devices`); default: the best found")
    s.add_argument("--out", help=f"checkpoint folder to write (default: the --resume folder, else {DEFAULT_MODEL_DIR})")
    s.add_argument("--resume", metavar="DIR", help="continue training a checkpoint folder exactly where it stopped; "
                   "steps, lr, batch size, clipping, weight decay and replay share may be changed, the model and "
                   "dataset may not")
    s.add_argument("--overwrite", action="store_true", help="replace the model saved in --out (without it a folder "
                   "holding a trained model is refused, unless it is the --resume folder)")
    s.add_argument("--allow-new-data", action="store_true", help="with --resume: continue on a dataset other than "
                   "the one the run was trained on (--data, or an edited dataset.json); the checkpoint records it")
    s.add_argument("--preset", choices=PRESET_NAMES, type=_preset_name, help="model and training preset (default: "
                   "Auto: a model size and passes planned from the dataset and this device's measured speed, "
                   "trained until every answer and fact is learned)")
    s.add_argument("--time-budget", type=finite_float, metavar="MIN", help="stop training after this many minutes "
                   "(recall checks included); Auto plans the steps to fit")
    for name, typ in (("d-model", int), ("n-layers", int), ("n-heads", int), ("n-kv-heads", int), ("ffn-dim", int),
                      ("context-length", int), ("rope-theta", finite_float), ("pretrain-steps", int),
                      ("tune-steps", int), ("pretrain-lr", finite_float), ("tune-lr", finite_float),
                      ("batch-size", int), ("seed", non_negative_int), ("replay-share", finite_float),
                      ("grad-clip", finite_float), ("weight-decay", finite_float), ("vocab-size", int)):
        s.add_argument(f"--{name}", type=typ, help=f"override the preset's {name.replace('-', '_')}")
    _add_finetune_options(s)
    s.add_argument("--learn-heldout", action="store_true", help="also train the questions the Auto plan keeps out "
                   "to measure answers about facts without a dialogue (with --resume: tuning goes on to learn them)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_train)


def _add_finetune_options(s: argparse.ArgumentParser) -> None:
    """``train``'s options of a fine-tune: --base, --steps, --grad-accum, --freeze-embeddings, LoRA, the general
    questions."""
    from core.from_base import DEFAULTS as FT

    s.add_argument("--base", metavar="FILE.gguf", help="fine-tune this model (a llama GGUF file, e.g. SmolLM2, or a "
                   "checkpoint folder) instead of training from scratch: facts as plain text, dialogues in its "
                   f"chat template; defaults: {FT['steps']} steps per stage, lr {FT['lr']:g}, "
                   f"batch {FT['batch_size']}, context {FT['context_length']}")
    s.add_argument("--steps", type=int, help="steps of each stage (--pretrain-steps / --tune-steps override)")
    s.add_argument("--grad-accum", type=int, help="split each batch into N micro-batches (less memory, same step)")
    s.add_argument("--freeze-embeddings", action="store_true", help="do not train the token embeddings "
                   "(saves three copies of them: for large vocabularies on small devices)")
    s.add_argument("--lora", action="store_true", help="with --base: train LoRA adapters (Hu et al. 2021) on the "
                   "frozen base instead of every weight (less memory; the checkpoint holds only the adapters)")
    s.add_argument("--lora-rank", type=int, help="rank of every adapter (default 16)")
    s.add_argument("--lora-base", choices=("gguf", "f32"), default="gguf", help="with --lora: keep the base "
                   "file's quantized (and F16/BF16) block matrices in their GGUF formats on the device (gguf, "
                   "the default: less memory) or dequantized to float32 (f32)")
    s.add_argument("--lora-alpha", type=finite_float, help="adapter scale alpha / rank (default alpha 32)")
    s.add_argument("--lora-targets", nargs="+", metavar="NAME", help="layers with adapters (default all: attn_q "
                   "attn_k attn_v attn_output ffn_gate ffn_up ffn_down; commas also separate)")
    s.add_argument("--general-questions", metavar="FILE", help="with --base: more general questions (one per line) "
                   "whose base answers are replayed and checked beside the built-in ten")
    s.add_argument("--no-general-questions", action="store_true", help="with --base: do not replay the base "
                   "model's answers to general questions")


def _add_chat(sub) -> None:
    """``chat``: the model and its sampling settings."""
    s = sub.add_parser("chat", help="chat with a trained model", description="Chat with a checkpoint folder, a .gguf "
                       "file or a Hugging Face folder. With --prompt, print one answer and exit.")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder, .gguf or Hugging Face folder "
                   f"(default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--prompt", help="one message to answer")
    s.add_argument("--system", help="system message")
    s.add_argument("--device", help="device index or name")
    s.add_argument("--temperature", type=finite_float, default=0.0, help="randomness; 0 = always the most likely token "
                   "(greedy, the default)")
    s.add_argument("--top-k", type=non_negative_int, default=0, help="sample only from the k most likely tokens (0 = all)")
    s.add_argument("--top-p", type=finite_float, default=1.0, help="sample only from the most likely tokens whose "
                   "probabilities add up to p (1 = all)")
    s.add_argument("--repetition-penalty", type=finite_float, default=1.0, help="> 1 makes tokens already in the "
                   "conversation less likely (1 = off)")
    s.add_argument("--max-tokens", type=int, default=64, help="longest answer in tokens (default 64)")
    s.add_argument("--seed", type=non_negative_int, default=0, help="seed of the sampler (same seed, same answer)")
    s.set_defaults(func=cmd_chat)


def _add_recall(sub) -> None:
    """``recall``: a model against a dataset's answers."""
    s = sub.add_parser("recall", help="check which answers and facts of a dataset a model reproduces",
                       description="Greedy answers of a model to every dialogue question (and fact) of a dataset "
                       "file, compared with the dataset's answers word for word: e.g. questions held out of "
                       "training. A checkpoint folder without --data: its own dataset, with the questions its run "
                       "wrote for facts (trained and held out).")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder, .gguf or Hugging Face folder "
                   f"(default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--data", help="dataset file whose dialogues (and facts) to check (default: a checkpoint "
                   "folder's own, the dataset it was trained on, and the questions its run wrote for facts)")
    s.add_argument("--device", help="device index or name")
    s.add_argument("--show-wrong", action="store_true", help="print each wrong answer")
    s.add_argument("--text-only", action="store_true", help="list the facts the run learned as text only (no dialogue "
                   "or written question asks about them, so the model may not answer questions about them) and stop")
    s.set_defaults(func=cmd_recall)


def _add_export(sub) -> None:
    """``export``: GGUF or a Hugging Face folder."""
    s = sub.add_parser("export", help="export a GGUF file or a Hugging Face folder", description="Export a model "
                       "to GGUF for llama.cpp, Ollama and LM Studio, or (--format hf) to a Hugging Face "
                       "transformers folder for training at scale (docs/scale-out.md).")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder, .gguf or Hugging Face folder "
                   f"(default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--format", default="gguf", choices=["gguf", "hf"], help="gguf: one .gguf file (default); hf: "
                   "a transformers LlamaForCausalLM folder (config.json, model.safetensors, tokenizer)")
    s.add_argument("--out", required=True, help="the .gguf file to write (or a folder to write it into); with "
                   "--format hf, the folder to write")
    s.add_argument("--dtype", default=None, choices=["f32", "f16", "q8_0", "q4_0"], help="GGUF only. f32: exact "
                   "(default); f16: half the size; q8_0: about a quarter, slightly less exact; q4_0: about an "
                   "eighth, noticeably less exact")
    s.add_argument("--modelfile", action="store_true", help="also write an Ollama Modelfile next to it")
    s.add_argument("--overwrite", action="store_true", help="replace an earlier export of this app at --out (and "
                   "its Modelfile); a file the app did not write is never replaced")
    s.add_argument("--adapter", action="store_true", help="a LoRA run (train --lora): write only its adapter, as "
                   "llama.cpp's adapter GGUF (--modelfile: FROM the base, ADAPTER the file), or with --format hf "
                   "a PEFT folder; without --adapter the base with the adapter merged in is exported")
    s.set_defaults(func=cmd_export)


def _add_compare(sub) -> None:
    """``compare``: base and fine-tuned answers side by side."""
    s = sub.add_parser("compare", help="base vs fine-tuned answers", description="Greedy answers of the base "
                       "model and the fine-tuned one to every dataset question and a few general ones.")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help="the fine-tuned checkpoint folder or .gguf")
    s.add_argument("--base", help="the base model (default: the one the checkpoint was fine-tuned from)")
    s.add_argument("--data", help="dataset whose questions to ask (default: the checkpoint's)")
    s.add_argument("--device", help="device index or name")
    s.add_argument("--max-tokens", type=int, default=48, help="longest answer in tokens")
    s.set_defaults(func=cmd_compare)


def _add_tokenize(sub) -> None:
    """``tokenize``: a text's token ids."""
    s = sub.add_parser("tokenize", help="print the token ids of a text", description="Print the token ids of a "
                       "text, one per line, as llama.cpp tokenizes it for the model (BOS/EOS as the model says, "
                       "special-token text parsed).")
    s.add_argument("text", nargs="?", help="the text (or use --file)")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder or .gguf (default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--file", help="read the text from this UTF-8 file")
    s.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS even if the model asks for them")
    s.add_argument("--no-parse-special", action="store_true", help="tokenize special-token text as plain text")
    s.set_defaults(func=cmd_tokenize)

def _interrupt_raises() -> list:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt as by default, and is remembered in the returned list: a driver
    compiling kernels when it comes (PoCL renaming its cache files) fails with a build error that names no
    interruption (a review helper's Ctrl-C half a second into ``train --resume``), which :func:`main` then reports
    as the interruption. System calls are still interrupted (a piped chat waiting for input stops at once).
    ``train`` installs its own handler for the training itself."""
    import signal

    seen: list = []

    def handler(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (an embedding program): its handlers stay
        pass
    return seen


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``opencl-llm``; returns the process exit code."""
    import signal

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage and a likely meant option, not the top level's list of commands
        _unknown_options(parser, args.command, unknown)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    previous = signal.getsignal(signal.SIGINT)
    try:
        return _command(args, _interrupt_raises())
    except KeyboardInterrupt:  # also one that came while an error below was being reported
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        try:
            signal.signal(signal.SIGINT, previous)
        except (ValueError, TypeError):  # not the main thread, or a handler not set from Python
            pass


def _command(args: argparse.Namespace, interrupted: list) -> int:
    """Run the command, each expected error as one line and its exit code (:func:`main`)."""
    from core.checkpoint import CheckpointError
    from core.config import ConfigError
    from core.device import KernelBuildError, OpenCLUnavailableError
    from core.generate import ContextFullError

    try:
        return args.func(args)
    except (OpenCLUnavailableError, KernelBuildError) as e:
        if interrupted:  # Ctrl-C while the driver compiled: its failure is the interruption's, not a real one
            print("\ninterrupted", file=sys.stderr)
            return 130
        print(f"opencl-llm: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (CheckpointError, ConfigError, ContextFullError, ValueError, OSError, FloatingPointError) as e:
        if args.verbose:
            raise
        if isinstance(e, OSError) and e.filename is None and e.strerror and len(e.args) == 2:
            return _fail(e.strerror)  # our own message, without the "[Errno 28]" prefix
        if isinstance(e, OSError) and e.filename is not None and e.strerror:
            return _fail(f"{e.filename}: {e.strerror.lower()}")  # "FILE: no such file or directory"
        if (isinstance(e, FileNotFoundError) and getattr(args, "model", None) == DEFAULT_MODEL_DIR
                and str(e) == f"{DEFAULT_MODEL_DIR}: no such file or folder"):  # no --model given, nothing trained here
            return _fail(f"{e} (the folder `opencl-llm train` saves into by default, here: train a model first, or "
                         "give --model PATH)")
        return _fail(str(e))
    except Exception as e:
        import pyopencl as cl

        if isinstance(e, cl.Error) and not args.verbose:  # e.g. OUT_OF_RESOURCES on a small GPU
            print(f"opencl-llm: the OpenCL device failed: {e}\n"
                  "Try a smaller model or batch, or another device (opencl-llm devices).", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
