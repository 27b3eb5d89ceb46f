"""``opencl-llm``: the headless command line (devices, train, chat, export).

Every command has ``--help``. Errors from bad input are printed as one clear line (exit code 2);
no raw tracebacks for things a user can fix.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

DEFAULT_MODEL_DIR = "opencl-llm-model"


def _fail(msg: str) -> int:
    print(f"opencl-llm: error: {msg}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------------- devices
def cmd_devices(args) -> int:
    from core.device import list_devices

    devices = list_devices()
    for d in devices:
        default = "  (default)" if d.index == 0 else ""
        print(f"[{d.index}] {d.label}{default}")
        print(f"     vendor {d.vendor.strip()}, {d.opencl_version.strip()}")
        print(f"     compute units {d.compute_units}, global memory {d.global_mem_bytes / 2**30:.1f} GiB, "
              f"local memory {d.local_mem_bytes // 1024} KiB, max work-group size {d.max_work_group_size}")
    return 0


def _tune_matmul(dev) -> None:
    """First use of a device: time the matmul kernels once (cached), with a progress line."""
    from core.kernels import matmul_tune

    shown = []

    def line(fraction: float, message: str) -> None:
        shown.append(message)
        print(f"\r{message:<72s}", end="" if fraction < 1.0 else "\n", file=sys.stderr, flush=True)

    result = matmul_tune.tuned_configs(dev, progress=line)
    if shown and "seconds" in result:
        print(f"matmul tuned in {result['seconds']:.1f} s (cached for this device and driver)", file=sys.stderr)


# ----------------------------------------------------------------------------- train
def _configs(args):
    from core.config import PRESETS, replace

    mc, tc = PRESETS[args.preset or "Small"]
    mfields = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
               "n_kv_heads": args.n_kv_heads, "ffn_dim": args.ffn_dim, "context_length": args.context_length,
               "rope_theta": args.rope_theta}
    mc = replace(mc, **{k: v for k, v in mfields.items() if v is not None})
    pre, tune = tc.pretrain, tc.tune
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
               "weight_decay": args.weight_decay, "vocab_size": args.vocab_size}
    tc = replace(tc, pretrain=pre, tune=tune, **{k: v for k, v in tfields.items() if v is not None})
    return mc, tc


_MODEL_OPTIONS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "context_length", "rope_theta",
                  "vocab_size", "seed")


def _writable_folder(path: Path) -> Path:
    """Create ``path`` if needed and check a file can be written there (before any training)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path}: exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    probe.write_bytes(b"")
    probe.unlink()
    return path


def _resume_config(args, saved):
    """The saved TrainConfig with the training options given on the command line applied."""
    from core.config import replace

    fixed = [f"--{n.replace('_', '-')}" for n in _MODEL_OPTIONS if getattr(args, n) is not None]
    if args.data or args.preset or fixed:
        what = ", ".join(fixed + (["--data"] if args.data else []) + (["--preset"] if args.preset else []))
        raise ValueError(f"{what}: cannot change when resuming (the checkpoint fixes the model, dataset and "
                         "tokenizer); only steps, lr, batch size, clipping, weight decay and replay share can")
    pre, tune = saved.pretrain, saved.tune
    for stage, prefix in ((0, "pretrain"), (1, "tune")):
        st = pre if stage == 0 else tune
        if getattr(args, f"{prefix}_steps") is not None:
            st = replace(st, steps=getattr(args, f"{prefix}_steps"))
        if getattr(args, f"{prefix}_lr") is not None:
            st = replace(st, lr=getattr(args, f"{prefix}_lr"))
        if args.batch_size is not None:
            st = replace(st, batch_size=args.batch_size)
        pre, tune = (st, tune) if stage == 0 else (pre, st)
    extra = {k: getattr(args, k) for k in ("replay_share", "grad_clip", "weight_decay") if getattr(args, k) is not None}
    return replace(saved, pretrain=pre, tune=tune, **extra)


def cmd_train(args) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from core.checkpoint import load_checkpoint, resume_trainer, save_checkpoint
    from core.config import ConfigError, TrainConfig
    from core.dataset import default_dataset, load_dataset
    from core.device import open_device
    from core.trainer import LogEvent, StageReport, StepReport, Trainer, TrainingDiverged

    out = Path(args.out or args.resume or DEFAULT_MODEL_DIR)
    try:
        if args.resume:
            saved = TrainConfig.from_dict(load_checkpoint(args.resume).meta["train"])
            tc = _resume_config(args, saved)
        else:
            mc, tc = _configs(args)
    except ConfigError as e:
        return _fail(f"invalid setting {e}")
    _writable_folder(out)
    dev = open_device(args.device)
    print(f"device: {dev.info.label}")
    _tune_matmul(dev)
    if args.resume:
        trainer = resume_trainer(args.resume, dev, train_config=tc)
        print(f"resuming {args.resume} at stage {trainer.stage_index + 1} of 2, step {trainer.stage_step}")
    else:
        if args.data:
            dataset, problems = load_dataset(args.data)
            for p in problems:
                print(f"warning: {p}", file=sys.stderr)
            if not dataset.facts and not dataset.dialogues:
                return _fail(f"{args.data}: no facts or dialogues could be read")
        else:
            dataset = default_dataset()
        print(f"dataset: {len(dataset.facts)} facts, {len(dataset.dialogues)} dialogues")
        trainer = Trainer(dataset, mc, tc, dev)
    c = trainer.model_config
    print(f"model: {c.n_params():,} parameters (d_model {c.d_model}, {c.n_layers} layers, {c.n_heads} heads, "
          f"vocab {c.vocab_size}, context {c.context_length})")
    if trainer.done:
        print(f"nothing left to train in {args.resume}: both stages are complete (give more --pretrain-steps or "
              "--tune-steps to continue)")
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    tasks = {}
    # The first Ctrl-C asks the trainer to stop between two steps (so the checkpoint resumes
    # exactly); a second one interrupts at once.
    import signal

    def stop_between_steps(*_):
        trainer.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, stop_between_steps)
    try:
        with Progress(*columns, disable=args.quiet) as progress:
            for ev in trainer.run():
                if isinstance(ev, StepReport):
                    if ev.stage not in tasks:
                        tasks[ev.stage] = progress.add_task(ev.stage, total=ev.total_steps, loss="-", tps="-")
                    progress.update(tasks[ev.stage], completed=ev.step, loss=f"{ev.loss:.3f}",
                                    tps=f"{ev.tokens_per_s:,.0f}")
                elif isinstance(ev, LogEvent):
                    progress.console.print(("warning: " if ev.level == "WARNING" else "") + ev.message)
                elif isinstance(ev, StageReport) and ev.stopped:
                    save_checkpoint(trainer, out)
                    print(f"stopped; checkpoint saved to {out} (continue with: opencl-llm train --resume {out})")
                    return 130
                elif isinstance(ev, StageReport):
                    save_checkpoint(trainer, out)
    except KeyboardInterrupt:  # a second Ctrl-C: the step may be half done, so nothing is saved
        print(f"interrupted; {out} keeps the checkpoint of the last completed stage (if any)")
        return 130
    except TrainingDiverged as e:
        save_checkpoint(trainer, out)
        return _fail(str(e))
    finally:
        signal.signal(signal.SIGINT, previous)
    save_checkpoint(trainer, out)
    print(f"model saved to {out}")
    return 0


# ----------------------------------------------------------------------------- chat
def cmd_chat(args) -> int:
    from core.chat import ChatSession
    from core.checkpoint import load_model
    from core.device import open_device
    from core.generate import ContextFullError, Generator, SamplingSettings

    loaded = load_model(args.model)
    dev = open_device(args.device)
    _tune_matmul(dev)
    gen = Generator(dev, loaded.config, loaded.weights)
    session = ChatSession(gen, loaded.tokenizer, system=args.system)
    settings = SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                repetition_penalty=args.repetition_penalty, max_tokens=args.max_tokens,
                                seed=args.seed)
    if args.prompt is not None:
        print(session.answer(args.prompt, settings))
        return 0
    print("Chat with the model. An empty line, /exit or Ctrl-D quits; /clear forgets the conversation.")
    while True:
        try:
            line = input("User: ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip() or line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/clear":
            session.clear()
            continue
        print("Assistant:", end="", flush=True)
        try:
            for piece in session.ask(line, settings):
                print(piece.text, end="", flush=True)
        except (ContextFullError, ValueError, FloatingPointError) as e:  # one bad message does not end the chat
            print(f" [{e}]", end="")
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        print()


# ----------------------------------------------------------------------------- export
def cmd_export(args) -> int:
    from core.checkpoint import load_model
    from core.gguf_io import export_gguf

    loaded = load_model(args.model)
    out = Path(args.out)
    if out.is_dir():  # a folder: write <model name>.gguf inside it
        out = out / (Path(args.model).resolve().stem + ".gguf")
    result = export_gguf(loaded, out, dtype=args.dtype, modelfile=args.modelfile)
    for note in getattr(result, "notes", []) or []:
        print(f"note: {note}")
    print(f"wrote {result.path} ({result.size_bytes / 1e6:.2f} MB, {args.dtype})")
    if result.modelfile:
        print(f"wrote {result.modelfile} (ollama create NAME -f {result.modelfile})")
    return 0


# ----------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opencl-llm", description="Train, chat with and export small llama-style "
                                "language models on any OpenCL device.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("devices", help="list OpenCL devices", description="List every OpenCL device, preferred first.")
    s.set_defaults(func=cmd_devices)

    s = sub.add_parser("train", help="train a model", description="Train a model from scratch: pretrain on facts, "
                       "then tune on dialogues. Uses the built-in default dataset when --data is not given.")
    s.add_argument("--data", help="dataset file: the app's .json, plain text, or chat .jsonl")
    s.add_argument("--device", help="device index or name (see `opencl-llm devices`); default: the best found")
    s.add_argument("--out", help=f"checkpoint folder to write (default: the --resume folder, else {DEFAULT_MODEL_DIR})")
    s.add_argument("--resume", metavar="DIR", help="continue training a checkpoint folder exactly where it stopped; "
                   "steps, lr, batch size, clipping, weight decay and replay share may be changed, the model and "
                   "dataset may not")
    s.add_argument("--preset", choices=["Tiny", "Small", "Larger"], help="model and training preset (default: Small)")
    for name, typ in (("d-model", int), ("n-layers", int), ("n-heads", int), ("n-kv-heads", int), ("ffn-dim", int),
                      ("context-length", int), ("rope-theta", float), ("pretrain-steps", int), ("tune-steps", int),
                      ("pretrain-lr", float), ("tune-lr", float), ("batch-size", int), ("seed", int),
                      ("replay-share", float), ("grad-clip", float), ("weight-decay", float), ("vocab-size", int)):
        s.add_argument(f"--{name}", type=typ, help=f"override the preset's {name.replace('-', '_')}")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("chat", help="chat with a trained model", description="Chat with a checkpoint folder or a .gguf "
                       "file. With --prompt, print one answer and exit.")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder or .gguf (default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--prompt", help="one message to answer")
    s.add_argument("--system", help="system message")
    s.add_argument("--device", help="device index or name")
    s.add_argument("--temperature", type=float, default=0.0, help="randomness; 0 = always the most likely token "
                   "(greedy, the default)")
    s.add_argument("--top-k", type=int, default=0, help="sample only from the k most likely tokens (0 = all)")
    s.add_argument("--top-p", type=float, default=1.0, help="sample only from the most likely tokens whose "
                   "probabilities add up to p (1 = all)")
    s.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 makes tokens already in the "
                   "conversation less likely (1 = off)")
    s.add_argument("--max-tokens", type=int, default=64, help="longest answer in tokens (default 64)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampler (same seed, same answer)")
    s.set_defaults(func=cmd_chat)

    s = sub.add_parser("export", help="export a GGUF file", description="Export a model to GGUF for llama.cpp, "
                       "Ollama and LM Studio.")
    s.add_argument("--model", default=DEFAULT_MODEL_DIR, help=f"checkpoint folder or .gguf (default: {DEFAULT_MODEL_DIR})")
    s.add_argument("--out", required=True, help="the .gguf file to write (or a folder to write it into)")
    s.add_argument("--dtype", default="f32", choices=["f32", "f16", "q8_0"], help="f32: exact (default); f16: "
                   "half the size; q8_0: about a quarter, slightly less exact")
    s.add_argument("--modelfile", action="store_true", help="also write an Ollama Modelfile next to it")
    s.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``opencl-llm``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    from core.checkpoint import CheckpointError
    from core.config import ConfigError
    from core.device import KernelBuildError, OpenCLUnavailableError
    from core.generate import ContextFullError

    try:
        return args.func(args)
    except (OpenCLUnavailableError, KernelBuildError) as e:
        print(f"opencl-llm: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (CheckpointError, ConfigError, ContextFullError, ValueError, OSError, FloatingPointError) as e:
        if args.verbose:
            raise
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
