"""Written once: what is framework-neutral in a chapter lives on its neutral page and in
d2lmini, and each framework notebook (a *lab*) shows what only its framework shows.  The
check: no code cell of one framework notebook equals, whitespace aside, a code cell of another
framework notebook of the same chapter.  A cell of one statement is exempt: it is a call of
d2lmini's on the lab's own results (``print(fitted.regimes() if fitted else ...)``), not a
copied lesson."""
import ast
import itertools
import json
import re

import pytest

from d2lmini.frameworks import NOTEBOOKS as FRAMEWORK_NOTEBOOKS
from helpers import ROOT
from tools import manifest

#: The chapters whose neutral lesson has a page of its own (the manifest's ``neutral``): their
#: labs hold to it.
WRITTEN_ONCE = {c.name: f"{c.neutral[0]}.ipynb" for c in manifest.CHAPTERS if c.neutral}


def _statements(source: str) -> int:
    try:
        return len(ast.parse(source).body)
    except SyntaxError:
        return 2                               # a cell magic or the like: compare it


def copied_cells(notebooks: dict) -> list[str]:
    """``"<a> cell i == <b> cell j: first line"`` for every code cell of more than one statement
    that two of ``notebooks`` (``{name: cells}``) hold word for word (whitespace aside)."""
    norm = {name: {re.sub(r"\s+", " ", "".join(c["source"])).strip(): i
                   for i, c in enumerate(cells) if c["cell_type"] == "code"
                   and _statements("".join(c["source"])) > 1}
            for name, cells in notebooks.items()}
    found = []
    for a, b in itertools.combinations(norm, 2):
        for text in norm[a].keys() & norm[b].keys():
            found.append(f"{a} cell {norm[a][text]} == {b} cell {norm[b][text]}: {text[:70]}")
    return sorted(found)


def test_the_check_finds_a_copied_cell_and_lets_a_call_be():
    def cell(src):
        return {"cell_type": "code", "source": [src]}
    lesson = "fits = {n: cc.fit(r) for n, r in rows.items()}\nprint(fits)"
    nbs = {"a": [cell(lesson), cell("print(fitted.report())"), cell("x = a_rows")],
           "b": [cell("x = b_rows"), cell("print(fitted.report())"),
                 cell(lesson.replace("\n", "\n   "))]}
    assert copied_cells(nbs) == [f"a cell 0 == b cell 2: {lesson.replace(chr(10), ' ')[:70]}"]


@pytest.mark.parametrize("chapter", sorted(WRITTEN_ONCE))
def test_a_framework_lab_copies_no_code_cell_of_another(chapter):
    folder = ROOT / "chapters" / chapter
    assert (folder / WRITTEN_ONCE[chapter]).is_file()
    notebooks = {fw: json.loads((folder / f"{fw}.ipynb").read_text())["cells"]
                 for fw in FRAMEWORK_NOTEBOOKS}
    copied = copied_cells(notebooks)
    assert not copied, (f"{len(copied)} code cells are copied between {chapter}'s framework "
                        "notebooks; what is neutral belongs on the neutral page or in d2lmini:\n"
                        + "\n".join(copied))


# -------------------------------------------------- a framework's lesson across its chapters
def _lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("framework", FRAMEWORK_NOTEBOOKS)
def test_a_chapter_does_not_repeat_another_chapters_code(framework):
    """A function a chapter wrote is used again from ``d2l`` (below), not shown again: no code
    cell of three lines or more appears word for word (whitespace aside) in two chapters'
    notebooks of one framework."""
    notebooks = {str(p.relative_to(ROOT)): json.loads(p.read_text())["cells"]
                 for p in sorted(ROOT.glob(f"chapters/*/{framework}*.ipynb"))}
    seen, found = {}, []
    for name, cells in notebooks.items():
        for i, c in enumerate(cells):
            src = "".join(c["source"])
            if c["cell_type"] != "code" or _lines(src) < 3:
                continue
            text = re.sub(r"\s+", " ", src).strip()
            other = seen.setdefault(text, (name, i))
            if other[0].split("/")[1] != name.split("/")[1]:
                found.append(f"{other[0]} cell {other[1]} == {name} cell {i}: {text[:60]}")
    assert not found, "\n".join(found)


def _function_source(text: str, name: str) -> str:
    """The text of top-level function ``name`` in the Python ``text``, decorators included."""
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(text.splitlines()[first - 1:node.end_lineno])


@pytest.mark.parametrize("framework", FRAMEWORK_NOTEBOOKS)
def test_the_saved_all_reduces_are_the_scratch_chapters(framework):
    """``d2l.allreduce`` and ``d2l.ring_allreduce``, which the communication chapter times, are
    the from-scratch chapter's cells word for word (d2l's ``#@save``, held by this test)."""
    module = ROOT / "d2lmini" / f"{'torch' if framework == 'pytorch' else framework}.py"
    cells = json.loads((ROOT / "chapters" / "scratch" / f"{framework}.ipynb").read_text())["cells"]
    for step in ("allreduce", "ring_allreduce"):
        cell = [c for c in cells if f"step:{step}" in c.get("metadata", {}).get("tags", [])]
        assert len(cell) == 1, (framework, step)
        assert (_function_source("".join(cell[0]["source"]), step)
                == _function_source(module.read_text(), step)), \
            f"{module.name}'s {step} differs from chapters/scratch/{framework}.ipynb's"
