"""Sphinx extension: any two frameworks in adjacent columns, aligned step by step.

Usage in a MyST page::

    ```{side-by-side} scratch model allreduce train_step
    ```

shows, for each listed step of the chapter, the code cells tagged ``step:<name>`` in the four
notebooks (the same cells as the framework tabs, ``frameworktabs.step_cells``), one row per
step.  The first argument may instead be a script pattern with ``{fw}``, e.g.
``chapters/concise/recipe/{fw}_dp.py``: the steps are then the scripts' functions of those
names (``frameworktabs.script_functions``).  Two menus above the rows choose the left and the right framework; every row then shows
those two side by side, so the same step of the two programs sits at the same height.  All
four frameworks' code is in the page; the script only chooses which two are shown (without
JavaScript the page shows the default pair, PyTorch and JAX).
"""
from __future__ import annotations

import html
from pathlib import Path

from pygments import format as pygments_format, lex
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from pygments.token import Comment

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from bookfixes import add_static_path   # the same static folder (_ext/static)
from frameworktabs import FRAMEWORKS, step_code

DEFAULT = ("pytorch", "jax")
MAX_INDENT = 12   # columns; deeper (bracket-aligned) continuation lines start here in a half column


def controls_html() -> str:
    def select(side, chosen):
        options = "".join(f'<option value="{k}"{" selected" if k == chosen else ""}>'
                          f"{html.escape(label)}</option>" for k, label in FRAMEWORKS)
        return (f'<label class="sbs-choice">{side} <select class="sbs-select sbs-{side}" '
                f'aria-label="{side} column">{options}</select></label>')
    return ('<div class="sbs-controls">' + select("left", DEFAULT[0]) + " "
            + select("right", DEFAULT[1]) + "</div>")


def code_html(code: str) -> str:
    """``code`` highlighted as Sphinx does (same Pygments classes), one block per line.

    Half a text column is narrower than a notebook's code, so long lines wrap; each line is a
    block with a hanging indent of its own indentation plus four columns, so a wrapped line
    continues *under its own code*, never at the left margin.  The spaces that align trailing
    comments in a notebook (which only align there) shrink to two, and indentation deeper than
    ``MAX_INDENT`` (continuation lines aligned with a bracket) is shown as ``MAX_INDENT``.
    """
    lines, line = [], []
    for tok, value in lex(code, PythonLexer()):
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append(line)
                line = []
            if part:
                line.append((tok, part))
    if line:
        lines.append(line)
    fmt = HtmlFormatter(nowrap=True)
    out = []
    for toks in lines:
        text = "".join(v for _, v in toks)
        indent = min(len(text) - len(text.lstrip(" ")), MAX_INDENT)
        while toks and toks[0][1].strip(" ") == "":        # leading spaces become padding
            toks = toks[1:]
        if toks and toks[0][1].startswith(" "):
            toks = [(toks[0][0], toks[0][1].lstrip(" "))] + toks[1:]
        toks = [(t, "  ") if (v.strip(" ") == "" and len(v) > 2 and i + 1 < len(toks)
                              and toks[i + 1][0] in Comment) else (t, v)
                for i, (t, v) in enumerate(toks)]
        body = pygments_format(toks, fmt) if toks else ""
        out.append(f'<span class="sbs-line" style="--indent: {indent}ch">{body or " "}</span>')
    return '<div class="highlight"><pre>' + "".join(out) + "</pre></div>"


class SideBySide(SphinxDirective):
    required_arguments = 2        # chapter, then one or more steps
    optional_arguments = 20
    has_content = False

    def run(self):
        chapter, steps = self.arguments[0], self.arguments[1:]
        root = Path(self.env.srcdir)
        for key, _ in FRAMEWORKS:
            self.env.note_dependency(str(root / chapter.format(fw=key)) if "{fw}" in chapter
                                     else str(root / "chapters" / chapter / f"{key}.ipynb"))
        outer = nodes.container(classes=["sbs"])
        outer += nodes.raw("", controls_html(), format="html")
        for step in steps:
            try:
                code = step_code(root, chapter, step)
            except LookupError as e:
                raise self.error(str(e))
            row = nodes.container(classes=["sbs-step"])
            row += nodes.raw("", f'<p class="sbs-step-name"><code>{html.escape(step)}</code></p>',
                             format="html")
            grid = nodes.container(classes=["sbs-row"])
            for key, label in FRAMEWORKS:
                classes = ["sbs-cell", f"sbs-{key}"] + (["sbs-shown"] if key in DEFAULT else [])
                cell = nodes.container(classes=classes)
                cell += nodes.raw("", f'<p class="sbs-label">{html.escape(label)}</p>',
                                  format="html")
                cell += nodes.raw("", '<div class="highlight-python notranslate">'
                                  + code_html(code[key]) + "</div>", format="html")
                grid += cell
            row += grid
            outer += row
        return [outer]


def setup(app):
    app.add_directive("side-by-side", SideBySide)
    app.connect("builder-inited", add_static_path)
    app.add_css_file("sidebyside.css")
    app.add_js_file("sidebyside.js")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
