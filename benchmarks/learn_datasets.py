"""Issue 18's figures: does a model trained with the default (Auto) settings know the facts it was given,
on five generated datasets of different shapes and wordings (tests/make_datasets.py)?

For each dataset: ``opencl-llm train --data DATASET`` with no other flag (wall time from start to the
saved model, against the estimate the plan printed), then, on the saved checkpoint:

- dialogue answers reproduced exactly, facts reproduced from their first words (the app's own recall
  check, core.recall);
- questions about items that no dialogue asks about (held out of the dataset by the generator),
  answered with the right value (greedy, batched on the device), and apart: those about the facts the run
  learned as text only (core.batches.Batches.unasked: no dialogue and no written question asks about them,
  the facts its start line and verdict count) and those about facts with a written question;
- ten dialogue questions asked one after another in one conversation (core.chat.ChatSession);
- with ``--llama``: the same questions through llama.cpp (llama-cpp-python) on the exported F32 GGUF.

    python benchmarks/learn_datasets.py                       # all five, full size
    python benchmarks/learn_datasets.py --only catalogue --items 60 --dialogues 50   # a quick look

Held-out questions answered, about facts learned as text only / with a written question (2026-12-07, PoCL on
the 2-core AMD EPYC Zen 4 VM, ``--items 20 --dialogues 8``, seed 0): people 0/4 / 13/20, catalogue 2/20 / 2/4,
events 0/8 / 9/16, places 0/8 / 11/16, document 2/15 / 5/9; in all 4/55 (7 %) / 40/65 (62 %).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from make_datasets import NAMES, make_dataset, value_in  # noqa: E402

_ESTIMATE = re.compile(r"estimated (\d+(?::\d\d)+)")


def _seconds(hms: str) -> float:
    s = 0.0
    for part in hms.split(":"):
        s = s * 60 + int(part)
    return s


def greedy_answers(model, tok, questions: list[str], max_new: int = 24) -> list[str]:
    """Greedy answers (text) to each question asked as a new conversation, decoded in batches."""
    from core import chat_format
    from core.recall import greedy_batch

    out = []
    b = model.batch_size
    for s in range(0, len(questions), b):
        prompts = [chat_format.prompt_ids(tok, [], q) for q in questions[s:s + b]]
        ids = greedy_batch(model, prompts, [max_new] * len(prompts), tok.eos_id, tok.pad_id)
        out += [tok.decode([t for t in r if t != tok.eos_id]).strip() for r in ids]
    return out


def evaluate(ck: Path, g, device: str | None, batch_size: int = 16, conversation: bool = True) -> dict:
    """The app's figures of checkpoint ``ck`` on generated dataset ``g`` (greedy answers decoded ``batch_size``
    at a time; ``conversation``: also ten dialogue questions in one conversation)."""
    from core.chat import ChatSession
    from core.checkpoint import load_model
    from core.dataset import Dataset, Dialogue
    from core.device import open_device
    from core.generate import Generator, SamplingSettings
    from core.model import Model
    from core.recall import recall_check, tally

    loaded = load_model(ck)
    dev = open_device(device)
    model = Model(dev, loaded.config, batch_size=batch_size, weights=loaded.weights, training=False)
    tok = loaded.tokenizer
    ds = Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues])
    items = []
    for _d, _n, items in recall_check(model, tok, ds, ("fact", "dialogue")):
        pass
    res = {"facts": tally(items, "fact"), "answers": tally(items, "dialogue")}
    held = greedy_answers(model, tok, [q for q, _ in g.heldout])
    res["heldout"] = (sum(value_in(a, v) for a, (_, v) in zip(held, g.heldout)), len(g.heldout))
    # the held-out questions about facts the run said it learned as text only (no question asks about them)
    text_only = _text_only_facts(ck, loaded)
    fact_of = {q: g.facts[i] for i, (_v, qs) in enumerate(g.truth) for q in qs} if g.truth else {}
    split = {True: [0, 0], False: [0, 0]}
    for a, (q, v) in zip(held, g.heldout):
        s = split[fact_of.get(q) in text_only]
        s[0] += value_in(a, v)
        s[1] += 1
    res["heldout_text_only"], res["heldout_asked"] = tuple(split[True]), tuple(split[False])
    res["heldout_wrong"] = [(q, v, a) for a, (q, v) in zip(held, g.heldout) if not value_in(a, v)][:5]
    asked = greedy_answers(model, tok, [q for q, _ in g.asked])
    res["asked_value"] = (sum(value_in(a, v) for a, (_, v) in zip(asked, g.asked)), len(g.asked))
    if not conversation:
        return res
    session = ChatSession(Generator(dev, loaded.config, model.params), tok)
    ten = g.asked[:: max(1, len(g.asked) // 10)][:10]
    said = [session.answer(q, SamplingSettings(max_tokens=32)) for q, _ in ten]
    res["conversation"] = (sum(value_in(a, v) for a, (_, v) in zip(said, ten)), len(ten))
    res["conversation_wrong"] = [(q, v, a) for a, (q, v) in zip(said, ten) if not value_in(a, v)]
    return res


def _text_only_facts(ck: Path, loaded) -> set[str]:
    """The facts of checkpoint ``ck``'s dataset that its run learned as text only (core.batches.Batches.unasked:
    no dialogue and no written question asks about them), as the run's start line and verdict count them."""
    from core.batches import Batches
    from core.dataset import load_dataset

    ds, _ = load_dataset(ck / "dataset.json")
    b = Batches(loaded.tokenizer, ds, loaded.config.context_length, loaded.checkpoint.train)
    return {ds.facts[i] for i in b.unasked}


def llama_figures(ck: Path, g, tmp: Path) -> dict:
    """Held-out and dialogue questions through llama.cpp on the F32 export (right value)."""
    from llama_cpp import Llama

    gguf = tmp / "model.gguf"
    subprocess.run([sys.executable, "-m", "core.cli", "export", "--model", str(ck), "--out", str(gguf)],
                   cwd=ROOT, check=True, capture_output=True)
    llm = Llama(str(gguf), n_ctx=256, verbose=False, seed=0)

    def ask(q: str) -> str:
        r = llm.create_chat_completion([{"role": "user", "content": q}], temperature=0.0, max_tokens=24)
        return r["choices"][0]["message"]["content"].strip()

    return {"heldout": (sum(value_in(ask(q), v) for q, v in g.heldout), len(g.heldout)),
            "asked_value": (sum(value_in(ask(q), v) for q, v in g.asked), len(g.asked))}


def run_one(name: str, args, tmp: Path) -> dict:
    g = make_dataset(name, args.seed, items=args.items, dialogues=args.dialogues)
    data = tmp / f"{name}.txt"
    data.write_text(g.text(), encoding="utf-8")
    ck = tmp / f"{name}-model"
    cmd = [sys.executable, "-m", "core.cli", "train", "--data", str(data), "--out", str(ck)]
    if args.device:
        cmd += ["--device", args.device]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    lines, plan_at = [], None
    for line in proc.stdout:
        lines.append(line)
        if plan_at is None and line.startswith("plan:"):
            plan_at = time.perf_counter()
    proc.wait()
    end = time.perf_counter()
    wall = end - t0
    out = "".join(lines)
    if proc.returncode:
        raise SystemExit(f"{name}: train failed:\n{out[-3000:]}")
    m = _ESTIMATE.search(out)
    res = {"name": name, "facts_n": len(g.facts), "dialogues_n": len(g.dialogues), "wall_s": round(wall, 1),
           "after_plan_s": round(end - plan_at, 1) if plan_at else None,
           "estimate_s": _seconds(m.group(1)) if m else None,
           "verdict": next((ln.strip() for ln in out.splitlines()
                            if ln.startswith(("Learned:", "Not fully learned:"))), "")}
    res.update(evaluate(ck, g, args.device))
    if args.llama:
        res["llama"] = llama_figures(ck, g, tmp)
    if args.log:
        Path(args.log).mkdir(parents=True, exist_ok=True)
        (Path(args.log) / f"{name}.log").write_text(out)
    return res


def pct(ok_n) -> str:
    ok, n = ok_n
    return f"{ok}/{n} ({100 * ok / max(n, 1):.0f} %)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=NAMES, help="datasets to run (default: all five)")
    p.add_argument("--items", type=int, help="fewer items per dataset (quick look)")
    p.add_argument("--dialogues", type=int, help="fewer dialogues per dataset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="device index or name")
    p.add_argument("--llama", action="store_true", help="also ask llama.cpp on the F32 export")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--log", help="folder for each run's train output")
    args = p.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for name in args.only or NAMES:
            r = run_one(name, args, Path(td))
            rows.append(r)
            est = f"{r['estimate_s']:.0f} s" if r["estimate_s"] else "?"
            line = (f"{name:10s} facts {pct(r['facts'])}  answers {pct(r['answers'])}  held-out {pct(r['heldout'])}  "
                    f"asked(value) {pct(r['asked_value'])}  conversation {pct(r['conversation'])}  "
                    f"wall {r['wall_s']:.0f} s, after the plan {r['after_plan_s']} s (estimate {est})")
            if "llama" in r:
                line += f"  llama.cpp: held-out {pct(r['llama']['heldout'])}, asked {pct(r['llama']['asked_value'])}"
            print(line, flush=True)
            print(f"           held-out about facts learned as text only {pct(r['heldout_text_only'])}, about facts "
                  f"with a written question {pct(r['heldout_asked'])}", flush=True)
            print(f"           {r['verdict']}", flush=True)
            for q, v, a in r["conversation_wrong"]:
                print(f"           wrong in the conversation: {q!r} -> {a!r} (want {v!r})", flush=True)
            for q, v, a in r["heldout_wrong"][:3]:
                print(f"           wrong: {q!r} -> {a!r} (want {v!r})", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
