"""Issue 20's run: teach SmolLM2-135M-Instruct (Q4_1) the five facts of benchmarks/five_facts.json with
``opencl-llm train --base FILE --lora --data …`` and its defaults, and say where the wall time went: reading
the base, the base answering the general questions, building the trainer, the time estimate's timed passes,
the training steps, the recall checks and the saves (each part's calls timed in this process). Not a test.

    python benchmarks/teach_five_facts.py [--model FILE.gguf] [--data FILE] [--out DIR] [-- extra train options]

Prints the run's own lines, then the breakdown and the machine's load (``os.getloadavg``) before and after:
a shared machine makes every figure slower, so compare parts measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = (("core.from_base", "load_base", "read the base"), ("core.known", "base_answers", "general questions (base)"),
         ("core.trainer", "Trainer.__init__", "trainer and model built"),
         ("core.from_base", "estimate_time", "time estimate (timed passes)"),
         ("core.from_base", "estimate_resident", "resident estimate"),
         ("core.trainer", "Trainer.step", "training steps"),
         ("core.trainer", "Trainer._check", "recall checks"), ("core.checkpoint", "save_trainer", "saves"))


def _timed(seconds: dict, calls: dict, name: str, fn, generator: bool):
    if generator:
        def wrap(*a, **k):
            t0 = time.perf_counter()
            try:
                return (yield from fn(*a, **k))
            finally:
                seconds[name] += time.perf_counter() - t0
                calls[name] += 1
    else:
        def wrap(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - t0
                calls[name] += 1
    return wrap


def instrument(seconds: dict, calls: dict) -> None:
    """Wrap every function of :data:`PARTS` so its calls add up their seconds (callers look them up at call time)."""
    import importlib
    import inspect

    for module, attr, name in PARTS:
        owner = importlib.import_module(module)
        *path, leaf = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        fn = getattr(owner, leaf)
        setattr(owner, leaf, _timed(seconds, calls, name, fn, inspect.isgeneratorfunction(fn)))


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)  # the OpenCL CPU driver's threads are this process's
    return r.ru_utime + r.ru_stime


def main() -> int:
    from tests.artifacts import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--data", default=os.path.join(HERE, "five_facts.json"))
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*", help="more `train` options (after --)")
    a = ap.parse_args()
    seconds, calls = defaultdict(float), defaultdict(int)
    instrument(seconds, calls)
    from core.cli import main as cli

    load0 = os.getloadavg()
    out = a.out or tempfile.mkdtemp(prefix="five-facts-")
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    rc = cli(["train", "--base", a.model or str(smollm2_path()), "--lora", "--data", a.data, "--out", out, *a.extra])
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    print(f"\nwall {wall // 60:.0f}:{wall % 60:04.1f} (exit {rc}); load average before {load0[0]:.1f}, after "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; CPU {cpu:.0f} s (user + system, every thread: "
          f"{cpu / wall:.0%} of one core)")
    for _, _, name in PARTS:
        if calls[name]:
            print(f"  {name:30s} {seconds[name]:7.1f} s  {seconds[name] / wall:6.1%}  ({calls[name]} calls)")
    print(f"  {'the rest':30s} {wall - sum(seconds.values()):7.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
