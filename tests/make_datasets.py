"""Five generated datasets of different shapes and wordings, to measure whether a model learns the facts
it is given and answers questions about them (issue 18). None of the app's rules is tuned to one of them.

Each dataset is a set of invented items (people, products, historical events, mountains, the teams of
a company's handbook), each with several attributes. Every attribute is a fact (a plain statement,
in one of several wordings), asked about by User/Assistant dialogues whose answers are worded either
like the fact or unlike it ("How much is the X?" -> "It costs $42."). A split of the items has no
dialogue at all: questions about them (with the value a right answer must contain) measure whether the
model knows facts it never saw asked about.

- ``people``: 300 people x 6 attributes; answers worded like the fact for half of the attributes.
- ``catalogue``: 250 products x 6 attributes, each fact in one of three wordings, answers never
  worded like the fact.
- ``events``: 300 historical events x 6 attributes (years, places, leaders, numbers).
- ``places``: 300 mountains x 6 attributes, two-word names.
- ``document``: a company handbook written as prose (paragraphs of sentences in many wordings), split
  into statements, one per line.

Deterministic: the same arguments give the same files byte for byte.

    python tests/make_datasets.py --name catalogue --out catalogue.txt --heldout-out catalogue-heldout.tsv
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAMES = ("people", "catalogue", "events", "places", "document")


@dataclass(frozen=True)
class Attribute:
    """One kind of fact about an item: its ``facts`` wordings, the ``questions`` that ask for it, the
    ``answers`` a dialogue gives (empty: the fact itself) and ``value``, the field a right answer must
    contain. Templates use ``{item}`` and the value fields."""

    name: str
    facts: tuple[str, ...]
    questions: tuple[str, ...]
    answers: tuple[str, ...]
    value: str


@dataclass(frozen=True)
class Generated:
    """A generated dataset: ``facts``, single-turn ``dialogues`` (question, answer), ``heldout``
    (question, value) about the items without a dialogue, ``asked`` (question, value) of the dialogues,
    and ``document`` (the prose the facts were split from; "" for the others)."""

    name: str
    facts: list[str]
    dialogues: list[tuple[str, str]]
    heldout: list[tuple[str, str]]
    asked: list[tuple[str, str]]
    document: str = ""
    truth: tuple = ()
    """Per fact: (its value, the questions that ask for it)."""

    def text(self) -> str:
        """The dataset in the app's plain-text format (core.dataset): facts, then the dialogues."""
        lines = list(self.facts) + [""]
        for q, a in self.dialogues:
            lines += [f"User: {q}", f"Assistant: {a}", ""]
        return "\n".join(lines)


def _names(rng: np.random.Generator, n: int, onsets, middles, ends, words: int = 1) -> list[str]:
    out, seen = [], set()
    while len(out) < n:
        parts = []
        for _ in range(words):
            parts.append(str(rng.choice(onsets)) + (str(rng.choice(middles)) if rng.random() < 0.5 else "")
                         + str(rng.choice(ends)))
        name = " ".join(parts)
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _pick(rng, xs) -> str:
    return str(xs[int(rng.integers(len(xs)))])


# ----------------------------------------------------------------------------- the five shapes

def _people(rng):
    items = _names(rng, 300, ["Al", "Ber", "Cas", "Dor", "Ev", "Fal", "Gwen", "Hal", "Isol", "Jor", "Kal", "Lor",
                              "Mer", "Nad", "Os", "Per", "Quen", "Ros", "Sil", "Tam"],
                   ["a", "e", "i", "o", "an", "el"], ["ric", "wen", "da", "mund", "ette", "vin", "ra", "lis"], words=2)
    values = lambda: dict(job=_pick(rng, ["baker", "carpenter", "nurse", "pilot", "librarian", "gardener", "tailor",
                                          "chemist", "teacher", "fisher", "potter", "surveyor"]),
                          city=_pick(rng, ["Lisbon", "Oslo", "Dublin", "Krakow", "Porto", "Lyon", "Bergen", "Ghent",
                                           "Turin", "Malmo", "Tartu", "Graz"]),
                          age=str(int(rng.integers(19, 88))),
                          animal=_pick(rng, ["cat", "dog", "parrot", "tortoise", "ferret", "rabbit", "goldfish"]),
                          pet=_pick(rng, ["Pepper", "Mango", "Rusty", "Tilly", "Bruno", "Luna", "Otis", "Fig"]),
                          color=_pick(rng, ["green", "purple", "orange", "teal", "crimson", "yellow", "navy"]),
                          instrument=_pick(rng, ["violin", "cello", "flute", "piano", "trumpet", "harp", "drums",
                                                 "oboe"]))
    attrs = (
        Attribute("job", ("{item} works as a {job}.",), ("What does {item} do for a living?", "What is {item}'s job?"),
                  (), "job"),
        Attribute("city", ("{item} was born in {city}.",), ("Where was {item} born?", "In which city was {item} born?"),
                  ("In {city}.", "{item} was born in {city}."), "city"),
        Attribute("age", ("{item} is {age} years old.",), ("How old is {item}?", "What age is {item}?"), (), "age"),
        Attribute("pet", ("{item} has a {animal} called {pet}.",), ("What pet does {item} have?",
                                                                     "Does {item} have a pet?"),
                  ("A {animal} called {pet}.", "Yes, a {animal} named {pet}."), "pet"),
        Attribute("color", ("{item}'s favourite colour is {color}.",), ("What is {item}'s favourite colour?",
                                                                         "Which colour does {item} like best?"),
                  (), "color"),
        Attribute("instrument", ("{item} plays the {instrument}.",), ("Which instrument does {item} play?",
                                                                       "What does {item} play?"),
                  ("The {instrument}.", "{item} plays the {instrument}."), "instrument"),
    )
    return items, values, attrs, 240


def _catalogue(rng):
    brands = _names(rng, 60, ["Zen", "Kal", "Vor", "Lum", "Tri", "Nex", "Sol", "Aer", "Qua", "Bri"],
                    ["o", "a", "i"], ["tro", "vo", "ix", "ra", "nu", "on"])
    kinds = ["kettle", "blender", "lamp", "toaster", "fan", "heater", "speaker", "clock", "scale", "mixer"]
    items, seen = [], set()
    while len(items) < 250:
        name = f"{_pick(rng, brands)} {_pick(rng, ['K', 'X', 'M', 'S', 'T', 'R'])}{int(rng.integers(2, 99))} " \
               f"{_pick(rng, kinds)}"
        if name not in seen:
            seen.add(name)
            items.append(name)
    values = lambda: dict(price=str(int(rng.integers(9, 400))),
                          month=_pick(rng, ["January", "March", "April", "June", "August", "October", "November"]),
                          year=str(int(rng.integers(2009, 2026))),
                          maker=_pick(rng, ["Halvard Works", "Mintel Group", "Osk Industries", "Pell and Sons",
                                            "Trask Labs", "Wendt Company"]),
                          color=_pick(rng, ["silver", "matte black", "white", "red", "sage green", "copper"]),
                          grams=str(int(rng.integers(3, 60)) * 50),
                          years=str(int(rng.integers(1, 6))))
    attrs = (
        Attribute("price", ("The {item} costs ${price}.", "The price of the {item} is ${price}.",
                            "You can buy the {item} for ${price}."),
                  ("How much is the {item}?", "What does the {item} cost?"), ("It costs ${price}.", "The price is ${price}."),
                  "price"),
        Attribute("released", ("The {item} was released in {month} {year}.", "The {item} came out in {month} {year}.",
                               "The {item} went on sale in {month} {year}."),
                  ("When was the {item} released?", "When did the {item} come out?"),
                  ("In {month} {year}.", "It was released in {month} {year}."), "year"),
        Attribute("maker", ("The {item} is made by {maker}.", "{maker} makes the {item}.",
                            "The {item} is a product of {maker}."),
                  ("Who makes the {item}?", "Which company makes the {item}?"), ("{maker} makes it.", "It is made by {maker}."),
                  "maker"),
        Attribute("color", ("The {item} comes in {color}.", "The {item} is sold in {color}.",
                            "The colour of the {item} is {color}."),
                  ("What colour is the {item}?", "Which colour does the {item} come in?"), ("It is {color}.", "In {color}."),
                  "color"),
        Attribute("weight", ("The {item} weighs {grams} grams.", "The weight of the {item} is {grams} grams.",
                             "The {item} has a weight of {grams} grams."),
                  ("How heavy is the {item}?", "What does the {item} weigh?"), ("About {grams} grams.", "It weighs {grams} grams."),
                  "grams"),
        Attribute("warranty", ("The {item} has a {years}-year warranty.", "The {item} comes with a {years}-year warranty.",
                               "The warranty of the {item} lasts {years} years."),
                  ("How long is the warranty on the {item}?", "What warranty does the {item} have?"),
                  ("{years} years.", "The warranty lasts {years} years."), "years"),
    )
    return items, values, attrs, 250


def _events(rng):
    places = _names(rng, 300, ["Vorn", "Ast", "Kel", "Mor", "Dra", "Sten", "Ul", "Bra", "Thal", "Gor", "Ys", "Quar"],
                    ["en", "a", "o", "ir"], ["holm", "gard", "wick", "mar", "berg", "dun", "ford", "stad"])
    items = [f"the {_pick(rng, ['Treaty', 'Battle', 'Siege', 'Council', 'Fire', 'Flood'])} of {p}" for p in places]
    values = lambda: dict(year=str(int(rng.integers(900, 1850))),
                          ruler=f"{_pick(rng, ['King', 'Queen', 'Duke', 'Duchess', 'Count'])} "
                                f"{_pick(rng, ['Aldric', 'Berengar', 'Cunegund', 'Ermina', 'Godric', 'Hildegard', 'Osric', 'Wilhelmina'])}",
                          days=str(int(rng.integers(2, 90))),
                          people=str(int(rng.integers(2, 80)) * 100),
                          season=_pick(rng, ["spring", "summer", "autumn", "winter"]),
                          chronicle=_pick(rng, ["Red Chronicle", "Annals of Sel", "Book of Tides", "Grey Ledger",
                                                "Harrow Scrolls"]))
    attrs = (
        Attribute("year", ("{Item} happened in {year}.",), ("When did {item} happen?", "In which year was {item}?"),
                  ("In {year}.",), "year"),
        Attribute("ruler", ("{Item} took place under {ruler}.",), ("Who ruled during {item}?", "Under whom did {item} take place?"),
                  ("{ruler} ruled then.", "Under {ruler}."), "ruler"),
        Attribute("days", ("{Item} lasted {days} days.",), ("How long did {item} last?", "How many days did {item} last?"),
                  (), "days"),
        Attribute("people", ("About {people} people took part in {item}.",),
                  ("How many people took part in {item}?", "How many were involved in {item}?"), ("About {people}.",),
                  "people"),
        Attribute("season", ("{Item} began in the {season}.",), ("In which season did {item} begin?", "When in the year did {item} begin?"),
                  (), "season"),
        Attribute("chronicle", ("{Item} is recorded in the {chronicle}.",),
                  ("Where is {item} recorded?", "Which book records {item}?"), ("In the {chronicle}.",), "chronicle"),
    )
    return items, values, attrs, 200


def _places(rng):
    items = ["Mount " + n for n in _names(rng, 300, ["Ker", "Alb", "Tor", "Vel", "Mad", "Sar", "Cor", "Hel", "Ish",
                                                     "Bal", "Fen", "Rav"], ["a", "o", "e", "un"],
                                          ["dor", "ran", "nak", "vel", "mir", "gos", "tan", "zel"])]
    values = lambda: dict(metres=f"{int(rng.integers(8, 60)) * 100:,}",
                          region=_pick(rng, ["northern", "southern", "eastern", "western", "central"]),
                          climber=f"{_pick(rng, ['Ada', 'Bram', 'Cleo', 'Dag', 'Edda', 'Finn', 'Greer', 'Hugo'])} "
                                  f"{_pick(rng, ['Stroud', 'Vance', 'Okafor', 'Lindqvist', 'Moreau', 'Tanaka', 'Reyes'])}",
                          year=str(int(rng.integers(1790, 2010))),
                          tree=_pick(rng, ["pine", "birch", "larch", "oak", "fir", "cedar"]),
                          village=_pick(rng, ["Ostby", "Pellan", "Rudow", "Sarn", "Tibbet", "Ulmar", "Varra", "Wexley"]))
    attrs = (
        Attribute("height", ("{item} is {metres} metres high.",), ("How high is {item}?", "What is the height of {item}?"),
                  ("It is {metres} metres high.",), "metres"),
        Attribute("region", ("{item} stands in the {region} mountains.",), ("Where is {item}?", "In which mountains is {item}?"),
                  ("In the {region} mountains.",), "region"),
        Attribute("climber", ("{item} was first climbed by {climber}.",), ("Who first climbed {item}?",
                                                                            "Who was the first to climb {item}?"),
                  (), "climber"),
        Attribute("year", ("The first ascent of {item} was in {year}.",), ("When was {item} first climbed?",
                                                                            "In which year was {item} first climbed?"),
                  ("In {year}.", "It was first climbed in {year}."), "year"),
        Attribute("forest", ("The slopes of {item} are covered in {tree} trees.",),
                  ("What trees grow on {item}?", "Which trees cover {item}?"), ("{tree} trees.",), "tree"),
        Attribute("village", ("The nearest village to {item} is {village}.",),
                  ("Which village is closest to {item}?", "What is the nearest village to {item}?"), (), "village"),
    )
    return items, values, attrs, 220


def _document(rng):
    items = ["the " + n + " team" for n in _names(rng, 270, ["Or", "Vel", "Cal", "Mon", "Tes", "Ar", "Pol", "Zin",
                                                             "Hy", "Lu"], ["i", "a", "o"],
                                                  ["ion", "ara", "ex", "is", "ar", "um", "ant"])]
    values = lambda: dict(day=_pick(rng, ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]),
                          room=f"{int(rng.integers(1, 9))}{_pick(rng, 'ABCDE')}",
                          lead=f"{_pick(rng, ['Priya', 'Tomas', 'Ines', 'Kwame', 'Lotte', 'Ravi', 'Yuki', 'Nora'])} "
                               f"{_pick(rng, ['Adeyemi', 'Berg', 'Costa', 'Dvorak', 'Esposito', 'Fujita', 'Grant'])}",
                          size=str(int(rng.integers(3, 30))),
                          tool=_pick(rng, ["spreadsheets", "a kanban board", "a shared wiki", "weekly demos", "pair reviews"]),
                          city=_pick(rng, ["Leeds", "Utrecht", "Basel", "Aarhus", "Bilbao", "Poznan"]))
    # many wordings per attribute, as a person writes prose
    attrs = (
        Attribute("day", ("{Item} meets every {day}.", "Every {day}, {item} holds its weekly meeting.",
                          "{Item} gets together on {day}s.", "The weekly meeting of {item} is on {day}."),
                  ("When does {item} meet?", "On which day does {item} meet?"), ("On {day}s.", "Every {day}."), "day"),
        Attribute("room", ("{Item} works in room {room}.", "You will find {item} in room {room}.",
                           "Room {room} is where {item} sits.", "{Item} has its desks in room {room}."),
                  ("Where does {item} work?", "Which room is {item} in?"), ("In room {room}.", "Room {room}."), "room"),
        Attribute("lead", ("{Item} is led by {lead}.", "{lead} leads {item}.", "The head of {item} is {lead}.",
                           "{Item} reports to {lead}."),
                  ("Who leads {item}?", "Who is the head of {item}?"), ("{lead} does.", "It is led by {lead}."), "lead"),
        Attribute("size", ("{Item} has {size} members.", "There are {size} people in {item}.",
                           "{Item} counts {size} members.", "{size} people belong to {item}."),
                  ("How big is {item}?", "How many people are in {item}?"), ("{size} people.", "It has {size} members."),
                  "size"),
        Attribute("tool", ("{Item} plans its work with {tool}.", "To plan its work, {item} uses {tool}.",
                           "{Item} keeps track of its work with {tool}."),
                  ("How does {item} plan its work?", "What does {item} use to plan its work?"), ("With {tool}.",), "tool"),
        Attribute("city", ("{Item} is based in {city}.", "The office of {item} is in {city}.",
                           "{Item} works from the {city} office."),
                  ("Where is {item} based?", "Which office is {item} in?"), ("In {city}.", "The {city} office."), "city"),
    )
    return items, values, attrs, 220


_SHAPES = {"people": _people, "catalogue": _catalogue, "events": _events, "places": _places, "document": _document}


def _fill(template: str, item: str, v: dict) -> str:
    return template.format(item=item, Item=item[:1].upper() + item[1:], **v)


def make_dataset(name: str, seed: int = 0, heldout_share: float = 0.2, items: int | None = None,
                 dialogues: int | None = None) -> Generated:
    """Generate dataset ``name`` (one of :data:`NAMES`).

    Args:
        heldout_share: share of the items that no dialogue asks about (their questions are ``heldout``).
        items, dialogues: fewer items / dialogues than the shape's own (a quick run); None: all.

    Raises:
        ValueError: an unknown name, or more dialogues than the asked items have facts.
    """
    if name not in _SHAPES:
        raise ValueError(f"unknown dataset {name!r}; one of {', '.join(NAMES)}")
    rng = np.random.default_rng([seed, NAMES.index(name)])
    names, values, attrs, n_dialogues = _SHAPES[name](rng)
    names = names[:items] if items else names
    n_dialogues = min(n_dialogues, dialogues) if dialogues else n_dialogues
    n_held = max(1, round(len(names) * heldout_share))
    asked_items = len(names) - n_held
    if n_dialogues > asked_items * len(attrs):
        raise ValueError(f"{n_dialogues} dialogues need more than {asked_items} items x {len(attrs)} facts")
    vals = [values() for _ in names]
    facts, paragraphs, truth = [], [], []
    for item, v in zip(names, vals):
        order = rng.permutation(len(attrs)) if name == "document" else range(len(attrs))
        sentences = [_fill(_pick(rng, attrs[a].facts), item, v) for a in order]
        truth += [(v[attrs[a].value], tuple(_fill(t, item, v) for t in attrs[a].questions)) for a in order]
        facts += sentences
        paragraphs.append(" ".join(sentences))
    dialogues_out, asked = [], []
    used: dict[int, set[int]] = {i: set() for i in range(asked_items)}
    for k in range(n_dialogues):
        i = k % asked_items if k < asked_items else int(rng.integers(asked_items))
        free = [a for a in range(len(attrs)) if a not in used[i]]
        while not free:
            i = int(rng.integers(asked_items))
            free = [a for a in range(len(attrs)) if a not in used[i]]
        a = free[int(rng.integers(len(free)))]
        used[i].add(a)
        at = attrs[a]
        q = _fill(_pick(rng, at.questions), names[i], vals[i])
        ans = _fill(_pick(rng, at.answers), names[i], vals[i]) if at.answers else _fact_of(facts, names[i], vals[i], at)
        dialogues_out.append((q, ans))
        asked.append((q, vals[i][at.value]))
    heldout = []
    for i in range(asked_items, len(names)):
        for at in attrs:
            heldout.append((_fill(_pick(rng, at.questions), names[i], vals[i]), vals[i][at.value]))
    return Generated(name, facts, dialogues_out, heldout, asked, "\n\n".join(paragraphs) if name == "document" else "",
                     tuple(truth))


def _fact_of(facts: list[str], item: str, v: dict, at: Attribute) -> str:
    """The dataset's own wording of attribute ``at`` of ``item`` (the fact a dialogue answers with)."""
    for f in facts:
        if any(f == _fill(t, item, v) for t in at.facts):
            return f
    return _fill(at.facts[0], item, v)


def value_in(answer: str, value: str) -> bool:
    """Whether ``answer`` states ``value`` (case and surrounding punctuation ignored; digits grouped
    with commas match without them)."""
    norm = lambda s: " ".join(s.lower().replace(",", "").split())
    return norm(value) in norm(answer)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, choices=NAMES)
    p.add_argument("--out", required=True, help="dataset file to write (the app's plain-text format)")
    p.add_argument("--heldout-out", help="also write the held-out questions: question<TAB>value per line")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    g = make_dataset(a.name, a.seed)
    Path(a.out).write_text(g.text(), encoding="utf-8")
    if a.heldout_out:
        Path(a.heldout_out).write_text("".join(f"{q}\t{v}\n" for q, v in g.heldout), encoding="utf-8")
    print(f"{a.name}: {len(g.facts)} facts, {len(g.dialogues)} dialogues, {len(g.heldout)} held-out questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
