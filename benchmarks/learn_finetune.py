"""Does a LoRA fine-tune of a base model learn facts that no dialogue asks about, and how much of that comes
from the Auto plan's data mix (core.from_base.with_data_mix, core.plan.data_mix)?

For each generated dataset (tests/make_datasets.py, small: ``--items`` items, dialogues for some of them,
``--heldout-share`` of the items without any dialogue) and each variant:

- ``default``: ``opencl-llm train --base MODEL --lora --data DATASET`` with the CLI's defaults (a fine-tune
  gets the data mix: questions mixed into the facts' stage, a question per fact without a dialogue written by
  core.augment.fact_questions, conversation batches, facts packed, the plan's replay share);
- ``nomix``: the same command without the mix (a fine-tune before it: no fact questions, no conversations,
  replay share 0.25): the CLI runs in a child process whose ``core.from_base.with_data_mix`` is replaced
  (:func:`_nomix_cli`).

then, on the saved checkpoint (the LoRA adapters merged into the base, core.checkpoint.load_model):

- facts reproduced from their first words and dialogue answers reproduced exactly (the app's own recall
  check, core.recall);
- questions about the items that no dialogue asks about (held out by the generator), answered with the
  right value (greedy, graded with make_datasets.value_in, as benchmarks/learn_datasets.py does), and the
  dialogue questions answered with the right value;
- the fine-tune's own verdict line "general questions: n of N answered as before" (core.known);
- the wall time of the train command.

    python benchmarks/learn_finetune.py --only people --items 8 --dialogues 8
    python benchmarks/learn_finetune.py --only people --items 8 --dialogues 8 --steps 4   # a smoke test
    python benchmarks/learn_finetune.py --questions FILE.json   # print the fact questions core.augment writes

Figures (2026-12-06, PoCL on the busy 2-core CPU, SmolLM2-135M-Instruct Q4_1, LoRA rank 16, the CLI's 60 + 60
steps; 8 items x 6 facts = 48 facts, 8 dialogues, 4 items (24 questions) without any dialogue; seed 0):

    dataset    variant  facts        answers  held-out      general  wall (train)
    people     nomix    39/48 (81%)  8/8      4/24 (17%)    10/10    378 s
    people     mix      36/48 (75%)  8/8      19/24 (79%)   10/10    668 s
    catalogue  nomix    35/48 (73%)  8/8      4/24 (17%)    10/10    300 s
    catalogue  mix      33/48 (69%)  8/8      9/24 (38%)    10/10    553 s
    events     nomix    35/48 (73%)  8/8      7/24 (29%)    10/10    284 s
    events     mix      38/48 (79%)  8/8      15/24 (62%)   10/10    593 s

(measured before the mix became the default, "mix" then switched on in this benchmark.) The mix trains a written question for most facts of the items without a dialogue (people 30, catalogue 7,
events 22 trained; data_mix holds 2 more out); 8, 2 and 7 of the 24 held-out questions are word for word one
of them, the others ask the same fact in another wording.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from learn_datasets import evaluate  # noqa: E402
from make_datasets import NAMES, make_dataset  # noqa: E402

VARIANTS = ("default", "nomix")
_GENERAL = re.compile(r"general questions: (\d+) of (\d+) answered as before")
_ESTIMATE = re.compile(r"estimated (\d+(?::\d\d)+)")
MIX_MARK = "learn_finetune mix:"


def _cli(argv: list[str], mix: bool) -> int:
    """``opencl-llm ARGV`` in this process, printing the fine-tune's data mix (:data:`MIX_MARK` lines); without
    ``mix`` core.from_base.with_data_mix is replaced by a TrainConfig without it (replay share 0.25, as before)."""
    from core import cli, from_base
    from core.config import TrainConfig, replace

    mixed, made = from_base.with_data_mix, from_base.base_trainer

    def with_data_mix(tc, *a, **kw):
        return mixed(tc, *a, **kw) if mix else replace(tc, replay_share=TrainConfig.replay_share)

    def base_trainer(loaded, model_config, base_meta, dataset, tc, *a, **kw):
        fields = ("mix_share", "fact_questions", "fact_question_share", "conversation_every", "heldout", "pack_facts",
                  "replay_share")
        print(f"{MIX_MARK} {json.dumps({k: getattr(tc, k) for k in fields})}", flush=True)
        trainer = made(loaded, model_config, base_meta, dataset, tc, *a, **kw)
        print(f"{MIX_MARK} {len(trainer.batches._asked or [])} fact questions written, "
              f"{len(trainer.batches.questions)} trained, {len(trainer.batches.conversations)} conversations", flush=True)
        return trainer

    from_base.with_data_mix, from_base.base_trainer = with_data_mix, base_trainer
    return cli.main(argv)


def run_one(name: str, variant: str, args, tmp: Path) -> dict:
    g = make_dataset(name, args.seed, heldout_share=args.heldout_share, items=args.items, dialogues=args.dialogues)
    data = tmp / f"{name}.txt"
    data.write_text(g.text(), encoding="utf-8")
    ck = tmp / f"{name}-{variant}-model"
    train = ["train", "--base", str(args.model), "--lora", "--data", str(data), "--out", str(ck), "--overwrite", "-q"]
    for flag in ("device", "steps", "pretrain_steps", "tune_steps"):
        if getattr(args, flag) is not None:
            train += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd = [sys.executable, str(Path(__file__).resolve()), f"--{variant}-cli", *train]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1",
                               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    wall = time.perf_counter() - t0
    out = proc.stdout
    if args.log:
        Path(args.log).mkdir(parents=True, exist_ok=True)
        (Path(args.log) / f"{name}-{variant}.log").write_text(out)
    if proc.returncode:
        raise SystemExit(f"{name} {variant}: train failed:\n{out[-3000:]}")
    gen = _GENERAL.search(out)
    est = _ESTIMATE.search(out)
    res = {"name": name, "variant": variant, "facts_n": len(g.facts), "dialogues_n": len(g.dialogues),
           "heldout_n": len(g.heldout), "wall_s": round(wall, 1), "estimate": est.group(1) if est else None,
           "general": (int(gen.group(1)), int(gen.group(2))) if gen else None,
           "verdict": next((ln.strip() for ln in out.splitlines()
                            if ln.strip().startswith(("Learned:", "Not fully learned:"))), ""),
           "mix": [ln.strip() for ln in out.splitlines() if ln.startswith(MIX_MARK)]}
    t1 = time.perf_counter()
    res.update(evaluate(ck, g, args.device, batch_size=8, conversation=False))
    res["eval_s"] = round(time.perf_counter() - t1, 1)
    return res


def pct(ok_n) -> str:
    if ok_n is None:
        return "?"
    ok, n = ok_n
    return f"{ok}/{n} ({100 * ok / max(n, 1):.0f} %)"


def print_questions(path: str) -> None:
    """The questions core.augment.fact_questions writes for ``path``'s facts without a dialogue."""
    from core import augment
    from core.dataset import load_dataset

    ds, _ = load_dataset(path, [])
    pats = augment.patterns(ds)
    qs = augment.fact_questions(ds, 1, 0)
    linked = {p.fact for p in pats}
    print(f"{path}: {len(ds.facts)} facts, {len(ds.dialogues)} dialogues, {len(pats)} linked to a fact "
          f"(patterns), {len(ds.facts) - len(linked)} facts without a dialogue, {len(qs)} fact questions written")
    for p in pats:
        print(f"  pattern: fact {p.fact} <- {p.question!r} -> {p.answer!r}")
    asked = {i for i, _, _ in qs}
    for i, q, a in qs:
        print(f"  fact {i}: {ds.facts[i]!r}\n     Q {q!r}\n     A {a!r}")
    for i, f in enumerate(ds.facts):
        if i not in linked and i not in asked:
            print(f"  no question: fact {i}: {f!r}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--default-cli"], ["--nomix-cli"]):
        return _cli(argv[1:], mix=argv[0] == "--default-cli")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", choices=NAMES, help="datasets to run (default: all five)")
    p.add_argument("--items", type=int, default=8, help="items per dataset (6 facts each; default 8)")
    p.add_argument("--dialogues", type=int, default=8, help="dialogues per dataset (default 8)")
    p.add_argument("--heldout-share", type=float, default=0.5, help="share of the items without any dialogue "
                   "(their questions are the held-out ones; default 0.5)")
    p.add_argument("--variants", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--model", help="base GGUF file (default: SmolLM2-135M-Instruct Q4_1, downloaded as the tests do)")
    p.add_argument("--device", help="device index or name")
    p.add_argument("--steps", type=int, help="steps of each stage (default: the CLI's)")
    p.add_argument("--pretrain-steps", type=int)
    p.add_argument("--tune-steps", type=int)
    p.add_argument("--seed", type=int, default=0, help="the generator's seed")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--log", help="folder for each run's train output")
    p.add_argument("--questions", metavar="DATASET", help="only print the fact questions core.augment writes for "
                   "this dataset file, and exit")
    args = p.parse_args(argv)
    if args.questions:
        print_questions(args.questions)
        return 0
    if args.model is None:
        from artifacts import smollm2_path

        args.model = str(smollm2_path())
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for name in args.only or NAMES:
            for variant in args.variants:
                r = run_one(name, variant, args, Path(td))
                rows.append(r)
                print(f"{name:10s} {variant:8s} {r['facts_n']} facts, {r['dialogues_n']} dialogues: facts {pct(r['facts'])}  "
                      f"answers {pct(r['answers'])}  held-out {pct(r['heldout'])}  asked(value) {pct(r['asked_value'])}  "
                      f"general as before {pct(r['general'])}  wall {r['wall_s']:.0f} s (estimate {r['estimate']}), "
                      f"evaluation {r['eval_s']:.0f} s", flush=True)
                print(f"           {r['verdict']}", flush=True)
                for m in r["mix"]:
                    print(f"           {m}", flush=True)
                for q, v, a in r["heldout_wrong"][:3]:
                    print(f"           wrong: {q!r} -> {a!r} (want {v!r})", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
