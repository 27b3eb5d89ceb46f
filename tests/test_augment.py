"""Issue 9 items 4-5 without a device: the towns test data, questions for facts without a dialogue in the
dataset's own patterns, conversations of several dialogues, the batches that mix them, the recall
prompts asked in the middle of a conversation, and the verdict that reports them."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from core import augment
from core.config import PRESETS, replace
from core.dataset import Dataset, Dialogue, load_dataset
from core.recall import chat_every, chat_history, recall_prompts
from core.tokenizer import Tokenizer
from core.trainer import Batches
from tests.make_towns_dataset import ATTRIBUTES, FACTS_PER_TOWN, make_towns, write

ROOT = Path(__file__).resolve().parent.parent


def _dataset(towns) -> Dataset:
    return Dataset(list(towns.facts), [Dialogue([qa]) for qa in towns.dialogues])


def test_towns_data_is_deterministic_and_shaped_as_issue_9_says(tmp_path):
    t = make_towns()
    assert make_towns() == t and make_towns(seed=1) != t
    assert len(t.towns) == len(set(t.towns)) == 200 and len(t.facts) == len(set(t.facts)) == 2000
    assert len(t.dialogues) == 200 and len(t.heldout) == 200
    facts = set(t.facts)
    assert all(a in facts and a.count(".") >= 1 for _, a in t.dialogues + t.heldout)
    assert len({a for _, a in t.dialogues}) == 200  # every dialogue asks about a different fact
    held = set(t.towns[180:])
    assert not any(town in q for q, _ in t.dialogues for town in held)  # held-out towns are never asked about
    assert {a for _, a in t.heldout} == set(t.facts[1800:])
    write(t, tmp_path / "towns.txt", tmp_path / "heldout.txt")
    ds, problems = load_dataset(tmp_path / "towns.txt")
    assert not problems and ds.facts == t.facts and [d.turns[0] for d in ds.dialogues] == t.dialogues
    ho, problems = load_dataset(tmp_path / "heldout.txt")
    assert not problems and not ho.facts and [d.turns[0] for d in ho.dialogues] == t.heldout
    first = (tmp_path / "towns.txt").read_bytes()
    write(make_towns(), tmp_path / "towns.txt")
    assert (tmp_path / "towns.txt").read_bytes() == first


def test_fact_questions_use_the_datasets_own_patterns_for_facts_without_a_dialogue():
    """Every fact without a dialogue gets a question about its own town, worded like one of the
    generator's questions for that very attribute (the pattern matching found the right kind of fact)."""
    t = make_towns(40, 40, 4, seed=3)  # its 40 dialogues ask about every kind of fact
    ds = _dataset(t)
    qs = augment.fact_questions(ds, per_fact=1)
    answered = {a for _, a in t.dialogues}
    want = [i for i, f in enumerate(t.facts) if f not in answered]
    assert [i for i, _, _ in qs] == want
    for i, q, a in qs:
        town, attr = t.towns[i // FACTS_PER_TOWN], ATTRIBUTES[i % FACTS_PER_TOWN]
        assert a == t.facts[i]
        assert q in [w.format(town=town) for w in attr.questions], (q, a)
    two = augment.fact_questions(ds, per_fact=2)
    assert len(two) > len(qs) and len({(i, q) for i, q, _ in two}) == len(two)
    assert augment.fact_questions(ds, per_fact=1) == qs  # a pure function
    assert augment.fact_questions(Dataset(ds.facts, [])) == []  # no dialogues: no patterns


def test_fact_questions_by_analogy_put_the_facts_own_item_and_value_into_answers_worded_unlike_it():
    """A dialogue is linked to the fact it asks about even when its answer is worded unlike the fact;
    a fact of the same kind gets that question and answer with its own item and value put in."""
    ds = Dataset(["The Alto kettle costs $40.", "The Bexa kettle costs $25.", "The Alto kettle is made by Halvard.",
                  "The Bexa kettle is made by Mintel.", "The Cora lamp costs $12.", "The Cora lamp is made by Trask."],
                 [Dialogue([("How much is the Alto kettle?", "It costs $40.")]), Dialogue([("hi", "hello")]),
                  Dialogue([("Who makes the Bexa kettle?", "Mintel makes it.")])])
    assert [(p.fact, p.dialogue) for p in augment.patterns(ds)] == [(0, 0), (3, 2)]  # "hi" asks about no fact
    assert augment.fact_questions(ds) == [(1, "How much is the Bexa kettle?", "It costs $25."),
                                          (2, "Who makes the Alto kettle?", "Halvard makes it."),
                                          (4, "How much is the Cora lamp?", "It costs $12."),
                                          (5, "Who makes the Cora lamp?", "Trask makes it.")]
    # a possessive in the question follows the new name; a question that would not name the fact's item is none
    people = Dataset(["Ada Stroud's favourite colour is red.", "Bram Vance's favourite colour is teal.",
                      "Cleo Moreau's favourite colour is red."],
                     [Dialogue([("Which colour does Ada Stroud like best?", "Red, like Ada Stroud's coat.")])])
    assert augment.fact_questions(people) == [(1, "Which colour does Bram Vance like best?", "Teal, like Bram Vance's coat."),
                                              (2, "Which colour does Cleo Moreau like best?", "Red, like Cleo Moreau's coat.")]


def test_a_value_of_another_length_is_put_in_whole():
    """Break-it finding: with only one-for-one word replacements "$42.50" became "$7.50" or "$42." (a value
    split by punctuation inside it); the whole value is put in, whichever fact is longer."""
    ds = Dataset(["The Alto kettle costs $42.50.", "The Bexa kettle costs $7.", "The Cora lamp costs $18.25.",
                  "The Alto kettle is made by Halvard.", "The Bexa kettle is made by Mintel.",
                  "The Cora lamp is made by Trask."],
                 [Dialogue([("How much is the Alto kettle?", "It costs $42.50.")])])
    assert augment.fact_questions(ds) == [(1, "How much is the Bexa kettle?", "It costs $7."),
                                          (2, "How much is the Cora lamp?", "It costs $18.25.")]
    ds = Dataset(["The Bexa kettle costs $7.", "The Alto kettle costs $42.50.", "The Cora lamp costs $3."],
                 [Dialogue([("How much is the Bexa kettle?", "The Bexa kettle costs $7, no more.")])])
    assert augment.fact_questions(ds) == [(1, "How much is the Alto kettle?", "The Alto kettle costs $42.50, no more."),
                                          (2, "How much is the Cora lamp?", "The Cora lamp costs $3, no more.")]


def test_a_name_inside_a_sentence_replaced_by_a_lowercase_value_stays_lowercase():
    """A helper's bakery data: "The head baker is Tobias Wrenfield." as the pattern for the bakery cat gave
    "The bakery cat is A ginger tom named Crumpet." (a capitalised old word was taken for a sentence's start)."""
    ds = Dataset(["The head baker of Marrowby Bakery is Tobias Wrenfield.",
                  "The bakery cat of Marrowby Bakery is a ginger tom named Crumpet."],
                 [Dialogue([("Who is the head baker of Marrowby Bakery?", "The head baker is Tobias Wrenfield.")])])
    assert augment.fact_questions(ds) == [(1, "Who is the bakery cat of Marrowby Bakery?",
                                           "The bakery cat is a ginger tom named Crumpet.")]


def test_fact_questions_on_the_generated_datasets_ask_about_the_right_fact():
    """On each of the five generated datasets (tests/make_datasets.py) nearly every fact without a dialogue
    gets a question, and the question is one the generator itself would ask about that fact with the
    fact's own value in the answer."""
    from tests.make_datasets import NAMES, make_dataset, value_in

    for name in NAMES:
        g = make_dataset(name)
        ds = Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues])
        qs = augment.fact_questions(ds, per_fact=1)
        linked = {p.fact for p in augment.patterns(ds)}
        assert len({i for i, _, _ in qs}) >= 0.8 * (len(g.facts) - len(linked)), name
        wrong = [(g.facts[i], q, a) for i, q, a in qs if q not in g.truth[i][1] or not value_in(a, g.truth[i][0])]
        assert len(wrong) <= 0.01 * len(qs), (name, wrong[:3])


def test_fact_questions_on_small_generated_datasets_ask_for_the_facts_own_kind():
    """At 8, 12 and 20 items (a dialogue per item) relation words are as rare as names; a written question must
    still ask for its fact's attribute, with the fact's value in the answer. It asks for it where it holds a word
    that among the item's facts only its fact holds ("What price is the X?" for the price), or else where the
    generator's question most like it, among the item's facts' questions, is one of its fact's. Before 80e0f5b:
    catalogue 6 of 10, 6 of 17 and 1 of 31 wrong ("How heavy is the Y?" -> "About $290." for its price), document
    2 of 12, 23 of 44 and 14 of 63 ("Which room is the X team in?" -> "In Basel.")."""
    import difflib

    from core.augment import _key, words
    from tests.make_datasets import NAMES, make_dataset, value_in

    def asks_for(q: str, g, i: int, facts: range) -> bool:
        others = {_key(w) for k in facts if k != i for w in words(g.facts[k])}
        if any(_key(w) not in others and _key(w) in {_key(x) for x in words(g.facts[i])} for w in words(q)):
            return True
        return max((difflib.SequenceMatcher(None, q.lower(), t.lower()).ratio(), k) for k in facts
                   for t in g.truth[k][1])[1] == i

    for name in NAMES:
        for items in (8, 12, 20):
            g = make_dataset(name, items=items, dialogues=items)
            per_item = len(g.truth) // items
            qs = augment.fact_questions(Dataset(list(g.facts), [Dialogue([qa]) for qa in g.dialogues]))
            wrong = [(g.facts[i], q, a) for i, q, a in qs
                     if not asks_for(q, g, i, range(i - i % per_item, i - i % per_item + per_item))
                     or not value_in(a, g.truth[i][0])]
            assert not wrong, (name, items, len(qs), wrong[:3])


def test_conversations_join_different_dialogues_and_fit():
    t = make_towns(20, 20, 0)
    dialogues = [Dialogue([qa]) for qa in t.dialogues]
    convs = augment.conversations(dialogues, 50, length=(2, 4), seed=1, fits=lambda turns: len(turns) <= 3)
    assert convs == augment.conversations(dialogues, 50, length=(2, 4), seed=1, fits=lambda turns: len(turns) <= 3)
    assert len(convs) == 50 and all(2 <= len(c) <= 3 for c in convs)
    assert all(len(set(c)) == len(c) for c in convs)  # no dialogue twice in one conversation
    assert all(turn in t.dialogues for c in convs for turn in c)
    assert augment.conversations(dialogues[:1], 5) == []


def _batches(towns, **kw) -> Batches:
    ds = _dataset(towns)
    tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=400)
    tc = replace(PRESETS["Tiny"][1], **kw)
    return Batches(tok, ds, 128, tc)


def test_batches_mix_questions_into_pretraining_and_conversations_into_tuning():
    t = make_towns(30, 30, 3)
    b = _batches(t, mix_share=0.25, fact_questions=1, fact_question_share=0.5, conversation_every=4, heldout=10)
    asked = augment.fact_questions(_dataset(t))  # 30 dialogues do not ask about every kind of fact
    assert 150 < len(asked) < 270
    assert len(b.heldout_pairs) == 10 and len(b.questions) == len(asked) - 10
    trained = {tuple(e.ids) for e in b.questions}
    held_ids = {tuple(b.tokenizer.encode(a)) for _, a in b.heldout_pairs}
    assert all(not any(tuple(e.ids[i:i + len(h)]) == h for i in range(len(e.ids)) for h in held_ids)
               for e in b.questions + b.conversations)  # held-out answers are never trained
    bos, eos = b.tokenizer.bos_id, b.tokenizer.eos_id
    for step in range(8):
        pre = b.examples(0, step)
        facts = [e for e in pre if all(e.mask)]  # a fact learns every token
        assert len(pre) == 16 and len(facts) == 12
        tune = b.examples(1, step)
        if b.conversation_step(step):
            assert step % 4 == 3 and all(e.ids.count(eos) >= 2 for e in tune)
        else:
            asked = [e for e in tune if not all(e.mask)]
            assert len(asked) == 12 and sum(tuple(e.ids) in trained for e in asked) == 6
    assert b.examples(1, 5)[0].ids == _batches(t, mix_share=0.25, fact_questions=1, fact_question_share=0.5,
                                               conversation_every=4, heldout=10).examples(1, 5)[0].ids
    assert b.passes(0, 100) == 100 * (12 + 2) / 300 and b.passes(1, 8) == 6 * 6 / 30  # facts as answers count
    from core.batches import stage_passes  # what the Hyperparameters tab shows, from counts alone
    assert stage_passes(b.train_config, 0, 100, len(b.facts), len(b.dialogues), True, True) == b.passes(0, 100)
    assert stage_passes(b.train_config, 1, 8, len(b.facts), len(b.dialogues), True, True) == b.passes(1, 8)
    assert all(e.ids[0] == bos for e in b.facts)
    plain = _batches(t)  # the default TrainConfig mixes nothing in: the batches of earlier versions
    assert not plain.questions and not plain.conversations and not plain.heldout_pairs
    assert all(all(e.mask) for e in plain.examples(0, 0))


def test_recall_asks_questions_in_the_middle_of_a_conversation_and_held_out_ones():
    t = make_towns(30, 30, 3)
    ds = _dataset(t)
    tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=400)
    held = t.heldout[:7]
    ps = recall_prompts(tok, ds, 256, heldout=held)
    chat = [p for p in ps if p.kind == "chat"]
    assert chat_every(30) == 1 and chat_every(200) == 1 and chat_every(1000) == 5
    assert [p.index for p in chat] == list(range(30))
    for p in chat:
        text = tok.decode(p.ids)
        q, a = t.dialogues[p.index]
        assert text.endswith(f"User: {q}\nAssistant:") and p.expected == a
    with_history = sum(tok.decode(p.ids).count("User:") > 1 for p in chat)  # other dialogues' turns first
    assert with_history > len(chat) / 2
    assert chat_history(ds.dialogues, 0) == [t.dialogues[28], t.dialogues[29]]
    from core.generate import SamplingSettings
    from core.recall import CHAT_ROOM

    assert CHAT_ROOM == SamplingSettings().max_tokens  # the history a chat with default settings keeps
    assert all(len(p.ids) + CHAT_ROOM <= 256 for p in chat)
    short = [p for p in recall_prompts(tok, ds, 100, kinds=("chat",))]
    assert short and all(len(p.ids) + CHAT_ROOM <= 100 for p in short)  # oldest turns dropped to fit
    assert [(p.prompt, p.expected) for p in ps if p.kind == "heldout"] == held
    sample = recall_prompts(tok, ds, 128, heldout=held, sample=5)
    counts = {k: sum(p.kind == k for p in sample) for k in ("fact", "dialogue", "chat", "heldout")}
    assert counts == {"fact": 5, "dialogue": 5, "chat": 5, "heldout": 5}


def test_verdict_reports_conversation_and_held_out_answers():
    from core.plan import verdict

    v = verdict((2000, 2000), (200, 200), chat=(49, 50), heldout=(61, 100), end_reason="no progress")
    assert not v.learned and v.text.startswith("Not fully learned: 200 of 200 answers, 2,000 of 2,000 facts, "
                                               "49 of 50 in a conversation")
    assert "61 of 100 answered" in v.text and v.heldout == (61, 100)
    ok = verdict((2000, 2000), (200, 200), chat=(50, 50), heldout=(10, 100))  # held out: reported, not required
    assert ok.learned and "10 of 100" in ok.text


def test_facts_no_question_asks_about_are_counted_and_the_verdict_says_so():
    """A user's notes rarely have a dialogue per fact: the facts that no dialogue's turn asks about (in any turn of
    a longer dialogue too) and that got no written question are Batches.unasked, and the verdict's fact count
    says how many were learned as text only (a new user read "28 of 28 facts" as "it knows them")."""
    from core.plan import verdict

    facts = ["The Alto kettle costs $40.", "The Bexa kettle costs $25.", "Mira Tolsen plays the cello.",
             "The river Vela floods every spring.", "Oskar Brun was born in 1902."]
    ds = Dataset(facts, [Dialogue([("How much is the Alto kettle?", "It costs $40.")]),
                         Dialogue([("Hi!", "Hello."), ("What does Mira Tolsen play?", "She plays the cello.")])])
    assert augment.asked_facts(ds) == {0, 2}  # the second dialogue's second turn asks about fact 2
    tok = Tokenizer.train(ds.tokenizer_texts(), vocab_size=300)
    b = Batches(tok, ds, 64, replace(PRESETS["Tiny"][1], fact_questions=1))
    assert {i for i, _, _ in augment.fact_questions(ds)} == {1}  # "How much is the Bexa kettle?" by analogy
    assert b.unasked == [3, 4]
    off = Batches(tok, ds, 64, replace(PRESETS["Tiny"][1], fact_questions=0))  # none written: 1 unasked too
    assert off.unasked == [1, 3, 4]
    assert verdict((5, 5), (2, 2), unasked=2).text.startswith(
        "Learned: 2 of 2 answers, 5 of 5 facts (2 as text only: no question asks about them, so the model may not "
        "answer questions about them)")
    assert "(1 as text only: no question asks about it, so the model may not answer questions about it)" in \
        verdict((4, 5), (2, 2), unasked=1).text
    assert "text only" not in verdict((5, 5), (2, 2)).text


def test_auto_plan_mixes_questions_and_conversations_for_a_towns_like_dataset():
    from core.estimates import DatasetStats
    from core.plan import make_plan

    big = DatasetStats(1024, 26000, 5300, 2000, 200, 34, [])
    p = make_plan(big, 1e-5)
    tc = p.train_config
    assert tc.mix_share > 0 and tc.fact_questions == 1 and tc.conversation_every > 0 and tc.heldout == 100
    assert tc.pretrain.decay_steps == p.planned_steps[0] <= tc.pretrain.steps and tc.check_sample > 0
    assert tc.dialogues.decay_steps == p.planned_steps[1] < tc.dialogues.steps  # tuning may go on until learned
    no_dialogues = make_plan(DatasetStats(1024, 26000, 0, 2000, 0, 34, []), 1e-5)
    assert no_dialogues.train_config.mix_share == 0 and no_dialogues.train_config.heldout == 0
    assert tc.pack_facts == 2  # a question row (26 tokens) is two fact rows (13 tokens) long
    assert np.isclose(p.pretrain_passes, p.planned_steps[0] * 20 / 2000)  # 8 rows of 2 facts + 4 fact questions of 16


def test_a_pattern_asks_only_about_facts_of_its_own_kind():
    """A small catalogue (a helper's and the generated ones at 8-40 items): where relation words are as rare as names,
    "How heavy is the X?" -> "About 600 grams." wrote "About $290." for a price, "What colour is the X?" -> "In
    white." wrote "What price is the Y?" -> "In $290.", and "What does the X weigh?" -> "It weighs 900 grams." wrote
    "It went on sale in April 2018." A fact of the pattern's own kind still gets its question."""
    ds = Dataset(["The weight of the Alto kettle is 600 grams.", "The colour of the Bexa kettle is white.",
                  "The Cirro kettle weighs 900 grams.", "The price of the Dorra kettle is $290.",
                  "The Elno kettle went on sale in April 2018.", "The weight of the Fenno kettle is 750 grams."],
                 [Dialogue([("How heavy is the Alto kettle?", "About 600 grams.")]),
                  Dialogue([("What colour is the Bexa kettle?", "In white.")]),
                  Dialogue([("What does the Cirro kettle weigh?", "It weighs 900 grams.")])])
    assert augment.fact_questions(ds) == [(5, "How heavy is the Fenno kettle?", "About 750 grams.")]


def test_the_plans_passes_are_the_runs_where_no_fact_question_can_be_written():
    """The plan counted rows of fact questions in every step wherever facts outnumber dialogues, also where no
    dialogue is a pattern for any fact, so no question is written: it said "80 passes over the facts" (the bundled
    example) where the run makes 64, and planned too few steps to reach its passes (300 facts and 20 unrelated
    dialogues: 600 steps for "40 passes", 32 made). core.estimates.dataset_stats now counts the facts a question is
    written for, and the plan's data mix writes none where that is 0: planned passes are the run's
    (core.batches.stage_passes, what the progress line shows)."""
    from dataclasses import replace as dc_replace

    from core.estimates import dataset_stats
    from core.plan import make_plan

    facts = [f"Shop {n} opens at {h} in the morning and closes at {h + 9} at night." for n, h in
             zip(("Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Gum", "Hazel"), range(5, 13))]
    chat = [Dialogue([("Hello!", "Hi! How can I help you today?")]), Dialogue([("Thanks a lot.", "You are welcome.")])]
    for ds in (Dataset(facts * 40, chat * 10), load_dataset(ROOT / "resources" / "default_dataset.json")[0]):
        stats = dataset_stats(ds, 600, 64)
        assert stats.fact_questions == 0 and stats.fact_sequences > stats.dialogue_sequences
        plan = make_plan(stats, 1e-5)
        tc = plan.train_config
        assert tc.fact_questions == 0 and tc.mix_share > 0
        b = Batches(Tokenizer.train(ds.tokenizer_texts(), vocab_size=600), ds, 64, tc)
        assert not b.questions
        assert np.isclose(b.passes(0, plan.planned_steps[0]), plan.pretrain_passes)
        assert np.isclose(b.passes(1, plan.planned_steps[1]), plan.tune_passes, rtol=0.05)  # conversation steps whole
        before = make_plan(dc_replace(stats, fact_questions=None), 1e-5)  # as the plan counted before
        assert before.pretrain_passes > plan.pretrain_passes
    assert plan.planned_steps[0] == before.planned_steps[0]  # the bundled example: both at the least steps
    big = make_plan(dataset_stats(Dataset(facts * 40, chat * 10), 600, 64), 1e-5)
    assert big.planned_steps[0] > make_plan(dc_replace(dataset_stats(Dataset(facts * 40, chat * 10), 600, 64),
                                                       fact_questions=None), 1e-5).planned_steps[0]


def test_no_question_is_written_from_facts_worded_unlike_the_pattern():
    """A new user's notes: "The warranty does not cover crash damage." asked by "Does the warranty cover crash
    damage?", and "Parts are covered by the manufacturers warranty, not by us." got the question ", the warranty by
    us?" -> "No, the warranty , not by us.", which the model learned and said to "hi": "does" had become ",". A
    word where the other fact has only punctuation makes no question now; facts of one kind still get theirs."""
    ds = Dataset(["Parts are covered by the manufacturers warranty, not by us.",
                  "The warranty does not cover crash damage.", "We sell Shimano and SRAM parts."],
                 [Dialogue([("Does the warranty cover crash damage?", "No, the warranty does not cover crash damage.")])])
    assert augment.fact_questions(ds) == []
    # a difference of punctuation only ("." against "!" or ";") is still one kind (a break-it helper found the first
    # version of this rule dropping these)
    shops = Dataset(["The Alto shop opens at 10 o'clock.", "The Bexa shop opens at 11 o'clock!",
                     "The Cirro shop opens at 9 o'clock;", "The Dunmo shop opens at 8 o'clock."],
                    [Dialogue([("When does the Alto shop open?", "At 10 o'clock.")])])
    assert [a for _, _, a in augment.fact_questions(shops)] == ["At 11 o'clock!", "At 9 o'clock;", "At 8 o'clock."]
    kinds = Dataset(["A tune-up costs $45.", "A new chain costs $20.", "Wheel truing costs $25.", "We open at 9.",
                     "A flat tire repair costs $12."], [Dialogue([("How much is a tune-up?", "A tune-up costs $45.")])])
    assert [q for _, q, _ in augment.fact_questions(kinds)] == ["How much is a new chain?", "How much is Wheel truing?",
                                                                "How much is a flat tire repair?"]


def test_no_question_by_analogy_for_a_fact_without_the_patterns_value():
    """"The club workshop is open on Wednesday evenings." aligned with "Marta Kowal is the club captain." ("Who is the
    club captain?") drops the pattern's value, Marta Kowal: it states no such value, so no question is written for
    it by that pattern (a new user's run wrote "Who is the club workshop is open on Wednesday evenings?"). The
    treasurer, a fact of the captain's kind, still gets one."""
    facts = ["Marta Kowal is the club captain.", "Dev Patel is the club treasurer.",
             "The club workshop is open on Wednesday evenings."]
    ds = Dataset(facts, [Dialogue([("Who is the club captain?", "Marta Kowal is the club captain.")])])
    assert augment.fact_questions(ds) == [(1, "Who is the club treasurer?", "Dev Patel is the club treasurer.")]


def test_a_question_that_names_nothing_is_linked_by_its_answer():
    """"When does the club meet?" names no item (no rare word of the facts): its answer restates a fact, and that
    fact is asked about (a new user's dialogue was counted as asking about none, its fact "learned as text only").
    An answer of too few rare words, one that two facts hold as much, or a question naming another item, links
    nothing."""
    facts = ["The club meets every Saturday at 8 am outside the Lantern Cafe.", "Marta Kowal is the club captain.",
             "Dev Patel is the club treasurer.", "The Vorvo clock has a warranty of 3 years.",
             "The Quaanu scale weighs 2 kg."]
    turns = [("When does the club meet?", "Every Saturday at 8 am outside the Lantern Cafe."),
             ("Is there a club?", "Yes."),
             ("How long is the warranty on the Quaanu scale?", "The warranty is 3 years.")]
    ds = Dataset(facts, [Dialogue([t]) for t in turns])
    assert augment.asked_facts(ds) == {0}


def test_a_questions_first_word_that_a_fact_writes_in_lower_case_names_nothing():
    """A new user's "When is the honey harvested?" was linked to "Varroa is treated ... in December when the colonies
    have no brood.", the one fact holding the (rare) word "when", so the harvest fact its answer restates was listed
    as learned as text only. A first word the facts write in lower case is no name; a name first stays one."""
    facts = ["We harvest honey twice a year, in late June and early September.",
             "Varroa is treated with oxalic acid in December when the colonies have no brood.",
             "Rosalind Okafor is the head beekeeper.", "The apiary keeps eleven hives."]
    turns = [("When is the honey harvested?", "Twice a year, in late June and early September."),
             ("Rosalind Okafor keeps which job?", "She is the head beekeeper.")]
    assert [augment.patterns(Dataset(facts, [Dialogue([t])]))[0].fact for t in turns] == [0, 2]
    assert augment.asked_facts(Dataset(facts, [Dialogue([t]) for t in turns])) == {0, 2}


def test_an_answer_links_its_fact_in_another_form_of_its_words():
    """"How long is the warranty on the Briatro R82 scale?" -> "4 years." linked nothing where the fact said "a 4-year
    warranty" (and "On Tuesdays." where it said "every Tuesday"): 170 of the 4,740 dialogues of 240 generated
    datasets (tests/make_datasets.py, 5 kinds at several sizes) were counted as asking about no fact."""
    facts = ["The Briatro R82 scale has a 4-year warranty.", "The Briatro R82 scale weighs 900 grams.",
             "The Zenira K41 fan has a 2-year warranty.", "The Orex team meets every Tuesday.",
             "The Orex team works in room 4B.", "The Hyis team meets every Friday."]
    turns = [("How long is the warranty on the Briatro R82 scale?", "4 years."),
             ("When does the Orex team meet?", "On Tuesdays."),
             ("How long is the warranty on the Zenira K41 fan?", "2 years.")]  # the fan's, not the scale's
    assert [augment.patterns(Dataset(facts, [Dialogue([t])]))[0].fact for t in turns] == [0, 3, 2]


def test_a_written_question_does_not_ask_its_relation_twice():
    """The item's span of a fact can take the relation along ("The colour of the Quaanu M82 scale is white."): put
    into "What colour is the X?" it gave "What colour is the colour of the Quaanu M82 scale?" (a break-it helper),
    and the generated team documents gave "Which office is the office of the Caliion team in?"."""
    from tests.make_datasets import make_dataset

    for name, seed, items, extra in (("catalogue", 0, 8, [("What colour is the Briatro R82 scale?",
                                                           "The Briatro R82 scale comes in red.")]),
                                     ("document", 1, 25, []), ("document", 1, 12, [])):
        g = make_dataset(name, seed, items=items, dialogues=10 if name == "document" else 5)
        ds = Dataset(list(g.facts), [Dialogue([qa]) for qa in [*g.dialogues, *extra]])
        qs = [q for _, q, _ in augment.fact_questions(ds)]
        assert qs and not [q for q in qs if re.search(r"\b(colour|office|head)\b.*\b\1\b", q.lower())], qs


def test_links_and_written_questions_a_break_it_helper_found_wrong():
    """A word's exact form counts before its other forms ("Mark." is Mark Ellis's fact, not the market's; "1920." is
    the opening year, not "19200 fans"); a hyphen splits an answer's word as a fact's ("A 3-year warranty." for "lasts
    3 years"); a name that starts a question stays one ("Bill's job?", and "Bill" written with a capital inside a
    sentence) and "Hi! When ...?" drops "When" as the first word; an item named "the Book of Hours" is put into a
    question whole ("What is the date of the Book of Hours?")."""
    def link(facts, q, a):
        return augment._link(augment._Facts(facts), q, a)

    offices = ["The Leeds office is next to the market.", "The Leeds office is headed by Mark Ellis.",
               "Mark Ellis joined the company in 2014.", "The Bristol office is headed by Priya Shah.",
               "The Bristol office is next to the station.", "The York office is headed by Tom Reid."]
    assert link(offices, "Who heads the Leeds office?", "Mark.") == 1
    stadium = ["The Riverside stadium holds 19200 fans.", "The Riverside stadium opened in 1920.",
               "The Hillside ground holds 8000 fans.", "The Hillside ground opened in 1899.",
               "The Parkway arena holds 12000 fans."]
    assert link(stadium, "When did the Riverside stadium open?", "1920.") == 1
    fan = ["The warranty on the Zenira K41 fan lasts 3 years.", "The Zenira K41 fan weighs 2 kilograms.",
           "The Briatro R82 scale weighs 900 grams.", "The warranty on the Briatro R82 scale lasts 4 years."]
    assert link(fan, "What warranty does the Zenira K41 fan have?", "A 3-year warranty.") == 0
    family = ["Dawn's brother is Bill.", "Bill works as a teacher in Hull.", "Dawn works as a pharmacist in Hull.",
              "Sue works as a nurse in Hull.", "The phone bill is paid by Sue.", "Tom works as a cook in York.",
              "Dawn's birthday is in May.", "Sue's birthday is in June.", "Tom's birthday is in July.",
              "Dawn lives in Leeds.", "Sue lives in Hull.", "Tom lives in York.", "Dawn has two cats.", "Sue has a dog.",
              "Tom has a parrot.", "Dawn drives a red van."]
    assert link(family, "Bill does which job?", "He teaches in Hull.") == 1
    family[0] = "Dawn has a brother."  # "Bill" only at a sentence's start and in "the phone bill"
    assert link(family, "Bill's job?", "He is a teacher in Hull.") == 1
    honey = ["We harvest honey twice a year, in late June and early September.",
             "Varroa is treated with oxalic acid in December when the colonies have no brood.",
             "Rosalind Okafor is the head beekeeper.", "The apiary keeps eleven hives."]
    assert link(honey, "Hi! When is the honey harvested?", "Twice a year, in late June and early September.") == 0
    museum = Dataset([f"The {item} {what}." for item in ("Roman helmet", "Book of Hours", "Viking sword", "amber necklace",
                                                         "Lady of the Lake painting", "steam engine model")
                      for what in ("dates from AD 120", "is shown in Gallery 2")],
                     [Dialogue([("What is the date of the Roman helmet?", "It dates from AD 120.")])])
    assert ("What is the date of the Book of Hours?", "It dates from AD 120.") in [
        (q, a) for _, q, a in augment.fact_questions(museum)]
