"""Generate the invented-towns test dataset of issue 9: facts about invented towns and User/Assistant
dialogues asking about them, in the app's plain-text dataset format (core.dataset).

Every town gets ``FACTS_PER_TOWN`` facts, one per attribute below (its river, founding year, mayor, ...).
Each dialogue asks about one fact of one town and its answer is that fact, word for word. The towns of
the held-out split have no dialogue in the dataset: their questions (one per fact) are written to a
second file, to measure how well a model answers questions about facts it never saw a dialogue for.

Deterministic: the same arguments give the same files byte for byte.

    python tests/make_towns_dataset.py --out towns.txt --heldout-out towns-heldout.txt
    # 200 towns, 2,000 facts, 200 dialogues about 180 of them; 200 held-out questions about the other 20
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_ONSETS = ["Br", "Qu", "Th", "Sk", "Gl", "Wr", "Fen", "Mar", "Hol", "Cr", "Dun", "Ast", "Ol", "Pell", "Tor",
           "Vey", "El", "Carr", "Lind", "Ash", "Bel", "Nor", "Ros", "Kest", "Mir", "Hav", "Sel", "Wend"]
_MIDDLES = ["in", "am", "or", "el", "ow", "ar", "en", "is", "um", "ad", "il", "ob"]
_ENDS = ["wick", "by", "stead", "mere", "ford", "holm", "thorpe", "dale", "haven", "combe", "ridge", "ton",
         "bury", "field", "moor", "gate"]
_FIRST = ["Odile", "Hessa", "Tobin", "Marta", "Ivo", "Lenka", "Pieter", "Rosa", "Anselm", "Greta", "Milo", "Sanne",
          "Corin", "Dalia", "Elmer", "Fenna", "Gideon", "Hanne", "Jasper", "Katya"]
_LAST = ["Farrow", "Quill", "Ashby", "Brenner", "Cole", "Dunmore", "Everly", "Finch", "Garrick", "Holt", "Ives",
         "Jessop", "Kerr", "Lowry", "Marsh", "Nolan", "Orme", "Pike", "Rook", "Sayer"]
_RIVERS = ["Amber", "Silver", "Willow", "Falcon", "Bramble", "Heron", "Copper", "Linnet", "Mossy", "Sable",
           "Thistle", "Juniper"]
_FOODS = ["honey bread", "plum cake", "rye loaves", "cheese buns", "apple tarts", "oat biscuits", "walnut rolls",
          "cherry pies", "seed cakes", "ginger bread"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_FESTIVALS = ["lantern", "kite", "harvest", "boat", "music", "cheese", "flower", "candle", "snow", "apple"]
_ANIMALS = ["goat", "goose", "badger", "pony", "donkey", "owl", "hedgehog", "rabbit", "duck", "fox"]
_PETS = ["Clover", "Pip", "Bramble", "Nutmeg", "Biscuit", "Juniper", "Pickle", "Maple", "Sprout", "Button"]
_COLORS = ["blue", "yellow", "white", "green", "pink", "red", "grey", "orange", "purple", "cream"]
_HOURS = ["six", "seven", "eight", "nine", "ten"]
_CLOSE = ["noon", "one", "two", "three", "four"]
_TRADES = ["wool", "salt", "glass", "pottery", "timber", "rope", "honey", "cider", "lace", "cheese"]
_BRIDGES = ["stone", "wooden", "iron", "rope", "brick"]


@dataclass(frozen=True)
class Attribute:
    """One kind of fact: how it is stated and how the dialogues ask for it (``{town}`` is the town)."""

    name: str
    fact: str
    questions: tuple[str, ...]


ATTRIBUTES = (
    Attribute("river", "{town} lies beside the {river} river.",
              ("Which river runs past {town}?", "What river is {town} beside?")),
    Attribute("founded", "{town} was founded in the year {year}.",
              ("When was {town} founded?", "In which year was {town} founded?")),
    Attribute("mayor", "The mayor of {town} is {first} {last}.",
              ("Who is the mayor of {town}?", "Who is mayor in {town}?")),
    Attribute("bakery", "The bakery in {town} sells {food} every {day}.",
              ("What does the bakery in {town} sell?", "What can you buy at the {town} bakery?")),
    Attribute("festival", "The {festival} festival in {town} takes place every {month}.",
              ("When is the festival in {town}?", "Which festival does {town} hold?")),
    Attribute("mascot", "The school in {town} has a {animal} named {pet} as its mascot.",
              ("What is the mascot of the school in {town}?", "Which animal is the {town} school mascot?")),
    Attribute("people", "About {people} people live in {town}.",
              ("How many people live in {town}?", "What is the population of {town}?")),
    Attribute("market", "The market in {town} opens at {hour} and closes at {close}.",
              ("When does the market in {town} open?", "What are the market hours in {town}?")),
    Attribute("houses", "The houses of {town} are painted {color}.",
              ("What color are the houses in {town}?", "How are the houses of {town} painted?")),
    Attribute("trade", "{town} is known for its {trade} and its old {bridge} bridge.",
              ("What is {town} known for?", "What is {town} famous for?")),
)
FACTS_PER_TOWN = len(ATTRIBUTES)


@dataclass(frozen=True)
class Towns:
    """The generated data: ``facts`` (town-major, ``FACTS_PER_TOWN`` per town), ``dialogues`` and
    ``heldout`` as (question, answer) pairs, the answer always one of ``facts``; ``towns`` their names."""

    towns: list[str]
    facts: list[str]
    dialogues: list[tuple[str, str]]
    heldout: list[tuple[str, str]]


def town_names(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct invented one-word town names."""
    names: list[str] = []
    seen = set()
    while len(names) < n:
        name = str(rng.choice(_ONSETS)) + (str(rng.choice(_MIDDLES)) if rng.random() < 0.6 else "") \
            + str(rng.choice(_ENDS))
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def make_towns(n_towns: int = 200, n_dialogues: int = 200, n_heldout_towns: int = 20, seed: int = 0) -> Towns:
    """Facts about ``n_towns`` towns; ``n_dialogues`` single-turn dialogues about the first
    ``n_towns - n_heldout_towns`` towns (each of those towns asked about once before any is asked
    twice, each question about a different fact); one held-out question per fact of the last
    ``n_heldout_towns`` towns. Question wordings are drawn from each attribute's phrasings.

    Raises:
        ValueError: more dialogues than the asked-about towns have facts, or no town to ask about.
    """
    asked = n_towns - n_heldout_towns
    if asked <= 0 and n_dialogues:
        raise ValueError("no town left to ask about: n_heldout_towns >= n_towns")
    if n_dialogues > asked * FACTS_PER_TOWN:
        raise ValueError(f"{n_dialogues} dialogues need more than {asked} towns x {FACTS_PER_TOWN} facts")
    rng = np.random.default_rng(seed)
    towns = town_names(n_towns, rng)
    facts = []
    for town in towns:
        v = dict(town=town, river=rng.choice(_RIVERS), year=int(rng.integers(1100, 1900)), first=rng.choice(_FIRST),
                 last=rng.choice(_LAST), food=rng.choice(_FOODS), day=rng.choice(_DAYS),
                 festival=rng.choice(_FESTIVALS), month=rng.choice(_MONTHS), animal=rng.choice(_ANIMALS),
                 pet=rng.choice(_PETS), people=f"{int(rng.integers(2, 95)) * 100:,}", hour=rng.choice(_HOURS),
                 close=rng.choice(_CLOSE), color=rng.choice(_COLORS), trade=rng.choice(_TRADES),
                 bridge=rng.choice(_BRIDGES))
        facts += [a.fact.format(**v) for a in ATTRIBUTES]

    def question(t: int, a: int) -> tuple[str, str]:
        q = str(rng.choice(ATTRIBUTES[a].questions)).format(town=towns[t])
        return q, facts[t * FACTS_PER_TOWN + a]

    dialogues = []
    used: dict[int, set[int]] = {t: set() for t in range(asked)}
    for k in range(n_dialogues):
        t = k % asked if k < asked else int(rng.integers(asked))
        while len(used[t]) == FACTS_PER_TOWN:
            t = (t + 1) % asked
        a = int(rng.choice([a for a in range(FACTS_PER_TOWN) if a not in used[t]]))
        used[t].add(a)
        dialogues.append(question(t, a))
    heldout = [question(t, a) for t in range(asked, n_towns) for a in range(FACTS_PER_TOWN)]
    return Towns(towns, facts, dialogues, heldout)


def dialogue_text(pairs: list[tuple[str, str]]) -> str:
    """Single-turn dialogues in the plain-text format, separated by blank lines."""
    return "".join(f"User: {q}\nAssistant: {a}\n\n" for q, a in pairs)


def write(towns: Towns, out: Path, heldout_out: Path | None = None) -> None:
    """The dataset (facts, a blank line, the dialogues) to ``out``; the held-out questions, as dialogues
    in the same format, to ``heldout_out``."""
    out.write_text("\n".join(towns.facts) + "\n\n" + dialogue_text(towns.dialogues), encoding="utf-8")
    if heldout_out is not None:
        heldout_out.write_text(dialogue_text(towns.heldout), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="dataset file to write (plain text)")
    p.add_argument("--heldout-out", help="file for the held-out questions (plain-text dialogues)")
    p.add_argument("--towns", type=int, default=200)
    p.add_argument("--dialogues", type=int, default=200)
    p.add_argument("--heldout-towns", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    towns = make_towns(a.towns, a.dialogues, a.heldout_towns, a.seed)
    write(towns, Path(a.out), Path(a.heldout_out) if a.heldout_out else None)
    print(f"{len(towns.facts)} facts about {len(towns.towns)} towns, {len(towns.dialogues)} dialogues, "
          f"{len(towns.heldout)} held-out questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
