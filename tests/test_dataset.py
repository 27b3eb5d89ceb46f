"""Dataset readers (real-world cases in tests/data), writers, validation, hash, default dataset."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.chat_format import SPECIAL_TOKENS
from core.dataset import (Dataset, DatasetError, Dialogue, Problem, dataset_hash, default_dataset, export_jsonl,
                          export_text, load_dataset, save_dataset)
from core.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _all_texts(ds: Dataset) -> list[str]:
    out = list(ds.facts)
    for d in ds.dialogues:
        out += [d.system or ""] + [t for turn in d.turns for t in turn]
    return out


# ---- the real cases (tests/data, copied from the shared case collection) ----------------------

def test_case_dialogues_crlf(tmp_path):
    raw = (DATA / "dialogues_crlf.txt").read_bytes()
    assert b"\r\n" in raw  # guard: the fixture must keep its Windows line ends
    ds, problems = load_dataset(DATA / "dialogues_crlf.txt")
    assert problems == [] and ds.facts == []
    assert [len(d.turns) for d in ds.dialogues] == [1, 2]
    assert ds.dialogues[1].turns == [("How many legs does a spider have?", "A spider has eight legs."),
                                     ("And an ant?", "An ant has six legs.")]
    lf, _ = load_dataset(_write(tmp_path, "lf.txt", raw.replace(b"\r\n", b"\n")))
    assert lf == ds
    assert not any("\r" in t for t in _all_texts(ds))
    tok = Tokenizer.train(ds.tokenizer_texts(), 300)
    used = {i for text in ds.tokenizer_texts() for i in tok.encode(text)}
    assert used and not any(b"\r" in tok.token_bytes(i) for i in used)
    assert not any(b"\r" in tok.token_bytes(i) for i in range(259, tok.vocab_size))  # no merge learned a CR


def test_case_facts_cr_only():
    raw = (DATA / "facts_cr_only.txt").read_bytes()
    assert b"\r" in raw and b"\n" not in raw
    ds, problems = load_dataset(DATA / "facts_cr_only.txt")
    assert problems == [] and ds.dialogues == []
    assert ds.facts == ["Iron is a metal.", "The moon orbits the Earth.", "A week has seven days."]


def test_case_facts_bom_unicode():
    assert (DATA / "facts_bom_unicode.txt").read_bytes().startswith(b"\xef\xbb\xbf")
    ds, problems = load_dataset(DATA / "facts_bom_unicode.txt")
    assert problems == []
    assert len(ds.facts) == 5
    assert ds.facts[0] == "El café se cultiva en Colombia."  # BOM gone
    assert ds.facts[2] == "The emoji for fire is 🔥."
    assert ds.facts[3] == "Москва is the capital of Russia."
    assert ds.facts[4] == "Leading and trailing spaces are trimmed."
    assert all(f == f.strip() and "\ufeff" not in f for f in ds.facts)
    tok = Tokenizer.train(ds.tokenizer_texts(), 300)
    for f in ds.facts:
        assert tok.decode(tok.encode(f)).encode("utf-8") == f.encode("utf-8")


def test_case_messages_jsonl():
    path = DATA / "messages.jsonl"
    ds, problems = load_dataset(path)
    assert len(ds.dialogues) == 3
    assert ds.dialogues[1].system == "You answer briefly."
    assert ds.dialogues[2].turns == [("What is 2 plus 2?", "2 plus 2 is 4."), ("And 3 plus 3?", "3 plus 3 is 6.")]
    assert [p.line for p in problems] == [3, 4]
    assert str(problems[0]).startswith(f"{path}:3: ")
    assert "narrator" in str(problems[1]) and str(problems[1]).startswith(f"{path}:4: ")


# ---- readers ----------------------------------------------------------------------------------

def test_a_name_given_twice_in_an_object_is_noted(tmp_path):
    """JSON keeps the last value of a name given twice ({"text": A, "text": B} reads B): A was dropped without a
    word. A reader asking for notes (the CLI) gets one naming the file, the line (JSONL) and the name; what is read
    is as before, and nothing counts as a skipped entry (an app's project with such a dataset.json still opens)."""
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"text": "Mira Tolsen plays the cello.", "text": "Biscuit is a brown dog."}\n\n'
                  '{"messages": [{"role": "user", "content": "What colour is Biscuit?", "cöntent": "x", "cöntent": "y",'
                  ' "content": "Which colour?"}, {"role": "assistant", "content": "Brown."}]}\n'
                  '{"text": "Oskar Brun was born in 1902."}\n', encoding="utf-8")
    notes: list[str] = []
    ds, problems = load_dataset(jl, notes)
    assert ds.facts == ["Biscuit is a brown dog.", "Oskar Brun was born in 1902."] and problems == []
    assert ds.dialogues[0].turns == [("Which colour?", "Brown.")]
    assert notes == [f'{jl}:1: "text" given twice in an object; only its last value is read',
                     f'{jl}:3: "cöntent", "content" given twice in an object; only the last value of each is read']
    assert load_dataset(jl) == (ds, [])  # no notes asked for: none made
    js = tmp_path / "d.json"
    js.write_text('{"facts": ["Mira Tolsen plays the cello."],\n "facts": ["Biscuit is a brown dog."], '
                  '"dialogues": []}', encoding="utf-8")
    notes = []
    ds, problems = load_dataset(js, notes)
    assert ds.facts == ["Biscuit is a brown dog."] and problems == []
    assert notes == [f'{js}: "facts" given twice in an object; only its last value is read']
    js.write_text('{"facts": ["Biscuit is a brown dog."], "dialogues": []}', encoding="utf-8")
    notes = []
    assert load_dataset(js, notes)[1] == [] and notes == []


def test_not_utf8_names_the_file(tmp_path):
    path = _write(tmp_path, "latin1.txt", "Caf\u00e9 au lait.\n".encode("latin-1"))
    with pytest.raises(DatasetError, match="latin1.txt:1: the file is not UTF-8") as e:
        load_dataset(path)
    assert isinstance(e.value, ValueError)


def test_a_gguf_model_given_as_the_dataset_says_what_it_is(tmp_path):
    """A new user gave their model file as --data and read 'bakery.gguf:1: the file is not UTF-8 text (byte 0xb2)'."""
    path = _write(tmp_path, "bakery.gguf", b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    with pytest.raises(DatasetError) as e:
        load_dataset(path)
    assert str(e.value) == (f"{path}: a GGUF model file, not a dataset; to teach it your data, give it as the base "
                            "model (train --base FILE.gguf --data DATASET, or the Hyperparameters tab)")
    # a text that starts with the word is a text (a break-it helper's 'GGUF is a file format for models.')
    for text in ("GGUF is a file format for models.\nThe sky is blue.\n", "GGUF\nThe sky is blue.\n"):
        assert load_dataset(_write(tmp_path, "gguf.txt", text.encode()))[0].facts[-1] == "The sky is blue."


def test_text_format_dialogues_and_facts(tmp_path):
    path = _write(tmp_path, "mixed.txt", (
        "  A fact.  \n"
        "User: Q1\n"
        "Assistant: A1\n"
        "user:Q2\n"
        "ASSISTANT:   A2  \n"
        "\n\n"
        "System: Be brief.\n"
        "User: Q3\n"
        "Assistant: A3\n"
        "Another fact.\n"
    ))
    ds, problems = load_dataset(path)
    # a fact line ends a dialogue; right after an answer it may be the answer wrapped onto two lines: said so
    assert [str(p) for p in problems] == [f"{path}:11: text right after the answer on line 10 is read as a fact, "
                                          "not as more of that answer (an answer is one line; leave a blank line "
                                          "before a fact)"]
    assert ds.facts == ["A fact.", "Another fact."]
    assert ds.dialogues == [Dialogue([("Q1", "A1"), ("Q2", "A2")]), Dialogue([("Q3", "A3")], "Be brief.")]
    path.write_text(path.read_text().replace("Another fact.", "\nAnother fact."))
    assert load_dataset(path) == (ds, [])


def test_text_format_malformed_lines_are_reported(tmp_path):
    path = _write(tmp_path, "bad.txt", (
        "Assistant: orphan answer\n"   # 1
        "User: unanswered\n"           # 2
        "User: Q\n"                    # 3
        "Assistant: A\n"               # 4
        "User: Q2\n"                   # 5
        "Assistant:\n"                 # 6 empty answer
        "User:\n"                      # 7 empty question
        "\n"
        "System: alone\n"              # 9
        "\n"
        "User: last\n"                 # 11, file ends
    ))
    ds, problems = load_dataset(path)
    assert ds.dialogues == [Dialogue([("Q", "A")])] and ds.facts == []
    assert [p.line for p in problems] == [1, 2, 6, 7, 9, 11]
    assert all(isinstance(p, Problem) and str(p).startswith(f"{path}:{p.line}: ") for p in problems)


def test_jsonl_facts_and_bad_records(tmp_path):
    lines = [
        {"text": "  A fact.  "},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "system", "content": "late"}]},
        {"messages": [{"role": "user", "content": "Q"}]},
        {"messages": [{"role": "user", "content": ["parts"]}, {"role": "assistant", "content": "A"}]},
        {"messages": [{"role": "assistant", "content": "A"}]},
        {"other": 1},
        [1, 2],
        {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": " Q "},
                      {"role": "assistant", "content": " A "}]},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n\n"
    ds, problems = load_dataset(_write(tmp_path, "chat.jsonl", text))
    assert ds.facts == ["A fact."]
    assert ds.dialogues == [Dialogue([("Q", "A")], None)]
    assert [p.line for p in problems] == [2, 3, 4, 5, 6, 7]


def test_format_is_sniffed_for_other_extensions(tmp_path):
    ds = Dataset(["A fact."], [Dialogue([("Q", "A")], "S")])
    save_dataset(ds, tmp_path / "a.json")
    app_json = (tmp_path / "a.json").read_bytes()
    assert load_dataset(_write(tmp_path, "a.data", app_json)) == (ds, [])
    export_jsonl(ds, tmp_path / "b.jsonl")
    assert load_dataset(_write(tmp_path, "b.txt", (tmp_path / "b.jsonl").read_bytes())) == (ds, [])


def test_app_json_bad_entries_are_skipped(tmp_path):
    doc = {"format": "opencl-llm-studio-dataset", "version": 1, "facts": ["ok", 3, None],
           "dialogues": [{"system": None, "turns": [{"user": "Q", "assistant": "A"}]},
                         {"turns": [{"user": "Q"}]}, "nonsense", {"system": 5, "turns": []}]}
    ds, problems = load_dataset(_write(tmp_path, "d.json", json.dumps(doc, indent=1)))
    assert ds == Dataset(["ok"], [Dialogue([("Q", "A")])])
    assert len(problems) == 5
    assert str(problems[0]) == f"{tmp_path / 'd.json'}:6: facts[1]: not text, skipped"  # the item's line
    assert [p.line for p in problems] == [6, 7, 19, 26, 27]  # where each item begins


def test_a_json_list_of_strings_is_a_list_of_facts(tmp_path):
    """["fact", "fact"] is the first JSON dataset a user writes: its strings are facts, as {"text": ...} records are
    (it was refused: "no facts or dialogues could be read"); a "text" that is no string and an empty one are named.
    From a new user's trial."""
    path = _write(tmp_path, "facts.json", json.dumps(["The Kappa lamp costs $12.", " Ada lives in Oslo. ",
                                                      {"text": 5}, {"text": ""}, ["nested"]], indent=1))
    ds, problems = load_dataset(path)
    assert ds == Dataset(["The Kappa lamp costs $12.", "Ada lives in Oslo."], [])
    assert [str(p) for p in problems] == [
        f"{path}:4: item [2]: \"text\" must be a string, not a number, skipped",
        f"{path}:7: item [3]: empty text, skipped",
        f"{path}:10: item [4]: expected {{\"messages\": [...]}}, {{\"text\": ...}} or a string, skipped"]


def test_json_list_problems_name_the_item_and_its_line(tmp_path):
    """A JSON list of chat records (as some tools write) names each skipped item by its index and line, as a
    .jsonl file names its lines; a repeated key, strings with brackets and CRLF line ends do not mislead it."""
    items = [{"text": "A [fact], {really}."}, 5, {"messages": [{"role": "user"}]},
             {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}, {"text": "\x00"}]
    path = _write(tmp_path, "list.json", json.dumps(items, indent=1).replace("\n", "\r\n"))
    ds, problems = load_dataset(path)
    assert ds == Dataset(["A [fact], {really}."], [Dialogue([("Q", "A")])])
    assert [str(p) for p in problems] == [
        f"{path}:5: item [1]: expected {{\"messages\": [...]}}, {{\"text\": ...}} or a string, skipped",
        f"{path}:6: item [2]: message 1 has no text content, skipped",
        f"{path}:25: item [4]: no visible text (only control characters), skipped"]
    lines = path.read_text().splitlines()
    assert lines[4].strip() == "5," and lines[24].strip() == "{"
    doc = '{"facts": [1], "dialogues": [], "facts": ["ok",\n 2]}'  # json.loads keeps the last "facts"
    assert [str(p) for p in load_dataset(_write(tmp_path, "d.json", doc))[1]] == \
        [f"{tmp_path / 'd.json'}:2: facts[1]: not text, skipped"]


def test_a_lone_surrogate_is_a_skipped_entry_named_by_its_line(tmp_path):
    """JSON's "\\ud800" alone decodes to a character no UTF-8 encodes: the whole run failed at the tokenizer with
    "'utf-8' codec can't encode character" and no file or line. Each such entry is skipped with a warning."""
    jl = _write(tmp_path, "d.jsonl", '{"text": "Iron is a metal."}\n{"text": "a\\ud800b"}\n'
                '{"messages": [{"role": "user", "content": "q\\udc00"}, {"role": "assistant", "content": "a"}]}\n')
    ds, problems = load_dataset(jl)
    assert ds.facts == ["Iron is a metal."] and not ds.dialogues
    assert [str(p) for p in problems] == [
        f"{jl}:2: holds an invalid character (a lone UTF-16 surrogate such as \\ud800), skipped",
        f"{jl}:3: message 1 holds an invalid character (a lone UTF-16 surrogate such as \\ud800), skipped"]
    js = _write(tmp_path, "d.json", '{"facts": ["ok", "x\\ud800"],\n "dialogues": [{"turns": [{"user": "Hi", '
                '"assistant": "\\udfff"}]}]}')
    ds, problems = load_dataset(js)
    assert ds.facts == ["ok"] and not ds.dialogues and len(problems) == 2
    assert "facts[1]: holds an invalid character" in str(problems[0])
    assert "dialogues[0]: a message holds an invalid character" in str(problems[1])


@pytest.mark.parametrize("content, match", [
    ('{"facts": ["a",', r"d.json:1: broken JSON"),
    ('{"format": "opencl-llm-studio-dataset", "version": 2, "facts": []}', "newer"),
    ('{"something": "else"}', "not an OpenCL LLM Studio dataset"),
    ('{"format": "other", "facts": []}', "unknown format"),
    ('{"format": "opencl-llm-studio-dataset", "version": 1.0, "facts": []}',
     r"field 'version' must be a whole number 1 or more, got 1.0"),  # was "version 1.0 is newer than ... (1)"
])
def test_app_json_whole_file_errors(tmp_path, content, match):
    with pytest.raises(DatasetError, match=match):
        load_dataset(_write(tmp_path, "d.json", content))


# ---- writers ----------------------------------------------------------------------------------

SAMPLE = Dataset(
    facts=["Iron is a metal.", "Café 🔥 Москва."],
    dialogues=[Dialogue([("Q1?", "A1."), ("Q2?", "A2.")], "Be brief."), Dialogue([("Q3?", "A3.")])],
)


@pytest.mark.parametrize("writer, name", [(save_dataset, "d.json"), (export_text, "d.txt"), (export_jsonl, "d.jsonl")])
def test_writers_round_trip(tmp_path, writer, name):
    writer(SAMPLE, tmp_path / name)
    raw = (tmp_path / name).read_bytes()
    assert b"\r" not in raw and raw.endswith(b"\n")
    assert load_dataset(tmp_path / name) == (SAMPLE, [])
    assert os.listdir(tmp_path) == [name]


def test_export_text_flattens_line_breaks(tmp_path):
    export_text(Dataset(["two\nlines"], [Dialogue([("a\r\nb", "c")])]), tmp_path / "x.txt")
    ds, _ = load_dataset(tmp_path / "x.txt")
    assert ds == Dataset(["two lines"], [Dialogue([("a b", "c")])])


@pytest.mark.parametrize("broken", ["replace", "fsync"])
def test_save_is_atomic(tmp_path, monkeypatch, broken):
    path = tmp_path / "d.json"
    save_dataset(SAMPLE, path)
    before = path.read_bytes()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, broken, fail)
    with pytest.raises(OSError, match="disk full"):
        save_dataset(Dataset(["other"]), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["d.json"]


# ---- validation, hash, default dataset ------------------------------------------------------

def test_validate_names_the_entries():
    ds = Dataset(
        facts=["fine", "  ", "has <|eos|> inside"],
        dialogues=[Dialogue([("Q", "A")]), Dialogue([("", "A"), ("Q", " ")]), Dialogue([]),
                   Dialogue([("Q <|bos|>", "A")], system="S <|pad|>")],
    )
    issues = ds.validate()
    assert [(p.kind, p.index, p.turn) for p in issues] == [
        ("fact", 1, None), ("fact", 2, None), ("dialogue", 1, 0), ("dialogue", 1, 1), ("dialogue", 2, None),
        ("dialogue", 3, None), ("dialogue", 3, 0)]
    assert str(issues[0]) == "fact 2: empty fact"
    assert str(issues[3]) == "dialogue 2, turn 2: empty answer"
    assert "<|eos|>" in str(issues[1])


def test_validate_too_long():
    tok = Tokenizer.train(default_dataset().tokenizer_texts(), 400)
    ds = Dataset(["short fact", "word " * 40], [Dialogue([("Q", "A")]), Dialogue([("Q " * 30, "A")])])
    issues = ds.validate(tokenizer=tok, max_tokens=16)
    assert [(p.kind, p.index) for p in issues] == [("fact", 1), ("dialogue", 1)]
    assert "where the model's context holds 15: trained in pieces of the context, and not checked for recall" \
        in str(issues[0])  # what happens to it, not only that it is long
    assert str(issues[1]).endswith("trained in pieces of the context")  # a dialogue's turns may still be checked
    assert ds.validate(max_tokens=16) == []  # no tokenizer: lengths are not checked


def test_validate_names_the_file_and_line_of_a_located_dataset(tmp_path):
    """Read with ``located=True`` (the CLI), a problem names the entry's file and line (a JSON file's item too),
    not only its number; an entry edited, added or moved since it was read is named by its number alone."""
    tok = Tokenizer.train(default_dataset().tokenizer_texts(), 400)
    long = "word " * 40
    ds = Dataset(["A fact.", long], [Dialogue([("Q <|eos|>", "A")], "S"), Dialogue([("Q", "A")])])
    where = {"d.txt": ["d.txt:2: fact 2", "d.txt:4: dialogue 1, turn 1"],  # a blank line, then the dialogues
             "d.jsonl": ["d.jsonl:2: fact 2", "d.jsonl:3: dialogue 1, turn 1"],
             "d.json": ["d.json:6: facts[1]: fact 2", "d.json:9: dialogues[0]: dialogue 1, turn 1"]}
    for name, writer in (("d.txt", export_text), ("d.jsonl", export_jsonl), ("d.json", save_dataset)):
        writer(ds, tmp_path / name)
        read, _ = load_dataset(tmp_path / name, located=True)
        problems = [str(p) for p in read.validate(tok, 40)]
        assert [p.split(": too long")[0].split(": contains")[0] for p in problems] == \
            [f"{tmp_path / w}" for w in where[name]], problems
        assert str(load_dataset(tmp_path / name)[0].validate(tok, 40)[0]).startswith("fact 2: too long")
    items = [{"text": "A fact."}, 7, {"text": long}]
    read, _ = load_dataset(_write(tmp_path, "list.json", json.dumps(items, indent=1)), located=True)
    assert str(read.validate(tok, 40)[0]).startswith(f"{tmp_path / 'list.json'}:6: item [2]: fact 2: too long")
    read.facts.insert(0, long)  # fact 1 is new, fact 3 the one read as fact 2
    read.dialogues.append(Dialogue([("Q <|pad|>", "A")]))
    assert [str(p).split(": ")[0] for p in read.validate(tok, 40)] == ["fact 1", "fact 3", "dialogue 1, turn 1"]


def test_a_file_named_for_another_format_is_read_as_text_with_a_note(tmp_path):
    """A .csv of questions and answers is read as plain text (each line a fact, as documented); the reader says
    so to whoever asks (the CLI prints it), and says nothing for .txt or for JSON content under any name."""
    notes = []
    ds, problems = load_dataset(_write(tmp_path, "qa.csv", "question,answer\nWho runs the mill?,Odile\n"), notes)
    assert ds.facts == ["question,answer", "Who runs the mill?,Odile"] and not problems
    assert len(notes) == 1 and "qa.csv: read as plain text" in notes[0] and ".json, .jsonl and .txt" in notes[0]
    for name, text in [("a.txt", "A fact.\n"), ("b.csv", json.dumps(SAMPLE.to_dict())), ("c.md", '{"text": "A fact."}\n')]:
        notes = []
        load_dataset(_write(tmp_path, name, text), notes)
        assert notes == [], name
    assert load_dataset(_write(tmp_path, "d.csv", "x\n"))[0].facts == ["x"]  # no list given: no note, same data


def test_dataset_hash_is_canonical(tmp_path):
    h = dataset_hash(SAMPLE)
    assert len(h) == 64 and h == dataset_hash(Dataset(list(SAMPLE.facts), list(SAMPLE.dialogues)))
    doc = SAMPLE.to_dict()
    shuffled = {k: doc[k] for k in reversed(list(doc))}
    reread, _ = load_dataset(_write(tmp_path, "s.json", json.dumps(shuffled, indent=4, ensure_ascii=True)))
    assert dataset_hash(reread) == h
    assert dataset_hash(Dataset(SAMPLE.facts + ["x"], SAMPLE.dialogues)) != h
    assert dataset_hash(Dataset(SAMPLE.facts, [Dialogue([("Q3?", "A3.")], "S")])) != dataset_hash(
        Dataset(SAMPLE.facts, [Dialogue([("Q3?", "A3.")])]))


def test_default_dataset_shape():
    ds = default_dataset()
    assert len(ds.facts) == 25 and len(ds.dialogues) == 13
    assert ds.validate() == []
    assert len(set(ds.facts)) == len(ds.facts)
    assert all(6 <= len(f.split()) <= 14 for f in ds.facts)
    assert 1 <= sum(len(d.turns) == 2 for d in ds.dialogues) <= 2
    assert all(len(d.turns) in (1, 2) for d in ds.dialogues)
    assert all(len(a.split()) < 20 for d in ds.dialogues for _, a in d.turns)
    assert all(u.endswith("?") for d in ds.dialogues for u, _ in d.turns)
    texts = ds.tokenizer_texts()
    assert len(texts) == 38 and not any(t in x for x in texts for t in SPECIAL_TOKENS)


def test_text_export_reports_what_it_cannot_keep(tmp_path):
    from core.dataset import Dataset, Dialogue, export_text, load_dataset

    ds = Dataset(facts=["Plain fact.", "System: the solar system has eight planets.", "Two\nlines."],
                 dialogues=[Dialogue(turns=[("Hi", "Hello")])])
    lossy = export_text(ds, tmp_path / "d.txt")
    assert [(p.kind, p.index) for p in lossy] == [("fact", 1), ("fact", 2)]
    assert "role line" in str(lossy[0])
    clean = Dataset(facts=["Plain fact."], dialogues=[Dialogue(turns=[("Hi", "Hello")])])
    assert export_text(clean, tmp_path / "c.txt") == []
    back, problems = load_dataset(tmp_path / "c.txt")
    assert back.facts == clean.facts and back.dialogues[0].turns == [("Hi", "Hello")] and not problems


def test_q_and_a_lines_are_read_as_facts_and_said_so_once(tmp_path):
    """A new user's notes had "Q: ..." / "A: ..." lines: silently kept as facts. Still facts (the format's dialogue
    lines are User:/Assistant:), with one warning naming the first such line."""
    p = tmp_path / "notes.txt"
    p.write_text("The shop opens at 9.\nQ: When do you open?\nA: At 9.\nanswer: no\n\nUser: hi\nAssistant: hello\n")
    ds, problems = load_dataset(p)
    assert ds.facts == ["The shop opens at 9.", "Q: When do you open?", "A: At 9.", "answer: no"]
    assert len(ds.dialogues) == 1
    assert [str(x) for x in problems] == [f"{p}:2: 'Q:' is read as a fact, not as a dialogue's line (nor is any later "
                                          "line like it); a dialogue's lines begin 'User:' and 'Assistant:'"]
