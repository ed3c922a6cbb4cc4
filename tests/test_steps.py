"""Side-by-side code cannot drift: every step a page shows in framework tabs or in the
side-by-side view is tagged in all four notebooks of its chapter, and the four notebooks of a
chapter tag the same steps."""
import json
import re

import pytest

from helpers import ROOT, load_ext

_tabs = load_ext("frameworktabs")
FRAMEWORKS, definitions_only, script_functions = (_tabs.FRAMEWORKS, _tabs.definitions_only,
                                                  _tabs.script_functions)
step_cells, step_code, step_tags = _tabs.step_cells, _tabs.step_code, _tabs.step_tags

DIRECTIVE = re.compile(r"```\{(framework-tabs|side-by-side)\}[ \t]+(\S+)[ \t]+([^\n]+)")


def pages():
    for p in sorted(ROOT.glob("chapters/**/*.md")) + [ROOT / "intro.md"]:
        yield p, p.read_text()
    for p in sorted(ROOT.glob("chapters/**/*.ipynb")):
        nb = json.loads(p.read_text())
        yield p, "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def referenced_steps():
    return sorted({(m.group(2), step, str(p.relative_to(ROOT)))
                   for p, text in pages() for m in DIRECTIVE.finditer(text)
                   for step in m.group(3).split()})


def test_pages_use_the_side_by_side_view():
    views = {str(p.relative_to(ROOT)) for p, text in pages() for m in DIRECTIVE.finditer(text)
             if m.group(1) == "side-by-side"}
    assert {"chapters/comparison/index.md", "chapters/scratch/index.md"} <= views


def chapters_with_notebooks():
    return sorted({p.parent.name for p in ROOT.glob("chapters/*/*.ipynb")})


def test_script_functions_are_found_by_name_and_missing_ones_named(tmp_path):
    for key, _ in FRAMEWORKS:
        (tmp_path / f"{key}_dp.py").write_text(
            f"import x\n\n# the step\ndef train_step(a):\n    return a  # {key}\n\nmain = 1\n")
    code = script_functions(tmp_path, "{fw}_dp.py", "train_step")
    assert code["jax"] == "# the step\ndef train_step(a):\n    return a  # jax"
    (tmp_path / "paddle_dp.py").write_text("def other():\n    pass\n")
    with pytest.raises(LookupError, match="'train_step' is not defined in: paddle_dp.py"):
        script_functions(tmp_path, "{fw}_dp.py", "train_step")


@pytest.mark.parametrize("chapter,step,page", referenced_steps())
def test_referenced_step_is_tagged_in_every_framework(chapter, step, page):
    code = step_code(ROOT, chapter, step)
    assert set(code) == {k for k, _ in FRAMEWORKS}
    assert all(c.strip() for c in code.values())


@pytest.mark.parametrize("chapter", chapters_with_notebooks())
def test_the_four_notebooks_tag_the_same_steps(chapter):
    tags = {k: set(step_tags(ROOT / "chapters" / chapter / f"{k}.ipynb"))
            for k, _ in FRAMEWORKS if (ROOT / "chapters" / chapter / f"{k}.ipynb").is_file()}
    union = set().union(*tags.values())
    missing = {k: sorted(union - v) for k, v in tags.items() if union - v}
    assert not missing, f"steps tagged in some notebooks of {chapter} but not in: {missing}"


def test_a_missing_step_is_an_error_that_names_the_notebook(tmp_path):
    d = tmp_path / "chapters" / "demo"
    d.mkdir(parents=True)
    for key, _ in FRAMEWORKS:
        tags = ["step:split"] if key != "jax" else []
        nb = {"cells": [{"cell_type": "code", "metadata": {"tags": tags}, "outputs": [],
                         "source": ["# NBVAL_IGNORE_OUTPUT\n", f"split_{key}()\n"]}],
              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        (d / f"{key}.ipynb").write_text(json.dumps(nb))
    with pytest.raises(LookupError, match=r"'split' is not tagged .* chapters/demo/jax.ipynb"):
        step_cells(tmp_path, "demo", "split")
    (d / "jax.ipynb").unlink()
    with pytest.raises(LookupError, match="jax.ipynb"):
        step_cells(tmp_path, "demo", "split")


def test_a_step_shows_its_definitions_not_the_demo_lines_around_them(tmp_path):
    src = ("import math\n"
           "# the step\n"
           "@decorate\n"
           "def step(x):\n"
           "    return x\n"
           "\n"
           "data_k = step(1)   # a demonstration, not part of the step\n"
           "class Helper:\n"
           "    pass\n")
    shown = definitions_only(src)
    assert shown.startswith("# the step\n@decorate\ndef step(x):")
    assert "class Helper:" in shown and "data_k" not in shown and "import math" not in shown
    assert definitions_only("x = 1\nprint(x)\n") == "x = 1\nprint(x)\n"   # no definition: all
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["step:x"]}, "outputs": [],
                     "source": src.splitlines(keepends=True)}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    p = tmp_path / "n.ipynb"
    p.write_text(json.dumps(nb))
    assert step_tags(p) == {"x": [shown]}
