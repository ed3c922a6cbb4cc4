"""Sphinx extension: any two frameworks in adjacent columns, aligned step by step.

Usage in a MyST page::

    ```{side-by-side} scratch model allreduce train_step
    ```

shows, for each listed step of the chapter, the code cells tagged ``step:<name>`` in the four
notebooks (the same cells as the framework tabs, ``frameworktabs.step_cells``), one row per
step.  The first argument may instead be a script pattern with ``{fw}``, e.g.
``chapters/concise/recipe/{fw}_dp.py``: the steps are then the scripts' functions of those
names (``frameworktabs.script_functions``).  A step written ``SOURCE:STEP`` comes from
another chapter or script pattern (``devices:place``), so one view can follow a thread through
the book.  Two menus above the rows choose the left and the right framework; every row then shows
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
from pygments.token import Comment, Punctuation

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from bookfixes import add_static_path, line_spans   # the same static folder (_ext/static)
from frameworktabs import FRAMEWORKS, split_step, step_code

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
    """``code`` highlighted as Sphinx does (same Pygments classes), one span per line.

    Half a text column is narrower than a notebook's code, so long lines wrap; each line is a
    span with a hanging indent of its own indentation plus four columns (the book's
    ``code-line``, see ``bookfixes.line_spans``), so a wrapped line continues *under its own
    code*, never at the left margin.  The text is real code -- leading spaces and newlines
    included -- so the copy button copies a program that runs.  Two things are shortened, both
    where Python ignores the whitespace: the spaces that align trailing comments in a notebook
    (they only align there) shrink to two, and a continuation line inside brackets indented
    deeper than ``MAX_INDENT`` (aligned with its bracket) is indented ``MAX_INDENT``.
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
    while lines and not lines[-1]:
        lines.pop()
    fmt = HtmlFormatter(nowrap=True)
    out, depth = [], 0
    for toks in lines:
        if depth > 0 and toks and toks[0][1].strip(" ") == "":     # inside brackets
            toks = [(toks[0][0], toks[0][1][:MAX_INDENT])] + toks[1:]
        toks = [(t, "  ") if (i > 0 and v.strip(" ") == "" and len(v) > 2 and i + 1 < len(toks)
                              and toks[i + 1][0] in Comment) else (t, v)
                for i, (t, v) in enumerate(toks)]
        for t, v in toks:
            if t in Punctuation:
                depth += sum(v.count(c) for c in "([{") - sum(v.count(c) for c in ")]}")
        out.append(pygments_format(toks, fmt).removesuffix("\n") if toks else "")  # adds one
    return ('<div class="highlight"><pre>' + line_spans("\n".join(out) + "\n", 0, MAX_INDENT)
            + "</pre></div>")


def source_label(root: Path, source: str) -> str:
    """Where a step comes from, for its row's title: the chapter's title (the first line of its
    ``index.md``), after the script's name for a script pattern:
    ``chapters/concise/recipe/{fw}_dp.py`` -> "recipe/<framework>_dp.py, Concise ..."."""
    parts = Path(source).parts
    chapter = parts[1] if "{fw}" in source and len(parts) > 2 else source
    index = Path(root) / "chapters" / chapter / "index.md"
    title = (index.read_text().splitlines()[0].lstrip("# ").strip() if index.is_file()
             else chapter)
    if "{fw}" in source:
        return "/".join(parts[-2:]).replace("{fw}", "<framework>") + ", " + title
    return title


class SideBySide(SphinxDirective):
    required_arguments = 2        # chapter, then one or more steps
    optional_arguments = 20
    has_content = False

    def run(self):
        chapter, steps = self.arguments[0], self.arguments[1:]
        root = Path(self.env.srcdir)
        sources = {split_step(chapter, step)[0] for step in steps}
        for source in sorted(sources):
            for key, _ in FRAMEWORKS:
                self.env.note_dependency(
                    str(root / source.format(fw=key)) if "{fw}" in source
                    else str(root / "chapters" / source / f"{key}.ipynb"))
        outer = nodes.container(classes=["sbs", "full-width"])  # full-width: wide screens lend it the contents sidebar (book.css)
        outer += nodes.raw("", controls_html(), format="html")
        for step in steps:
            try:
                code = step_code(root, chapter, step)
            except LookupError as e:
                raise self.error(str(e))
            row = nodes.container(classes=["sbs-step"])
            source, name = split_step(chapter, step)
            where = ("" if len(sources) == 1 else      # rows from several places say whence
                     f' <span class="sbs-source">{html.escape(source_label(root, source))}</span>')
            row += nodes.raw("", f'<p class="sbs-step-name"><code>{html.escape(name)}</code>'
                             f'{where}</p>', format="html")
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
