"""Issue 19's break-it cases (hangs, crashes, silently wrong results) as one table: each input either gives a
one-line error naming the file and the key, field or line, or works; the hangs must end well within a
bound (20 s on a slow 2-core machine) or scale linearly (operations counted at two sizes).

A case is ``Case(id, run, error, match)``: ``run(tmp_path)`` is called; with ``error`` set it must raise that
type with a one-line message containing every string of ``match``; without, it must return (it may assert
what it got itself)."""
from __future__ import annotations

import errno
import math
import os
import struct
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from core import chat_format
from core.chat_template import TemplateError, encode_messages, render
from core.config import ModelConfig
from core.dataset import Dataset, Dialogue, default_dataset, load_dataset
from core.gguf_import import GGUFError, read_gguf
from core.hf_io import HFError
from core.loaded import LoadedModel
from core.tokenizer import Tokenizer

BOUND_S = 20.0  # a hang case must end within this (it never ended before)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Where is Brindlewick?"}]
# SmolLM2-135M-Instruct's tokenizer.chat_template (ChatML), as its GGUF file has it
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclass
class Case:
    id: str
    run: Callable[[Path], object]
    error: type[BaseException] | None = None
    match: tuple[str, ...] = ()
    seconds: float = BOUND_S
    marks: list = field(default_factory=list)


# ----------------------------------------------------------------------------- chat templates
def _render(template: str) -> Callable[[Path], str]:
    return lambda _tmp: render(template, MESSAGES, True, source="model.gguf")


def _same_as_plain_jinja(template: str) -> Callable[[Path], None]:
    def run(_tmp):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        for add in (False, True):
            want = env.from_string(template).render(messages=MESSAGES, add_generation_prompt=add, bos_token="<s>",
                                                    eos_token="</s>")
            assert render(template, MESSAGES, add, "<s>", "</s>") == want
    return run


def _check_equal(got, want) -> None:
    assert got == want, (got, want)


class _CharTokenizer:
    """What core.chat_template.encode_messages needs: one id per character, a source file."""

    chat_template = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    bos_id, eos_id, add_bos, eog_ids, source = 0, 1, False, (1,), "smollm2.gguf"

    def token_bytes(self, i):
        return b"<s>" if i == 0 else b"</s>"

    def encode(self, text, parse_special=False):
        return [ord(c) for c in text]


TEMPLATE_CASES = [
    Case("template: nested range(100000) loops",
         _render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
         TemplateError, ("model.gguf", "tokenizer.chat_template", "range()")),
    Case("template: nested range(10000) loops, empty body",
         _render("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"),
         TemplateError, ("model.gguf", "tokenizer.chat_template", "loop steps")),
    Case("template: nested loops over a list (no range() in the loop)",
         _render("{% set r = range(10000)|list %}{% for a in r %}{% for b in r %}{{ '' }}{% endfor %}{% endfor %}"),
         TemplateError, ("tokenizer.chat_template", "loop steps")),
    Case("template: recursive macro", _render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
         TemplateError, ("model.gguf", "tokenizer.chat_template", "recurses")),
    Case("template: recursive macro through encode_messages names the tokenizer's file",
         lambda _tmp: encode_messages(_CharTokenizer(), MESSAGES, True),
         TemplateError, ("smollm2.gguf", "tokenizer.chat_template", "recurses")),
    Case("template: 'x' * 300000000", _render("{{ 'x' * 300000000 }}"),
         TemplateError, ("model.gguf", "tokenizer.chat_template", "repeats")),
    Case("template: a string doubled 60 times with +",
         _render("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
                 "{{ ns.s }}"),
         TemplateError, ("tokenizer.chat_template", "more than 1,000,000")),
    Case("template: a string doubled 60 times with ~",
         _render("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                 "{{ ns.s }}"),
         TemplateError, ("tokenizer.chat_template", "more than 1,000,000")),
    Case("template: a list repeated 10**9 times", _render("{{ ([1] * 1000000000)|length }}"),
         TemplateError, ("tokenizer.chat_template", "repeats")),
    Case("template: center(10**9)", _render("{{ 'x'|center(1000000000) }}"),
         TemplateError, ("tokenizer.chat_template", "filter")),
    Case("template: 'x'.ljust(10**9)", _render("{{ 'x'.ljust(1000000000) }}"),
         TemplateError, ("tokenizer.chat_template", "string method")),
    Case("template: 2 ** 100000000", _render("{{ 2 ** 100000000 }}"),
         TemplateError, ("tokenizer.chat_template", "exponent")),
    Case("template: a number squared 40 times",
         _render("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"),
         TemplateError, ("tokenizer.chat_template", "bits")),
    Case("template works: 2 ** 64, 7 // 2, '%s!' % 'a'", lambda _tmp: _check_equal(
        render("{{ 2 ** 64 }} {{ 7 // 2 }} {{ '%s!' % 'a' }}", []), "18446744073709551616 3 a!")),
    Case("template: output over 8,000,000 characters",
         _render("{% for i in range(9000) %}{{ 'y' * 1000 }}{% endfor %}"),
         TemplateError, ("tokenizer.chat_template", "output exceeds")),
    Case("template: a Python error inside (1 / 0)", _render("{{ 1 / 0 }}"), TemplateError,
         ("model.gguf", "tokenizer.chat_template", "cannot be rendered", "division by zero")),
    Case("template: 'a' + 1", _render("{{ 'a' + 1 }}"), TemplateError, ("tokenizer.chat_template", "cannot be rendered")),
    Case("template works: '%d'|format(2000000) (a big value, not a size)", lambda _tmp: _check_equal(
        render("{{ '%d'|format(2000000) }}", []), "2000000")),
    Case("template: invalid Jinja2", _render("{% for %}"), TemplateError, ("model.gguf", "not valid Jinja2")),
    Case("template: raise_exception", _render("{{ raise_exception('Only user and assistant roles') }}"),
         TemplateError, ("model.gguf", "refused the messages", "Only user and assistant roles")),
    Case("template works: SmolLM2's ChatML renders as plain Jinja2 does", _same_as_plain_jinja(CHATML)),
    Case("template works: our own CHAT_TEMPLATE renders as plain Jinja2 does",
         _same_as_plain_jinja(chat_format.CHAT_TEMPLATE)),
    Case("template works: loop.index, loop.last, recursive loops, ~, filters",
         _same_as_plain_jinja("{% for m in messages %}{{ loop.index }}:{{ m.role|upper ~ '/' ~ m.content|trim }}"
                              "{% if not loop.last %}|{% endif %}{% endfor %}{% for x in [[1, [2]], [3]] recursive %}"
                              "[{{ x if x is number else loop(x) }}]{% endfor %}{{ 'ab' * 3 }}{{ '%s-%d'|format('a', 2) }}"
                              "{{ range(3)|join(',') }}{{ messages|selectattr('role', 'eq', 'user')|list|length }}")),
    Case("template works: a 10,000-turn dialogue in ChatML",
         lambda _tmp: render(CHATML, [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"}
                                      for i in range(10_000)])),
]


# ----------------------------------------------------------------------------- GGUF headers
def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _gguf(path: Path, kvs: list[tuple[str, int, bytes]], tensors: list[tuple[str, int]] = (("a", 0),),
          align: int = 32) -> Path:
    """A GGUF v3 file: ``kvs`` as (key, value type, value bytes); F32 tensors of 8 values as (name, offset)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        out += _string(key) + struct.pack("<I", vtype) + value
    for name, offset in tensors:
        out += _string(name) + struct.pack("<I", 1) + struct.pack("<Q", 8) + struct.pack("<IQ", 0, offset)
    out += b"\0" * (-len(out) % max(align, 1))
    out += np.arange(8 * len(tensors) + 64, dtype=np.float32).tobytes()
    path.write_bytes(out)
    return path


ARCH_KV = ("general.architecture", 8, _string("llama"))


def _align(vtype: int, value: bytes, align: int = 32):
    return lambda tmp: read_gguf(_gguf(tmp / "m.gguf", [ARCH_KV, ("general.alignment", vtype, value)],
                                       align=align))


def _gguf_loads(tmp: Path) -> None:
    values, _types, infos = read_gguf(_gguf(tmp / "m.gguf", [ARCH_KV, ("general.alignment", 4, struct.pack("<I", 64))],
                                           [("a", 0), ("b", 64)], align=64))
    assert values["general.alignment"] == 64 and [i.offset % 64 for i in infos] == [0, 0]
    assert infos[1].offset - infos[0].offset == 64


def _gguf_model_round_trip(tmp: Path) -> None:
    from core.gguf_import import import_gguf
    from core.gguf_io import export_gguf

    m = _random_model()
    back = import_gguf(export_gguf(m, tmp / "m.gguf").path)
    assert all(np.array_equal(back.weights[k], m.weights[k]) for k in m.weights)


GGUF_CASES = [
    Case("gguf: general.alignment = 0", _align(4, struct.pack("<I", 0)), GGUFError,
         ("m.gguf", "general.alignment = 0", "power of 2")),
    Case("gguf: general.alignment as an array", _align(9, struct.pack("<IQ", 4, 1) + struct.pack("<I", 32)),
         GGUFError, ("m.gguf", "general.alignment", "an array")),
    Case("gguf: general.alignment negative", _align(5, struct.pack("<i", -32)), GGUFError,
         ("m.gguf", "general.alignment = -32", "power of 2")),
    Case("gguf: general.alignment not a power of 2", _align(4, struct.pack("<I", 48), align=48), GGUFError,
         ("m.gguf", "general.alignment = 48", "power of 2")),
    Case("gguf: general.alignment a string", _align(8, _string("32")), GGUFError,
         ("m.gguf", "general.alignment", "a string")),
    Case("gguf: a key twice",
         lambda tmp: read_gguf(_gguf(tmp / "m.gguf", [ARCH_KV, ("llama.block_count", 4, struct.pack("<I", 2)),
                                                      ("llama.block_count", 4, struct.pack("<I", 3))])),
         GGUFError, ("m.gguf", "key llama.block_count appears twice")),
    Case("gguf: a tensor twice", lambda tmp: read_gguf(_gguf(tmp / "m.gguf", [ARCH_KV], [("a", 0), ("a", 32)])),
         GGUFError, ("m.gguf", "tensor a appears twice")),
    Case("gguf: a tensor offset off the alignment",
         lambda tmp: read_gguf(_gguf(tmp / "m.gguf", [ARCH_KV], [("a", 0), ("b", 36)])),
         GGUFError, ("m.gguf", "tensor b", "not a multiple of general.alignment = 32")),
    Case("gguf works: alignment 64, aligned tensors", _gguf_loads),
    Case("gguf works: an exported model imports bit-exact", _gguf_model_round_trip),
]


# ----------------------------------------------------------------------------- recall prompts, datasets
_TOK: list[Tokenizer] = []


def _tok() -> Tokenizer:
    if not _TOK:
        _TOK.append(Tokenizer.train(default_dataset().tokenizer_texts(), vocab_size=400))
    return _TOK[0]


class _Counting:
    """A tokenizer that counts the characters it encodes (the work of building prompts)."""

    def __init__(self, tok):
        self.tok, self.chars = tok, 0
        self.bos_id, self.eos_id, self.pad_id = tok.bos_id, tok.eos_id, tok.pad_id

    def encode(self, text, parse_special=False):
        self.chars += len(text)
        return self.tok.encode(text, parse_special=parse_special)


def _long_dialogue(n: int) -> Dialogue:
    return Dialogue([(f"Question {i} about the town?", f"Answer {i} is the river.") for i in range(n)])


def _prompt_work(n_turns: int) -> int:
    from core.recall import recall_prompts

    counting = _Counting(_tok())
    recall_prompts(counting, Dataset([], [_long_dialogue(n_turns), _long_dialogue(3)]), 256)
    return counting.chars


def _linear_prompts(_tmp) -> None:
    small, large = _prompt_work(250), _prompt_work(1000)
    assert large / small < 8, (small, large)  # quadratic: 16


def _prompts_of_10000_turns(_tmp) -> None:
    from core.recall import recall_prompts

    prompts = recall_prompts(_tok(), Dataset([], [_long_dialogue(10_000), _long_dialogue(2)]), 256)
    assert prompts and all(len(p.ids) < 256 for p in prompts)


def _turn_prompts_equal(_tmp) -> None:
    turns = [(f"Question {i}?", f"Answer {i}.") for i in range(30)]
    for system in (None, "Be brief."):
        got = list(chat_format.turn_prompt_ids(_tok(), turns, system))
        assert got == [chat_format.prompt_ids(_tok(), turns[:k], turns[k][0], system) for k in range(len(turns))]


def _sampled_full_check(_tmp) -> None:
    from core.recall import FULL_CHECK_MAX, RecallItem, recall_prompts, sampled

    facts = [f"Town {i} lies beside the river number {i}." for i in range(12_000)]
    sizes: dict[str, int] = {}
    prompts = recall_prompts(_tok(), Dataset(facts, []), 256, ("fact",), sample=0, sizes=sizes)
    assert len(prompts) == FULL_CHECK_MAX and sizes == {"fact": 12_000}
    assert prompts[1].index - prompts[0].index == 2  # evenly spaced
    items = [RecallItem("fact", p.index, p.prompt, p.expected, "", False) for p in prompts]
    assert sampled(sizes, items) == {"fact": (FULL_CHECK_MAX, 12_000)}
    small = recall_prompts(_tok(), Dataset(facts[:50], []), 256, ("fact",), sizes=(s := {}))
    assert len(small) == 50 and sampled(s, []) == {"fact": (0, 50)} and not sampled(s, [
        RecallItem("fact", p.index, p.prompt, p.expected, "", False) for p in small])


def _sampled_verdict(_tmp) -> None:
    from core.plan import verdict_of
    from core.recall import RecallItem
    from core.trainer import StageReport

    items = [RecallItem("fact", i, "Town", " here.", " here.", True) for i in range(5)]
    text = verdict_of(StageReport("pretrain", 3, False, items, recall_sampled={"fact": (5, 100_000)})).text
    assert text == "Learned: 5 of 5 facts — try the model on the Chat tab (checked a sample: 5 of 100,000 facts)"


def _long_line(tmp: Path) -> None:
    path = tmp / "long.txt"
    path.write_text("word " * 1_000_000 + "\nA short fact.\n" + "w " * 45_000 + "\n", encoding="utf-8")
    tracemalloc.start()
    try:
        ds, problems = load_dataset(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [str(p) for p in problems] == [f"{path}:1: 5,000,000 characters, longer than the 100,000 an entry may "
                                          "have, skipped (split it into shorter facts)"]
    assert ds.facts[0] == "A short fact." and len(ds.facts) == 2
    assert peak < 100e6, peak  # the read buffer alone was 1 GiB


def _nul_line(tmp: Path) -> None:
    path = tmp / "nul.txt"
    path.write_bytes(b"A real fact.\n\0\0\0\0\0\nUser: Hi?\nAssistant: \0\0\n")
    ds, problems = load_dataset(path)
    assert ds.facts == ["A real fact."] and ds.dialogues == []
    assert str(problems[0]) == f"{path}:2: no visible text (only control characters such as NUL bytes), skipped"
    assert str(problems[1]).startswith(f"{path}:4: empty 'Assistant:' answer")


def _nul_jsonl(tmp: Path) -> None:
    path = tmp / "nul.jsonl"
    path.write_text('{"text": "\\u0000\\u0000"}\n{"text": "Fine."}\n', encoding="utf-8")
    ds, problems = load_dataset(path)
    assert ds.facts == ["Fine."] and str(problems[0]).startswith(f"{path}:1: no visible text")


def _not_trained(_tmp) -> None:
    from core.batches import dialogue_examples, fact_examples

    tok = _tok()
    ds = Dataset(["\0\0\0", "A fact."], [Dialogue([("Q?", ""), ("Where?", "There.")]), Dialogue([(" ", "A.")])])
    assert [p.message for p in ds.validate()] == [
        "no visible text (only control characters such as NUL bytes)", "empty answer", "empty question"]
    assert [e.ids for e in fact_examples(tok, ds.facts, 64)] == [chat_format.encode_fact(tok, "A fact.")]
    want = chat_format.encode_dialogue(tok, Dialogue([("Where?", "There.")]))[0]
    assert [e.ids for e in dialogue_examples(tok, ds.dialogues, 64)] == [want]


def _long_json_fact(tmp: Path) -> None:
    import json

    path = tmp / "d.json"
    path.write_text(json.dumps({"facts": ["x" * 200_000, "ok"], "dialogues": [
        {"system": None, "turns": [{"user": "q", "assistant": "y" * 200_000}]}]}), encoding="utf-8")
    ds, problems = load_dataset(path)
    assert ds.facts == ["ok"] and ds.dialogues == []
    assert [str(p) for p in problems] == [
        f"{path}:1: facts[0]: 200,000 characters, longer than the 100,000 an entry may have, skipped (split it "
        "into shorter facts)",
        f"{path}:1: dialogues[0]: a message of 200,000 characters, longer than the 100,000 an entry may have, "
        "skipped (split it into shorter facts)"]


DATA_CASES = [
    Case("recall: prompts of 250 vs 1,000 turns, linear", _linear_prompts),
    Case("recall: a 10,000-turn dialogue", _prompts_of_10000_turns),
    Case("recall works: each turn's prompt equals prompt_ids", _turn_prompts_equal),
    Case("recall: 12,000 facts, the full check is a sample that says n of N", _sampled_full_check),
    Case("recall: the verdict of a sampled table says it was a sample", _sampled_verdict),
    Case("dataset: a 5 MB line", _long_line),
    Case("dataset: a line of NUL bytes and a NUL answer", _nul_line),
    Case("dataset: a JSONL fact of NUL characters", _nul_jsonl),
    Case("dataset: a NUL fact, an empty answer, an empty question are not trained", _not_trained),
    Case("dataset: JSON entries over 100,000 characters", _long_json_fact),
]


# ----------------------------------------------------------------------------- HF folders, full disks
def _random_model(seed: int = 0, scale: float = 1.0) -> LoadedModel:
    tok = _tok()
    c = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                    context_length=64)
    rng = np.random.default_rng(seed)
    w = {n: (1 + 0.1 * rng.standard_normal(s)) if n.endswith("norm.weight") else
         scale * 0.2 * rng.standard_normal(s) for n, s in c.param_shapes()}
    return LoadedModel(c, tok, {k: v.astype(np.float32) for k, v in w.items()}, {}, Path("random"))


def _hf_folder(tmp: Path, weight_map_file: Callable[[Path], str] | None = None) -> Path:
    """An exported HF folder; with ``weight_map_file``, sharded: an index whose weight_map names the file
    that ``weight_map_file(folder)`` makes (the one shard, as save_pretrained writes large models)."""
    import json

    from core.hf_io import INDEX_FILE, WEIGHTS_FILE, export_hf

    folder = export_hf(_random_model(), tmp / "hf")
    if weight_map_file is not None:
        (folder / WEIGHTS_FILE).rename(folder / "model-00001-of-00001.safetensors")
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": {
            "model.embed_tokens.weight": weight_map_file(folder)}}))
    return folder


def _hf_index(target: Callable[[Path], str]) -> Callable[[Path], object]:
    def run(tmp):
        from core.hf_io import load_hf

        return load_hf(_hf_folder(tmp, target))
    return run


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "w.safetensors")
    return "w.safetensors"


def _link_out(folder: Path) -> str:
    (folder.parent / "outside.safetensors").write_bytes(b"")
    os.symlink(folder.parent / "outside.safetensors", folder / "in.safetensors")
    return "in.safetensors"


def _hf_sharded_loads(tmp: Path) -> None:
    from core.hf_io import load_hf

    config, weights, _tok_ = load_hf(_hf_folder(tmp, lambda folder: "model-00001-of-00001.safetensors"))
    assert set(weights) == {n for n, _ in config.param_shapes()}


def _hf_disk_full(tmp: Path, monkeypatch) -> None:
    import safetensors.numpy
    from safetensors import SafetensorError

    from core.hf_io import export_hf

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    try:
        export_hf(_random_model(), tmp / "hf")
    finally:
        assert sorted(p.name for p in tmp.iterdir()) == []  # nothing left behind


def _lock_disk_full(tmp: Path, monkeypatch) -> None:
    from core.folder_lock import FolderLock

    real = Path.write_text

    def full(self, *args, **kwargs):
        real(self, "")  # the file is created, then the write fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    try:
        FolderLock(tmp / "m").acquire()
    finally:
        assert [p.name for p in tmp.iterdir()] == []  # no .m.lock.*.tmp left


def _speed_cache_disk_full(tmp: Path, monkeypatch) -> None:
    import core.plan
    from core.device import open_device

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(core.plan, "store_speed", full)
    mc = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, context_length=16)
    assert core.plan.measure_speed(open_device(), mc, 2, 8, steps=1, use_cache=False) > 0  # a cache, not the run


def _q8_out_of_range(tmp: Path) -> None:
    from core.gguf_io import export_gguf

    m = _random_model()
    m.weights["blk.0.ffn_up.weight"][0, 0] = 1e7  # beyond the Q8_0 block scale's F16 range (65504 * 127)
    result = export_gguf(m, tmp / "q.gguf", dtype="q8_0")
    assert any(n.startswith("blk.0.ffn_up.weight: written as F32, not Q8_0 (values up to 1e+07") for n in result.notes)


def _cli(*argv: str) -> Callable[[Path], None]:
    def run(_tmp):
        from core.cli import build_parser

        build_parser().parse_args(list(argv))
    return run


class _ArgError(Exception):
    """argparse's error message (it exits; the case table wants the message)."""


def _cli_error(*argv: str) -> Callable[[Path], None]:
    def run(_tmp):
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
            _cli(*argv)(_tmp)
        raise _ArgError(err.getvalue().strip().splitlines()[-1])
    return run


def _sampling_nan(_tmp) -> None:
    from core.generate import SamplingSettings

    SamplingSettings(repetition_penalty=math.nan)


def _write_problem(tmp: Path, monkeypatch) -> None:
    import tempfile

    from gui.training_tab import folder_write_problem

    assert folder_write_problem(tmp / "not" / "yet") is None  # a folder the run would create: its parent is tested

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    raise _ArgError(folder_write_problem(tmp))


OTHER_CASES = [
    Case("hf: index names a FIFO", _hf_index(_fifo), HFError,
         ("model.safetensors.index.json", "weight_map", "w.safetensors", "not a regular file")),
    Case("hf: index names ../../../../etc/passwd", _hf_index(lambda f: "../../../../etc/passwd"), HFError,
         ("model.safetensors.index.json", "weight_map", "../../../../etc/passwd", "outside the folder")),
    Case("hf: index names an absolute path", _hf_index(lambda f: "/etc/passwd"), HFError,
         ("weight_map", "outside the folder")),
    Case("hf: index names a link out of the folder", _hf_index(_link_out), HFError,
         ("weight_map", "in.safetensors", "outside the folder")),
    Case("hf: index names a missing file", _hf_index(lambda f: "nope.safetensors"), HFError,
         ("weight_map", "nope.safetensors", "does not exist")),
    Case("hf works: a sharded folder inside loads", _hf_sharded_loads),
    Case("hf export: disk full", _hf_disk_full, OSError, ("hf/model.safetensors", "the disk is full")),
    Case("folder lock: disk full", _lock_disk_full, OSError, ("cannot write the lock file", ".m.lock",
                                                              "No space left on device")),
    Case("gguf export: q8_0 of weights beyond its range", _q8_out_of_range),
    # builds a new model's kernels: on a fresh clone with a cold PoCL cache that took 21.4 s (of the 20 s bound)
    Case("plan: a full disk under the speed cache does not end the run", _speed_cache_disk_full, seconds=60.0),
    Case("cli: --repetition-penalty nan", _cli_error("chat", "--repetition-penalty", "nan"), _ArgError,
         ("argument --repetition-penalty", "'nan' is not a finite number")),
    Case("cli: --seed -1", _cli_error("chat", "--seed", "-1"), _ArgError, ("argument --seed", "-1 is negative")),
    Case("cli: train --seed -1", _cli_error("train", "--seed", "-1"), _ArgError, ("argument --seed",)),
    Case("cli: train --pretrain-lr inf", _cli_error("train", "--pretrain-lr", "inf"), _ArgError,
         ("argument --pretrain-lr", "not a finite number")),
    Case("cli: --temperature=-inf", _cli_error("chat", "--temperature=-inf"), _ArgError,
         ("argument --temperature", "'-inf' is not a finite number")),
    Case("cli: --top-p x", _cli_error("chat", "--top-p", "x"), _ArgError, ("argument --top-p", "'x' is not a number")),
    Case("cli works: normal chat flags", _cli("chat", "--repetition-penalty", "1.1", "--seed", "3", "--top-k", "0")),
    Case("sampling: repetition_penalty NaN", _sampling_nan, ValueError, ("repetition_penalty", "finite")),
    Case("gui: a read-only project folder", _write_problem, _ArgError, ("cannot write here", "Read-only file system",
                                                                        "Save project as")),
]

CASES = TEMPLATE_CASES + GGUF_CASES + DATA_CASES + OTHER_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_break_it(case: Case, tmp_path: Path, monkeypatch) -> None:
    import inspect

    args = (tmp_path, monkeypatch) if len(inspect.signature(case.run).parameters) == 2 else (tmp_path,)
    t0 = time.monotonic()
    if case.error is None:
        case.run(*args)
    else:
        with pytest.raises(case.error) as info:
            case.run(*args)
        message = str(info.value)
        assert "\n" not in message and "Traceback" not in message, message
        for part in case.match:
            assert part in message, f"{part!r} not in {message!r}"
    assert time.monotonic() - t0 < case.seconds


def test_the_table_has_cases_that_already_worked():
    assert sum(c.error is None for c in CASES) >= 8 and len(CASES) >= 50


def test_the_training_tab_refuses_a_read_only_project(main_window, dialogs, monkeypatch):
    import gui.run_setup

    from tests.test_gui_e2e import configure_tiny

    configure_tiny(main_window)
    monkeypatch.setattr(gui.run_setup, "folder_write_problem",  # the Training tab's run checks (gui/run_setup.py)
                        lambda folder: f"{folder}: cannot write here (Read-only file system)")
    t = main_window.training_tab
    assert not t.start()
    assert not t.is_running()
    assert dialogs.warned and "Read-only file system" in dialogs.warned[0][1]
    assert "Read-only file system" in t.banner_text.text()


def test_the_training_tab_says_when_the_table_is_a_sample(main_window):
    from core.recall import RecallItem
    from gui.events import StageDone

    item = RecallItem("fact", 0, "Town 0", " lies here.", " lies here.", True)
    main_window.training_tab._on_stage_done(StageDone("pretrain", 10, False, (item,),
                                                      recall_sampled={"fact": (5_000, 100_000)}))
    assert "Checked a sample of the facts: 5,000 of 100,000." in main_window.training_tab.recall_label.text()


def test_entries_with_nothing_to_train_are_neither_counted_nor_checked():
    """A fact of spaces alone and a dialogue without turns (or without a turn of text) are warned about and not
    trained: the run's dataset line leaves them out, and the recall check asks nothing of them (a fact of spaces was
    a prompt expecting '   ', so a run could not end 'Learned')."""
    from core.recall import recall_prompts
    from core.run import dataset_line

    ds = Dataset(["The Bexa shop opens at nine.", "   ", "\x00"],
                 [Dialogue([]), Dialogue([("What time does the Bexa shop open?", "")]),
                  Dialogue([("What time does the Bexa shop open?", "At nine.")]),
                  Dialogue([("Where is the Bexa shop?", "By the river.")])])
    assert dataset_line(ds) == "dataset: 1 fact, 2 dialogues (4 entries with nothing to train left out)"
    left_out: dict = {}
    prompts = recall_prompts(_tok(), ds, 256, left_out=left_out)
    assert [(p.kind, p.index) for p in prompts if p.kind != "chat"] == [("fact", 0), ("dialogue", 2), ("dialogue", 3)]
    assert all(p.expected.strip() for p in prompts) and left_out == {"fact": {}, "dialogue": {}}
    assert dataset_line(default_dataset()) == "dataset: 25 facts, 13 dialogues"
