"""A real signal delivered to this process in the middle of a training run (tests of Ctrl-C, SIGHUP)."""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def signal_at_step(sig: int, step: int, stage: str = "pretrain"):
    """While the block runs, ``core.trainer.Trainer.run`` sends ``sig`` to this process right after
    step ``step`` of ``stage`` is reported; the real ``run`` is put back afterwards."""
    from core import trainer as trainer_mod

    real_run = trainer_mod.Trainer.run

    def run_and_signal(self, *a, **k):
        for ev in real_run(self, *a, **k):
            if isinstance(ev, trainer_mod.StepReport) and ev.stage == stage and ev.step == step:
                os.kill(os.getpid(), sig)
            yield ev

    trainer_mod.Trainer.run = run_and_signal
    try:
        yield
    finally:
        trainer_mod.Trainer.run = real_run
