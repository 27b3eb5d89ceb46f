"""No import cycles in core/ and gui/: every import counts, also those inside functions and under
``if TYPE_CHECKING:`` (a cycle hidden in a function is still two modules that need each other).

Read with ``ast`` only: nothing is imported, so the test needs neither Qt nor OpenCL.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "gui")

# Pairs that may still import each other, each with the work that removes it. Delete the entry
# once that work is merged: the test then holds the line.
KNOWN_CYCLES: set[frozenset[str]] = set()  # none: keep it so


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that module ``name`` imports anywhere in its file."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .m import y
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from pkg import sub" imports the module pkg.sub; "from m import f" imports m
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            # "import core.kernels.matmul" also runs core/__init__ and core/kernels/__init__
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix != name:
                    out.add(prefix)
    return out


def import_graph() -> dict[str, set[str]]:
    """{module: project modules it imports} for every module of core/ and gui/."""
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan's algorithm), each as a
    sorted list of module names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    pruned = {}
    for a, targets in graph.items():
        pruned[a] = {b for b in targets if frozenset({a, b}) not in KNOWN_CYCLES or a not in graph.get(b, ())}
    return pruned


def test_the_graph_sees_function_level_and_type_checking_imports():
    graph = import_graph()
    assert "core.tokenizer" in graph and "gui.main_window" in graph and "core.kernels.matmul" in graph
    assert "core.config" in graph["gui.hyper_tab"]  # a top-level import
    assert "core.estimates" in graph["gui.plan_box"]  # imported inside PlanBox.show_plan
    assert "core.tokenizer" in graph["core.dataset"]  # under "if TYPE_CHECKING:"
    assert "core.chat_format" in graph["core.gguf_io"]  # "from core import chat_format"


def test_find_cycles_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    cycles = find_cycles(_without_known(import_graph()))
    assert not cycles, "import cycles (function-level imports included): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_known_exceptions_are_still_needed():
    """A known cycle that is gone must leave KNOWN_CYCLES (so that it cannot come back unnoticed)."""
    graph = import_graph()
    for pair in KNOWN_CYCLES:
        a, b = sorted(pair)
        assert b in graph[a] and a in graph[b], f"{a} <-> {b} is no longer a cycle: remove it from KNOWN_CYCLES"


def test_the_cli_and_the_app_drive_a_run_through_core_run():
    """Issue 23: one run driver. ``opencl-llm train`` and the app's TrainWorker both import core.run, and
    neither builds a Trainer itself; core.run and core.events (the events the app emits) import no Qt."""
    graph = import_graph()
    for front in ("core.cli", "gui.workers"):
        assert "core.run" in graph[front] and "core.events" in graph[front], front
        source = _modules()[front].read_text("utf-8")
        assert "Trainer(" not in source and "resume_trainer(" not in source and "base_trainer(" not in source
    assert "core.events" in graph["gui.events"]
    for mod in ("core.run", "core.events"):
        assert not any(m.startswith("gui") for m in graph[mod]), mod
