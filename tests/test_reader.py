"""What a reader sees: no test harness in the code a page shows, and an answer to every
exercise (AUTHORING.md, "Test machinery out of sight" and "Exercises")."""
import json
import re

import pytest

from helpers import ROOT
from tools import manifest

#: Code a reader sees: every code cell but those removed from the page (folded code counts:
#: one click shows it).
REMOVED = {"remove-cell", "remove-input"}

#: What the harness looks like in a code cell.  The settings a run uses are read with
#: ``hp = d2lmini.settings("<chapter>")``; checks, thresholds and timeouts live in d2lmini or
#: in ``remove-cell`` cells.
HARNESS = {
    "the profile object (P.)": re.compile(r"\bP\.\w"),
    "the profile object (P =)": re.compile(r"^\s*P\s*=", re.M),
    "get_profile": re.compile(r"\bget_profile\b"),
    "a profile's name": re.compile(r"""\bP?\.name\s*[!=]=|['"]smoke['"]"""),
    "a timeout": re.compile(r"\btimeouts?\b"),
    "a check's threshold": re.compile(r"\b(min_test_acc|max_acc_gap|acc_tol|min_acc|\w+_tol)\b"),
    "an assert": re.compile(r"^\s*assert\b", re.M),
}
#: Words that point at machinery a reader never sees.
POINTERS = re.compile(r"\bcheck cell\b|\bhidden check\b|\bremoved cell\b", re.I)
#: What the profile's description says; a Setup prints what a reader needs, not this.
PROFILE_TEXT = re.compile(r"stored outputs, <=|min a notebook|regression tests:")


#: Pages whose changes for these rules are written but wait for a re-execution, with where
#: they are.  Strict: once a page passes, its entry must go.
PENDING: dict[str, str] = {}


def _param(p):
    why = PENDING.get(str(p.relative_to(ROOT)))
    return pytest.param(p, marks=pytest.mark.xfail(reason=why, strict=True)) if why else p


def book_notebooks():
    for f in manifest.toc_files():
        p = ROOT / f"{f}.ipynb"
        if p.is_file():
            yield _param(p)


def book_pages():
    for f in manifest.toc_files():
        for suffix in (".ipynb", ".md"):
            p = ROOT / f"{f}{suffix}"
            if p.is_file():
                yield _param(p)


def cells(path):
    return json.loads(path.read_text())["cells"]


def tags(cell):
    return set(cell.get("metadata", {}).get("tags", []))


def rel(p):
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", list(book_notebooks()), ids=rel)
def test_no_harness_in_the_code_a_reader_sees(path):
    found = []
    for i, c in enumerate(cells(path)):
        src = "".join(c["source"])
        if c["cell_type"] == "markdown":
            if POINTERS.search(src):
                found.append(f"cell {i}: points at {POINTERS.search(src).group(0)!r}")
            continue
        if c["cell_type"] != "code" or REMOVED & tags(c):
            continue
        for what, pattern in HARNESS.items():
            m = pattern.search(src)
            if m:
                found.append(f"cell {i}: {what}: {m.group(0).strip()!r}")
        if POINTERS.search(src):
            found.append(f"cell {i}: points at {POINTERS.search(src).group(0)!r}")
        for out in c.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            if PROFILE_TEXT.search(text):
                found.append(f"cell {i}: its output shows the settings' description")
    assert not found, (f"{rel(path)} shows the test harness (read sizes with "
                       "d2lmini.settings(...), move checks into remove-cell cells):\n"
                       + "\n".join(found))


def test_hidden_stderr_is_a_frameworks_notice_never_an_error():
    """`remove-stderr` keeps a framework's chatter off the page (AUTHORING, the tag table):
    only on cells whose output is not compared, and never over a traceback or an error the
    reader would need to see."""
    found = []
    for path in book_notebooks():
        path = getattr(path, "values", (path,))[0]
        for i, c in enumerate(cells(path)):
            if "remove-stderr" not in tags(c):
                continue
            if "nbval-ignore-output" not in tags(c):
                found.append(f"{rel(path)} cell {i}: its output is compared")
            for out in c.get("outputs", []):
                text = "".join(out.get("text", "")) if out.get("name") == "stderr" else ""
                if re.search(r"Traceback|\w+Error\b", text):
                    found.append(f"{rel(path)} cell {i}: hides {text.strip()[:80]!r}")
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------- exercises
EXERCISES = re.compile(r"^## Exercises\s*$", re.M)
ITEM = re.compile(r"^(\d+)\.\s", re.M)
ANSWER = re.compile(r"^\s*:{3,}\{dropdown\}\s+Answer\b", re.M)   # inside the item, or below it
ANSWER_CELL = re.compile(r"\A# Answer to exercise (\d+)\b")


def exercises_text(path):
    """The text of the page's Exercises section (up to the next ``## `` heading), and for a
    notebook the code cells after it."""
    if path.suffix == ".md":
        text = path.read_text()
        m = EXERCISES.search(text)
        if not m:
            return None, []
        rest = text[m.end():]
        nxt = re.search(r"^#{1,2} ", rest, re.M)
        return rest[:nxt.start()] if nxt else rest, []
    cs = cells(path)
    for i, c in enumerate(cs):
        src = "".join(c["source"])
        m = EXERCISES.search(src) if c["cell_type"] == "markdown" else None
        if m:       # the section: this cell's rest, then the cells after it (questions, answers
            parts, code = [src[m.end():]], []          # and answer cells may alternate)
            for j, x in enumerate(cs[i + 1:], i + 1):
                if x["cell_type"] == "markdown":
                    parts.append("".join(x["source"]))
                elif x["cell_type"] == "code":
                    code.append((j, x))
            rest = "\n\n".join(parts)
            nxt = re.search(r"^#{1,2} ", rest, re.M)
            return rest[:nxt.start()] if nxt else rest, code
    return None, []


def exercise_items(section):
    """``{number: text up to the next item}`` of the section's top-level numbered list."""
    starts = list(ITEM.finditer(section))
    return {int(m.group(1)): section[m.end():(starts[n + 1].start() if n + 1 < len(starts) else None)]
            for n, m in enumerate(starts)}


def pages_with_exercises_required():
    """Every framework notebook and neutral page of the book's chapters, and the overviews of
    the Essentials path."""
    out = []
    for c in manifest.CHAPTERS:
        for stem in (*c.neutral, *c.lab_stems()):
            out.append(ROOT / c.folder / f"{stem}.ipynb")
        if c.essentials:
            out.append(ROOT / c.folder / "index.md")
    return out


@pytest.mark.parametrize("path", list(book_pages()), ids=rel)
def test_every_exercise_has_an_answer(path):
    section, after = exercises_text(path)
    required = path in pages_with_exercises_required()
    if section is None:
        assert not required, f"{rel(path)} has no '## Exercises' section"
        return
    items = exercise_items(section)
    assert len(items) >= 2 or not required, f"{rel(path)}: {len(items)} exercise(s); write two or three"
    assert list(items) == list(range(1, len(items) + 1)), f"{rel(path)}: exercises numbered {list(items)}"
    unanswered = [n for n, text in items.items() if not ANSWER.search(text)]
    assert not unanswered, (f"{rel(path)}: exercises {unanswered} have no folded answer "
                            "(':::{dropdown} Answer' inside the item, below its question)")
    for j, c in after:       # answer cells: after all the questions, or each below its answer
        m = ANSWER_CELL.match("".join(c["source"]))
        assert not m or int(m.group(1)) in items, \
            f"{rel(path)} cell {j}: '# Answer to exercise {m.group(1)}' names no exercise"
        assert "hide-cell" in tags(c) and "nbval-skip" not in tags(c), \
            f"{rel(path)} cell {j}: an answer cell is folded (hide-cell) and runs under the tests"


@pytest.mark.parametrize("path", [p for p in pages_with_exercises_required() if p.suffix == ".md"],
                         ids=rel)
def test_essentials_overviews_end_with_two_or_three_exercises(path):
    section, _ = exercises_text(path)
    assert section is not None, f"{rel(path)} has no '## Exercises' section"
    assert 2 <= len(exercise_items(section)) <= 3, f"{rel(path)}: two or three exercises"
