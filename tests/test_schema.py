"""core/schema.py: each check's message names the field and says what was wanted and what was got."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from core.schema import (MISSING, FieldError, check_dataclass, flag, items, mapping, number, read, spec, text, texts,
                         whole)


@pytest.mark.parametrize("check, value, message", [
    (whole(0, 2), 7, "x: must be within 0..2, got 7"),
    (whole(1), -5, "x: must be >= 1, got -5"),
    (whole(None, 3), 4, "x: must be <= 3, got 4"),
    (whole(), "6", "x: must be an integer, got a string"),
    (whole(), True, "x: must be an integer, got a boolean"),
    (number(above=0, maximum=1, why="a share"), 5, "x: must be <= 1 (a share), got 5"),
    (number(above=0), 0, "x: must be > 0, got 0"),
    (number(minimum=0, below=1), 1.0, "x: must be < 1, got 1.0"),
    (number(), math.nan, "x: must be a finite number, got nan"),
    (number(), False, "x: must be a finite number, got False"),
    (flag, 1, "x: must be true or false, got a number"),
    (text, None, "x: must be a string, got null"),
    (texts, ["a", 1], "x: must be a list of strings"),
    (mapping, [1], "x: must be an object, got a list"),
    (items(whole()), [1, "b"], "x[1]: must be an integer, got a string"),
])
def test_a_check_names_the_field_and_the_problem(check, value, message):
    with pytest.raises(FieldError) as e:
        check("x", value)
    assert str(e.value) == message and e.value.field == message.split(":")[0]


def test_good_values_pass_and_numbers_become_floats():
    assert whole(0, 2)("x", 2) == 2 and number(minimum=0)("x", 3) == 3.0 and isinstance(number()("x", 3), float)
    assert items(text)("x", ["a", "b"]) == ["a", "b"] and flag("x", False) is False


def test_read_names_the_file_the_prefixed_field_and_a_missing_one():
    d = {"train": {"lr": "x"}}
    with pytest.raises(FieldError) as e:
        read(d["train"], "lr", number(), "train.")
    assert e.value.at("ck/config.json") == "ck/config.json: field 'train.lr' must be a finite number, got 'x'"
    with pytest.raises(FieldError, match="^model: is missing$"):
        read(d, "model", mapping, default=MISSING)
    assert read(d, "model", mapping, default={}) == {}


def test_a_dataclass_checks_each_field_it_declares_with_its_check():
    @dataclass(frozen=True)
    class Settings:
        steps: int = spec(1, whole(0))
        share: float = spec(0.5, number(minimum=0, below=1))
        note: str = "unchecked"

        def __post_init__(self):
            check_dataclass(self, "stage.")

    assert Settings().steps == 1
    with pytest.raises(FieldError) as e:
        Settings(share=1.5)
    assert str(e.value) == "stage.share: must be < 1, got 1.5" and e.value.field == "stage.share"
