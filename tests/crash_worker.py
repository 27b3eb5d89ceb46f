"""Crash-test driver for checkpoint saves (run by tests/test_checkpoint_crash.py in its own process).

    python -m tests.crash_worker ROOT [--random N] [--seed S]

It needs no OpenCL (a save takes plain data), so it can fork: for every file operation n of a save it
forks a child that saves with ``OPENCL_LLM_CRASH_AT=n`` (tests/file_ops.py: the child SIGKILLs itself just before
operation n) or ``enospc:n`` (operation n fails as on a full disk), waits for it, and checks the folder: it must
hold the old or the new checkpoint, complete and consistent (weights, moments, dataset and tokenizer
of one save), loadable, finite, with nothing left behind after the next load. ``--random N`` adds N
kills from outside (SIGKILL after a random delay) of a child saving in a loop. Prints one JSON line of
counts; exits 1 with the first failure on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from tests import file_ops

FIXTURE = Path(__file__).parent / "data" / "checkpoint_v1"


def _state(tag: str):
    """(weights, optimizer, meta, tokenizer, dataset) of version ``tag`` ("old" or "new")."""
    from core.checkpoint import load_checkpoint
    from core.dataset import Dataset, load_dataset

    loaded = load_checkpoint(FIXTURE)
    with np.load(FIXTURE / "optimizer.npz") as z:
        arrays = {k: z[k] for k in z.files}
    opt = {"m": {k[2:]: a for k, a in arrays.items() if k.startswith("m.")},
           "v": {k[2:]: a for k, a in arrays.items() if k.startswith("v.")}, "step": loaded.checkpoint.adam_step}
    dataset, _ = load_dataset(FIXTURE / "dataset.json")
    meta, weights = loaded.checkpoint, loaded.weights
    if tag == "new":
        weights = {k: w + 0.5 for k, w in weights.items()}
        opt = {"m": {k: a * 2 for k, a in opt["m"].items()}, "v": opt["v"], "step": opt["step"] + 5}
        meta = replace(meta, stage_index=1, stage_step=2)
        dataset = Dataset(list(dataset.facts) + ["The new fact is here."], list(dataset.dialogues))
    return weights, opt, meta, loaded.tokenizer, dataset


def _leftovers(folder: Path) -> list[str]:
    out = [p.name for p in folder.parent.iterdir()
           if p.name.startswith((f".{folder.name}.tmp-", f".{folder.name}.bak"))]
    if folder.is_dir():
        out += [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    return out


def check(folder: Path, states: dict, allow_none: bool, writer_alive: bool = False) -> str:
    """Which version ``folder`` holds ("old", "new", or "none" when no checkpoint was ever complete);
    raises AssertionError for a mix, a traceback-worthy error or a leftover."""
    from core.atomic import readable_folder
    from core.checkpoint import CheckpointError, load_checkpoint
    from core.dataset import dataset_hash, load_dataset

    try:
        loaded = load_checkpoint(folder)
    except (CheckpointError, FileNotFoundError) as e:
        msg = str(e)
        assert "\n" not in msg, msg
        assert allow_none and ("not a checkpoint folder" in msg or "no such file" in msg), msg
        assert not _leftovers(folder), _leftovers(folder)
        return "none"
    meta = loaded.checkpoint
    which = [t for t, s in states.items() if s[2].adam_step + (5 if t == "new" else 0) == meta.adam_step]
    assert len(which) == 1, f"adam_step {meta.adam_step} is neither version's"
    tag = which[0]
    weights, opt, smeta, _tok, ds = states[tag]
    for k, w in weights.items():
        assert np.array_equal(loaded.weights[k], np.asarray(w, np.float32)), f"{tag}: weights {k} from the other version"
        assert np.all(np.isfinite(loaded.weights[k]))
    assert (meta.stage_index, meta.stage_step) == (smeta.stage_index, smeta.stage_step), f"{tag}: stage mixed"
    if writer_alive:  # a live writer's files are its own business; what was read must be one save
        return tag
    d = readable_folder(folder)
    with np.load(d / "optimizer.npz") as z:
        for k, a in opt["m"].items():
            assert np.array_equal(z[f"m.{k}"], np.asarray(a, np.float32)), f"{tag}: moment {k} from the other version"
    got, _ = load_dataset(d / "dataset.json")
    assert dataset_hash(got) == meta.dataset_hash == dataset_hash(ds), f"{tag}: dataset.json of the other version"
    assert not _leftovers(folder), f"left behind after load: {_leftovers(folder)}"
    return tag


def _save(folder: Path, state) -> None:
    from core.checkpoint import save_checkpoint

    save_checkpoint(folder, *state)


def _child(folder: Path, state, spec: str | None, loop: bool = False) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            file_ops.reset_op_count()
            if spec:
                os.environ[file_ops.CRASH_ENV] = spec
            else:
                os.environ.pop(file_ops.CRASH_ENV, None)
            while True:
                _save(folder, state)
                if not loop:
                    break
        except OSError as e:
            code = 3 if "No space left" in str(e) else 4
        except BaseException:  # noqa: BLE001 - report any other failure as exit 5
            code = 5
        os._exit(code)
    return pid


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def count_ops(root: Path, states, fresh: bool) -> int:
    """File operations of one save of the new version (over the old one, or into a new folder)."""
    log = root / f"ops-{fresh}.log"
    folder = root / "count"
    shutil.rmtree(folder, ignore_errors=True)
    if not fresh:
        _save(folder, states["old"])
    os.environ[file_ops.CRASH_LOG_ENV] = str(log)
    try:
        pid = _child(folder, states["new"], None)
        assert _wait(pid) == 0
    finally:
        os.environ.pop(file_ops.CRASH_LOG_ENV, None)
    n = len(log.read_text().splitlines())
    shutil.rmtree(folder)
    return n


def _kill_during_recovery(folder: Path) -> None:
    """A second crash, now during the recovery a load does (at its first file operation)."""
    pid = os.fork()
    if pid == 0:
        from core.checkpoint import load_checkpoint

        file_ops.reset_op_count()
        os.environ[file_ops.CRASH_ENV] = "1"
        try:
            load_checkpoint(folder)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(0)
    _wait(pid)


def _kill_at_every_op(folder: Path, states, ops: dict, counts: dict) -> None:
    """kill -9 before each file operation of a save over the old checkpoint and into a new folder."""
    for fresh in (False, True):
        n_ops = ops[fresh]
        for n in range(1, n_ops + 2):
            shutil.rmtree(folder, ignore_errors=True)
            if not fresh:
                _save(folder, states["old"])
            rc = _wait(_child(folder, states["new"], str(n)))
            assert rc == (-signal.SIGKILL if n <= n_ops else 0), f"op {n}: child ended with {rc}"
            if _leftovers(folder) and n % 3 == 0:
                _kill_during_recovery(folder)
                counts["kill_during_recovery"] += 1
            got = check(folder, states, allow_none=fresh)
            if n > n_ops:
                assert got == "new", f"op {n}: a completed save left {got}"
            counts["outcomes"][got] += 1
            counts["kill_at_op_fresh" if fresh else "kill_at_op_overwrite"] += 1 if n <= n_ops else 0


def _full_disk_at_every_op(folder: Path, states, n_ops: int, counts: dict) -> None:
    """A full disk at each operation: an error and the old checkpoint, or (a failure the save may
    ignore, such as a folder's fsync) the new one."""
    for n in range(1, n_ops + 1):
        shutil.rmtree(folder, ignore_errors=True)
        _save(folder, states["old"])
        rc = _wait(_child(folder, states["new"], f"enospc:{n}"))
        assert rc in (0, 3), f"enospc at op {n}: child ended with {rc}"
        assert rc == 0 or not _leftovers(folder), f"enospc at op {n}: left {_leftovers(folder)}"
        got = check(folder, states, allow_none=False)
        assert got == ("new" if rc == 0 else "old"), f"enospc at op {n}: exit {rc} but the folder holds {got}"
        counts["enospc_at_op"] += 1
        counts["outcomes"][got] += 1


def _random_kills(folder: Path, states, n: int, seed: int, counts: dict) -> None:
    """kill -9 from outside at a random moment of saves in a loop."""
    rng = random.Random(seed)
    for i in range(n):
        shutil.rmtree(folder, ignore_errors=True)
        _save(folder, states["old"])
        pid = _child(folder, states["new" if i % 2 else "old"], None, loop=True)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        _wait(pid)
        got = check(folder, states, allow_none=False)
        counts["random_kill"] += 1
        counts["outcomes"][got] += 1


def _reads_during_saves(folder: Path, states, n: int, counts: dict) -> None:
    """A reader (chat, export) while a writer holding the folder's lock saves in a loop."""
    shutil.rmtree(folder, ignore_errors=True)
    _save(folder, states["old"])
    pid = os.fork()
    if pid == 0:
        from core.folder_lock import FolderLock

        FolderLock(folder, "crash_worker writer").acquire()
        i = 0
        while True:
            _save(folder, states["new" if i % 2 else "old"])
            i += 1
    try:
        for _ in range(n):
            got = check(folder, states, allow_none=False, writer_alive=True)
            counts["reads_during_saves"] += 1
            counts["outcomes"][got] += 1
    finally:
        os.kill(pid, signal.SIGKILL)
        _wait(pid)
    check(folder, states, allow_none=False)  # and the dead writer's leftovers are recovered


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--random", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--readers", type=int, default=0, help="loads while another process saves in a loop")
    args = ap.parse_args(argv)
    file_ops.install()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    states = {"old": _state("old"), "new": _state("new")}
    ops = {fresh: count_ops(root, states, fresh) for fresh in (False, True)}
    counts = {"file_ops_per_save": ops[False], "file_ops_first_save": ops[True], "kill_at_op_overwrite": 0,
              "kill_at_op_fresh": 0, "enospc_at_op": 0, "kill_during_recovery": 0, "random_kill": 0,
              "reads_during_saves": 0, "outcomes": {"old": 0, "new": 0, "none": 0}}
    folder = root / "ck"
    try:
        _kill_at_every_op(folder, states, ops, counts)
        _full_disk_at_every_op(folder, states, ops[False], counts)
        _random_kills(folder, states, args.random, args.seed, counts)
        if args.readers:
            _reads_during_saves(folder, states, args.readers, counts)
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print(json.dumps(counts))
        return 1
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
