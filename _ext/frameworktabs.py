"""Sphinx extension: show one step of a chapter in four framework tabs, taken from the notebooks.

Usage in a MyST page::

    ```{framework-tabs} scratch allreduce
    ```

finds, in ``chapters/scratch/{mxnet,pytorch,jax,paddle}.ipynb``, the code cells tagged
``step:allreduce`` (cell metadata ``tags``) and renders them as a sphinx-design tab-set, one
tab per framework, synchronised across the page.  The code shown is therefore always the
code that ran in the executed notebook.  A step missing from any notebook is a build error.
A tagged cell that defines functions or classes shows only those definitions (with their
decorators and the comment lines just above them): a demonstration line that follows a
definition in the notebook is not part of the step.

The side-by-side view (``sidebyside.py``) uses the same cells.

``step_cells`` is also used by the tests (tests/test_steps.py).
"""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

FRAMEWORKS = [("pytorch", "PyTorch"), ("jax", "JAX"), ("paddle", "Paddle"), ("mxnet", "MXNet")]
TAG_PREFIX = "step:"


def definitions_only(src: str) -> str:
    """The top-level ``def``/``class`` blocks of ``src`` (decorators and the comment lines
    directly above included), or ``src`` itself when it defines nothing."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    defs = [n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    if not defs:
        return src
    lines = src.splitlines()
    blocks = []
    for n in defs:
        start = min([n.lineno] + [d.lineno for d in n.decorator_list]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        blocks.append("\n".join(lines[start:n.end_lineno]).rstrip())
    return "\n\n\n".join(blocks)


def step_tags(nb_path: Path) -> dict[str, list[str]]:
    """``{step: [code of each tagged cell]}`` for one notebook (see ``definitions_only``)."""
    nb = json.loads(Path(nb_path).read_text())
    steps: dict[str, list[str]] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag.startswith(TAG_PREFIX):
                src = definitions_only("".join(cell["source"]))
                steps.setdefault(tag[len(TAG_PREFIX):], []).append(src.strip("\n"))
    return steps


def step_cells(root: Path, chapter: str, step: str) -> dict[str, str]:
    """The code of ``step`` in each framework's notebook of ``chapter``.

    Raises ``LookupError`` naming every notebook that lacks it.
    """
    found, missing = {}, []
    for key, _ in FRAMEWORKS:
        nb = Path(root) / "chapters" / chapter / f"{key}.ipynb"
        cells = step_tags(nb).get(step) if nb.is_file() else None
        if not cells:
            missing.append(str(nb.relative_to(root)))
        else:
            found[key] = "\n\n".join(cells)
    if missing:
        raise LookupError(f"step {step!r} is not tagged ('{TAG_PREFIX}{step}') in: "
                          + ", ".join(missing))
    return found


def script_functions(root: Path, pattern: str, step: str) -> dict[str, str]:
    """The top-level function ``step`` of each framework's script ``pattern`` (a path relative
    to the book's root with ``{fw}`` for the framework key, e.g.
    ``chapters/concise/recipe/{fw}_dp.py``), with its decorators and the comments above it.

    Raises ``LookupError`` naming every script that lacks it.
    """
    found, missing = {}, []
    for key, _ in FRAMEWORKS:
        path = Path(root) / pattern.format(fw=key)
        src = path.read_text() if path.is_file() else ""
        try:
            tree = ast.parse(src)
        except SyntaxError:
            tree = ast.parse("")
        node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == step), None)
        if node is None:
            missing.append(pattern.format(fw=key))
            continue
        lines = src.splitlines()
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        found[key] = "\n".join(lines[start:node.end_lineno]).rstrip()
    if missing:
        raise LookupError(f"function {step!r} is not defined in: " + ", ".join(missing))
    return found


def split_step(source: str, step: str) -> tuple[str, str]:
    """A step may name its own source, ``SOURCE:STEP`` (``devices:place``,
    ``chapters/concise/recipe/{fw}_dp.py:main``); otherwise it comes from ``source``."""
    if ":" in step:
        source, step = step.rsplit(":", 1)
    return source, step


def step_code(root: Path, source: str, step: str) -> dict[str, str]:
    """``step`` in each framework: from the notebooks of chapter ``source``, or, when
    ``source`` is a script pattern containing ``{fw}``, from those scripts.  A step written
    ``SOURCE:STEP`` comes from that source instead (``split_step``)."""
    source, step = split_step(source, step)
    if "{fw}" in source:
        return script_functions(root, source, step)
    return step_cells(root, source, step)


class FrameworkTabs(SphinxDirective):
    required_arguments = 2   # chapter, step
    has_content = False

    def run(self):
        chapter, step = self.arguments
        root = Path(self.env.srcdir)
        try:
            code = step_cells(root, chapter, step)
        except LookupError as e:
            raise self.error(str(e))
        here = Path(self.env.doc2path(self.env.docname)).parent
        lines = ["::::::{tab-set}", ":sync-group: framework", ""]
        for key, label in FRAMEWORKS:
            nb = root / "chapters" / chapter / f"{key}.ipynb"
            self.env.note_dependency(str(nb))
            link = os.path.relpath(nb, here)
            lines += [f":::::{{tab-item}} {label}", f":sync: {key}", "",
                      "````python", *code[key].splitlines(), "````", "",
                      f"<small>From [the {label} notebook]({link}).</small>", "", ":::::", ""]
        lines.append("::::::")
        container = nodes.container(classes=["framework-tabs"])
        self.state.nested_parse(StringList(lines), 0, container)
        return [container]


def setup(app):
    app.add_directive("framework-tabs", FrameworkTabs)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
