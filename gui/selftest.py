"""``opencl-llm-studio --self-test``: prove an installation (or the packaged executable) works, without
a window. Uses ``core`` only.

Steps: list devices; check the best device (kernels build, ops match numpy, matmul speed); train the
Tiny preset for a few steps on the default dataset; generate an answer; save a checkpoint and export
a GGUF into a temporary folder and read it back. Prints one line per step and a summary.

Exit code 0 when every step passed, 1 otherwise.
"""
from __future__ import annotations

import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, TextIO

PRETRAIN_STEPS, TUNE_STEPS, BATCH = 6, 4, 4


def _printer(stream) -> Callable[[str], None]:
    def emit(line: str) -> None:
        if stream is not None:  # a windowed executable on Windows may have no stdout
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
    return emit


def run_self_test(stream: TextIO | None = None, device: str | int | None = None) -> int:
    """Run the self-test, printing to ``stream`` (default stdout); returns the exit code."""
    say = _printer(stream if stream is not None else sys.stdout)
    t_start = time.perf_counter()
    results: list[tuple[str, bool, str]] = []

    def record(name: str, ok: bool, detail: str) -> None:
        results.append((name, ok, detail))
        say(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}")

    try:
        from core.config import PRESETS, replace
        from core.device import list_devices, open_device, select_device

        devices = list_devices()
        for d in devices:
            say(f"  device {d.index}: {d.label}")
        record("devices", True, f"{len(devices)} found")
        info = select_device(device)
        dev = open_device(info)

        from core.selftest import check_device

        check = check_device(dev, matmul_size=256, budget_s=0.3)
        bad = [c.name for c in check.checks if not c.ok] + list(check.build_errors)
        speed = f", matmul {check.matmul_gflops:.1f} GFLOP/s" if check.matmul_gflops else ""
        record("device check", check.ok, f"{info.label}: kernels built in {check.build_s:.1f} s, "
               + (f"failed: {', '.join(bad)}" if bad else f"{len(check.checks)} ops match numpy") + speed)

        from core.dataset import default_dataset
        from core.trainer import StepReport, Trainer

        mc, tc = PRESETS["Tiny"]
        tc = replace(tc, pretrain=replace(tc.pretrain, steps=PRETRAIN_STEPS, batch_size=BATCH, warmup_steps=2),
                     tune=replace(tc.tune, steps=TUNE_STEPS, batch_size=BATCH, warmup_steps=1))
        t0 = time.perf_counter()
        trainer = Trainer(default_dataset(), mc, tc, dev)
        losses = [ev.loss for ev in trainer.run(recall=False) if isinstance(ev, StepReport)]
        finite = bool(losses) and all(math.isfinite(x) for x in losses)
        record("training", finite and len(losses) == PRETRAIN_STEPS + TUNE_STEPS,
               f"{len(losses)} steps in {time.perf_counter() - t0:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
               if losses else "no steps ran")

        from core.chat import ChatSession
        from core.generate import SamplingSettings

        answer = ChatSession(trainer.generator(), trainer.tokenizer).answer(
            "Where is Brindlewick?", SamplingSettings(max_tokens=12))
        record("generation", True, f"answer {answer!r}")

        from core.checkpoint import load_model, save_trainer
        from core.gguf_io import export_gguf, import_gguf

        with tempfile.TemporaryDirectory(prefix="opencl-llm-selftest-") as tmp:
            ckpt = save_trainer(trainer, Path(tmp) / "checkpoint")
            res = export_gguf(load_model(ckpt), Path(tmp) / "selftest.gguf", dtype="f16")
            back = import_gguf(res.path)
            same = back.config.n_params() == trainer.model_config.n_params()
            record("GGUF export", same, f"{res.size_bytes / 1e6:.2f} MB F16, read back "
                   + ("with the same shapes" if same else "with DIFFERENT shapes"))
    except Exception as e:  # report any failure as a line, never a bare traceback
        record("self-test", False, f"{type(e).__name__}: {e}")
        say(traceback.format_exc())

    ok = bool(results) and all(r[1] for r in results)
    say(f"self-test {'passed' if ok else 'FAILED'}: {sum(r[1] for r in results)}/{len(results)} steps ok "
        f"in {time.perf_counter() - t_start:.1f} s")
    return 0 if ok else 1
