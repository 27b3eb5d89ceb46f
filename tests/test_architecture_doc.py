"""docs/architecture.md stays true to the code (issue 23, item 8): every file it cites exists, every module
of core/ and gui/ is in it (those directly in core/ and gui/ each on a line of its own), every code name it
puts in backticks is in the sources, kernels are named as it says, and its launch cost is core/device.py's
figure.

Read as text only (no import of the project): the checks are plain regular expressions, so that a rename
that forgets the doc fails here with the stale name.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SOURCE_DIRS = ("core", "gui", "tests", "benchmarks", "examples", "packaging", "resources")
SOURCE_SUFFIXES = {".py", ".cl", ".h", ".json", ".spec", ".sh", ".toml"}
TOP_FOLDERS = ("core", "gui", "tests", "benchmarks", "docs", "packaging", "examples", "resources")

# Backticked words that look like code but name things outside this repository's sources.
NOT_OURS = {
    "LLAMA_ROPE_TYPE_NORM",  # llama.cpp's enum value for the RoPE we compute
    "ReaderField.contents",  # gguf-py's reader API
}

PATH = re.compile(rf"\b(?:{'|'.join(TOP_FOLDERS)})/[\w./<>*-]*[\w*>]")
BARE_FILE = re.compile(r"(?<![\w/.<>-])[A-Za-z_][\w-]*\.(?:py|cl|h)\b")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
CODE_NAME = re.compile(r"^(?:core\.|gui\.)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?$")


def cited_paths(doc: str) -> set[str]:
    """Repository paths in the doc (``core/run.py``, ``core/kernels/matmul.cl``, ``tests/file_ops.py``),
    placeholders such as ``core/kernels/<op>.cl`` and wildcards left out."""
    return {p.rstrip(".") for p in PATH.findall(doc) if "<" not in p and "*" not in p}


def cited_file_names(doc: str) -> set[str]:
    """Bare file names of our sources (``matmul.cl``, ``grid.h``, ``resume.py``) outside a path."""
    return set(BARE_FILE.findall(doc))


def code_names(doc: str) -> set[str]:
    """The dotted names in inline code spans (`Trainer.run`, `check_fits`, `dev.kernel(file, name)`):
    a span that is one name, dotted or called, and nothing else (formulas, flags, literals are skipped)."""
    out = set()
    for span in INLINE_CODE.findall(doc):
        m = CODE_NAME.match(span.strip())
        if m:
            out.add(m.group(1))
    return out


def source_words() -> set[str]:
    words: set[str] = set()
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in SOURCE_SUFFIXES and path.is_file():
                words.update(re.findall(r"[A-Za-z_]\w*", path.read_text("utf-8", errors="replace")))
    words.update(re.findall(r"[A-Za-z_]\w*", (ROOT / "pyproject.toml").read_text("utf-8")))
    return words


def modules() -> list[str]:
    """Every module of core/, core/kernels/ and gui/ (``__init__.py`` aside), as a path."""
    return sorted(str(p.relative_to(ROOT)) for pkg in ("core", "gui") for p in (ROOT / pkg).rglob("*.py")
                  if p.name != "__init__.py")


def _exists(path: str, words: set[str]) -> bool:
    """A file or folder, or a module's attribute written as a path (``gui/workers.TrainWorker``)."""
    if (ROOT / path).exists():
        return True
    module, dot, attr = path.rpartition(".")
    return bool(dot) and (ROOT / f"{module}.py").is_file() and all(a in words for a in attr.split("."))


def missing_paths(doc: str) -> list[str]:
    names = {p.name for folder in SOURCE_DIRS for p in (ROOT / folder).rglob("*")}
    words = source_words()
    gone = [p for p in sorted(cited_paths(doc)) if not _exists(p, words)]
    return gone + [f for f in sorted(cited_file_names(doc)) if f not in names]


def unmentioned_modules(doc: str) -> list[str]:
    """Modules the doc names neither by path nor by dotted name; a kernel launcher or numpy twin of an op
    counts as named by the doc's ``core/kernels/<op>.py`` / ``<op>_ref.py`` lines."""
    ops = {p.stem for p in (ROOT / "core" / "kernels").glob("*.cl")}
    out = []
    for path in modules():
        dotted = path[:-3].replace("/", ".")
        if path in doc or re.search(rf"\b{re.escape(dotted)}\b", doc):
            continue
        stem = Path(path).stem
        if path.startswith("core/kernels/") and (
                (stem in ops and "core/kernels/<op>.py" in doc)
                or (stem.endswith("_ref") and stem[:-4] in ops and "core/kernels/<op>_ref.py" in doc)):
            continue
        out.append(path)
    return out


def unlisted_modules(doc: str) -> list[str]:
    """Modules directly in core/ or gui/ without a line of their own in the doc's module lists (a line that
    starts with the module's path)."""
    listed = set(re.findall(r"^((?:core|gui)/\w+\.py)\b", doc, re.M))
    return [m for m in modules() if m.count("/") == 1 and m not in listed]


def misnamed_kernels() -> list[str]:
    """Kernels not named ``<op>_<what>`` after their file (sums.cl's ``sum_<what>``), as the doc says."""
    out = []
    for path in sorted((ROOT / "core" / "kernels").glob("*.cl")):
        prefix = "sum_" if path.stem == "sums" else f"{path.stem}_"
        names = re.findall(r"__kernel\b[^{;]*?\bvoid\s+(\w+)\s*\(", path.read_text("utf-8"))
        assert names, f"no kernel found in {path.name}"
        out += [f"{path.name}: {n}" for n in names if not n.startswith(prefix)]
    return out


def unknown_names(doc: str) -> list[str]:
    words = source_words()
    return sorted(n for n in code_names(doc)
                  if n not in NOT_OURS and not all(part in words for part in n.split(".")))


def launch_cost_problem(doc: str) -> str:
    """"" when the doc gives core/device.py's figure for one launch through Device.launch."""
    device = (ROOT / "core" / "device.py").read_text("utf-8")
    m = re.search(r"against about (\d+) us here", device)
    assert m, "core/device.py no longer states its launch cost as 'against about N us here'"
    figures = set(re.findall(r"about (\d+) (?:us|µs) per launch", doc))
    return "" if figures == {m.group(1)} else f"doc says {sorted(figures)} us per launch, core/device.py {m.group(1)}"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text("utf-8")


def test_every_cited_file_exists(doc):
    assert missing_paths(doc) == []


def test_every_module_of_core_and_gui_is_in_the_doc(doc):
    assert unmentioned_modules(doc) == []


def test_every_module_of_core_and_gui_has_its_line(doc):
    assert unlisted_modules(doc) == []


def test_kernels_are_named_as_the_doc_says(doc):
    assert "<op>_<what>" in doc and misnamed_kernels() == []


def test_every_code_name_in_backticks_is_in_the_sources(doc):
    assert unknown_names(doc) == []


def test_the_launch_cost_is_the_one_core_device_states(doc):
    assert launch_cost_problem(doc) == ""
