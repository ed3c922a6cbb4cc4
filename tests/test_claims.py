"""Every True/False a checked cell prints holds on a GPU too (AUTHORING.md, "Claims").

nbval compares a checked cell's stored output with a new run's.  A printed ``True`` computed
with a GPU's defaults -- TF32, a cuDNN algorithm chosen per shape -- can turn ``False`` there
while it holds on every CPU: on one H200, concise/pytorch's "accuracy on all devices == on one
device" did (2026-11-27), because the split batches ran other convolution algorithms than the
whole batch and an argmax flipped.  So every checked cell whose output holds ``True``/``False``
says in a cell tag what kind of claim it prints, and this test holds it to that:

``claim:exact``     computed exactly: inside ``exact_numerics()``, in float64, or by runs made
                    exact (``D2LMINI_EXACT=1``).  The cell, or a cell that binds a name it
                    reads, must show it (``exact_numerics(``, ``float64``, ``.double(``, ...).
``claim:bound``     an inequality whose tolerance holds under TF32 and per-shape algorithms
                    (the prose or a comment says which): the cell must compare against a
                    named tolerance or margin.
``claim:discrete``  decided without floating-point arithmetic: shapes, counts, integers,
                    dtypes, strings, raised errors, device placement, equalities of integer
                    data.  It must not compare floats within a tolerance (that is a bound).
"""
import json
import re

import pytest

from test_book import _bound_and_loaded     # the names a cell binds and reads
from helpers import ROOT

KINDS = ("claim:exact", "claim:bound", "claim:discrete")
BOOL = re.compile(r"\b(True|False)\b")
EXACT = re.compile(r"exact_numerics\(|float64|\.double\(|enable_x64|jax_enable_x64|"
                   r"exact=(True|on_gpu)|D2LMINI_EXACT|\bf64\b")
TOLERANCE = re.compile(r"\bTOL\b|\btol\b|_TOL\b|_BOUND\b|tolerance|margin|MARGIN|allclose|isclose|"
                       r"predictions_agree|max_acc_gap|\brtol\b|\batol\b", re.I)
FLOAT_TOLERANCE = re.compile(r"allclose|isclose|\bTOL\b|\btol\b|\batol\b|\brtol\b", re.I)


def checked_claims(cells):
    """(index, cell) of the code cells nbval compares whose stored output prints a boolean."""
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        tags = c.get("metadata", {}).get("tags", [])
        if "nbval-ignore-output" in tags or "nbval-skip" in tags:
            continue
        text = "".join("".join(o.get("text", "")) for o in c.get("outputs", []))
        if BOOL.search(text):
            yield i, c


def _names(source: str) -> tuple[set[str], set[str]]:
    """The names a cell binds and the names it reads (IPython magics: none)."""
    try:
        return _bound_and_loaded(source)
    except SyntaxError:
        return set(), set()


def sources_behind(cells, index: int) -> list[str]:
    """The claim cell's source and the sources of the cells that last bound, before it, a
    name it reads and does not bind itself (one level: the cells whose values it prints or
    compares)."""
    src = "".join(cells[index]["source"])
    bound, loaded = _names(src)
    behind = [src]
    for name in loaded - bound:
        for j in range(index - 1, -1, -1):
            c = cells[j]
            if c["cell_type"] == "code" and name in _names("".join(c["source"]))[0]:
                behind.append("".join(c["source"]))
                break
    return behind


def problems_of(cells) -> list[str]:
    out = []
    for i, c in checked_claims(cells):
        kinds = [t for t in c.get("metadata", {}).get("tags", []) if t.startswith("claim:")]
        src = "".join(c["source"])
        if len(kinds) != 1 or kinds[0] not in KINDS:
            out.append(f"cell {i} prints True/False but is tagged {kinds or 'with no claim'}: "
                       f"tag it with one of {', '.join(KINDS)}")
        elif kinds[0] == "claim:exact" and not any(EXACT.search(s)
                                                   for s in sources_behind(cells, i)):
            out.append(f"cell {i} is claim:exact, but neither it nor a cell it reads from "
                       f"computes exactly (exact_numerics(), float64, exact runs)")
        elif kinds[0] == "claim:bound" and not TOLERANCE.search(src):
            out.append(f"cell {i} is claim:bound but compares against no named tolerance")
        elif kinds[0] == "claim:discrete" and FLOAT_TOLERANCE.search(src):
            out.append(f"cell {i} is claim:discrete but compares floats within a tolerance: "
                       f"tag it claim:bound or claim:exact")
    return out


def notebooks():
    return sorted(p for p in (ROOT / "chapters").rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("nb", notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_printed_boolean_says_what_kind_of_claim_it_is(nb):
    problems = problems_of(json.loads(nb.read_text())["cells"])
    assert not problems, f"{nb.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def _cell(source, output, tags=()):
    return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}]}


def test_the_claims_check_fails_on_the_cell_that_failed_on_the_h200():
    """The evaluation cell of concise/pytorch as it was before the fix (7e17007): float32
    accuracies compared with ==, no exact scope anywhere it reads from."""
    train = _cell("run_1 = train(1, P.concise.batch_size, P.concise.lr)", "")
    train["metadata"]["tags"] = ["nbval-ignore-output"]
    old = _cell("test_iter = d2lmini.BatchIterator(data.X_test, data.y_test, 256)\n"
                "replicas = [copy.deepcopy(run_1['net']).to(d) for d in devices]\n"
                "acc_all = d2l.evaluate_accuracy(replicas, test_iter, devices)\n"
                "acc_one = d2l.evaluate_accuracy(replicas[:1], test_iter, devices[:1])\n"
                "print('... == on one device:', acc_all == acc_one)",
                "test accuracy with every batch split over all devices == on one device: True\n")
    assert "no claim" in problems_of([train, old])[0]
    old["metadata"]["tags"] = ["claim:exact"]
    assert "computes exactly" in problems_of([train, old])[0]
    fixed = dict(old, source=["with d2l.exact_numerics():\n", "    " + "".join(old["source"])])
    assert problems_of([train, fixed]) == []
    assert "no named tolerance" in problems_of([train, dict(old, metadata={"tags": ["claim:bound"]})])[0]
    close = _cell("print(np.allclose(a, b))", "True\n", ["claim:discrete"])
    assert "within a tolerance" in problems_of([close])[0]
    ignored = _cell("print(a == b)", "True\n", ["nbval-ignore-output"])
    assert problems_of([ignored]) == []
