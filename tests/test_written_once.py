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
