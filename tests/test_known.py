"""core/known.py: the base model's answers to general questions, replayed and checked like dialogues."""
from __future__ import annotations

import pytest

from core.dataset import Dataset, Dialogue
from core.known import GENERAL_QUESTIONS, answered_as_before, first_sentence, read_questions, verdict_line, with_replay
from core.recall import RecallItem


def test_replay_appends_one_dialogue_per_answer_and_counts_only_those():
    ds = Dataset(facts=["A fact."], dialogues=[Dialogue(turns=[("Q?", "A.")])])
    out, replay = with_replay(ds, [("What is the capital of France?", "Paris."), ("Who?", "Me.")], ["Long?"])
    assert len(ds.dialogues) == 1 and len(out.dialogues) == 3 and replay.first_dialogue == 1
    assert out.dialogues[1].turns == [("What is the capital of France?", "Paris.")]
    recall = [RecallItem("dialogue", 0, "Q?", "A.", "A.", True), RecallItem("dialogue", 1, "x", "Paris.", "Paris.", True),
              RecallItem("dialogue", 2, "Who?", "Me.", "You.", False), RecallItem("chat", 2, "Who?", "Me.", "Me.", True)]
    assert answered_as_before(recall, replay) == (1, 2)
    assert verdict_line(recall, replay).startswith("general questions: 1 of 2 answered as before (1 more not checked")
    assert len(GENERAL_QUESTIONS) == 10 and len(set(GENERAL_QUESTIONS)) == 10
    recall[2] = RecallItem("dialogue", 2, "Who?", "Me.", "Me. And you.", False)  # a longer answer starting so
    assert answered_as_before(recall, replay) == (2, 2)
    assert first_sentence("Water boils at 100 degrees. This is based on") == "Water boils at 100 degrees."
    assert first_sentence("Paris is 3.5 km wide! Yes") == "Paris is 3.5 km wide!"
    assert first_sentence("Line one\nline two") == "Line one" and first_sentence("no end here") == ""


def test_user_questions_file_is_read_or_refused_in_one_line(tmp_path):
    f = tmp_path / "q.txt"
    f.write_text("What is 2 + 2?\n\n  Who painted the Mona Lisa?  \n", encoding="utf-8")
    assert read_questions(str(f)) == ("What is 2 + 2?", "Who painted the Mona Lisa?")
    f.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no question"):
        read_questions(str(f))
    with pytest.raises(ValueError, match="cannot read"):
        read_questions(str(tmp_path / "missing.txt"))


@pytest.mark.slow
def test_smollm2_with_a_fresh_adapter_answers_every_general_question_as_before(device):
    """B = 0: the LoRA model is the base, so the recall check must find every replayed answer (the check's
    prompts and decoding are the chat's; a difference would show here). SmolLM2-135M Q4_1, ~2 min on PoCL."""
    from core.from_base import default_train_config, load_base
    from core.known import base_answers
    from core.lora import LoRAConfig
    from core.trainer import Trainer
    from tests.artifacts import smollm2_path

    base, mc, _ = load_base(smollm2_path(), 128)
    pairs, unfinished = base_answers(device, mc, base.weights, base.tokenizer, GENERAL_QUESTIONS)
    print(pairs, unfinished)
    assert len(pairs) >= 9
    ds, replay = with_replay(Dataset(facts=["Brindlewick is a town."]), pairs, unfinished)
    trainer = Trainer(ds, mc, default_train_config(1, None, 1), device, tokenizer=base.tokenizer,
                      weights=base.weights, lora=LoRAConfig())
    items = trainer.recall(("dialogue",))
    assert answered_as_before(items, replay) == (len(pairs), len(pairs))


def test_the_verdict_counts_the_users_dialogues_and_the_general_questions_apart():
    """A fine-tune's verdict said "14 of 14 answers" of a dataset with 4 dialogues: the 10 replayed general
    questions were counted as answers too, besides their own line (a new user's trial)."""
    from core.events import StageReport
    from core.run import Run

    ds = Dataset(facts=["A fact."], dialogues=[Dialogue(turns=[("Q?", "A.")])])
    _, replay = with_replay(ds, [("What is the capital of France?", "Paris."), ("Who?", "Me.")])
    recall = (RecallItem("fact", 0, "A", "fact.", "fact.", True), RecallItem("dialogue", 0, "Q?", "A.", "A.", True),
              RecallItem("dialogue", 1, "What?", "Paris.", "Paris.", True),
              RecallItem("dialogue", 2, "Who?", "Me.", "You.", False), RecallItem("chat", 0, "Q?", "A.", "B.", False),
              RecallItem("chat", 2, "Who?", "Me.", "Me.", True))
    run = Run.__new__(Run)
    run._replay = replay
    own = run._without_replay(StageReport("dialogues", 3, False, recall))
    assert own.dialogues_recalled == (1, 1) and own.chat_recalled == (0, 1) and own.facts_recalled == (1, 1)
    assert verdict_line(list(recall), replay) == "general questions: 1 of 2 answered as before"
    from core.trainer import stage_line

    report = StageReport("dialogues", 3, False, recall)
    assert stage_line(report) == "dialogues done: facts recalled 1/1, dialogue answers 2/3, answers in a conversation 1/2"
    assert stage_line(report, replay.first_dialogue) == ("dialogues done: facts recalled 1/1, dialogue answers 1/1, "
                                                         "answers in a conversation 0/1, general questions 1/2")
    longer = recall[:3] + (RecallItem("dialogue", 2, "Who?", "Me.", "Me. And you.", False),) + recall[4:]
    assert stage_line(StageReport("dialogues", 3, False, longer), 1).endswith("general questions 2/2")  # as the verdict
