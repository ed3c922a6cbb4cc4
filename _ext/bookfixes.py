"""Small fixes to what jupyter-book 1.x emits, found by the browser test (tests/test_browser.py).

* sphinx-thebe registers its inline configuration script twice in this jupyter-book version,
  so the page declares ``const THEBE_JS_URL`` twice and the browser reports a SyntaxError.
  Identical scripts are emitted once.
* Code and outputs are never cut at the right edge of their box: every line of a highlighted
  ``<pre>`` becomes a span of its own (``line_spans``), so that a line too long for the column
  wraps and continues *under its own code* (a hanging indent of its indentation plus four
  columns), never at the left margin.  The text of the ``<pre>`` is unchanged -- its real
  leading spaces and newlines stay -- so the copy button copies exactly the code that ran.
* The concept map (comparison page) breaks its identifiers only between their parts (after
  ``.``, ``_``, ``(``, ``,`` and ``/``, between CamelCase words), never in the middle of a word.
* ``static/book.css``: a wider text column on large screens, and the styles of the above.
"""
import html
import re
from pathlib import Path

STATIC = Path(__file__).parent / "static"
HANG = 4            # columns a wrapped line continues to the right of its line's indentation
MAX_INDENT = 24     # deeper indentation hangs here (a bracket-aligned continuation line)

_TAG = re.compile(r"(<[^>]*>)")
_PRE = re.compile(r'(<div class="([^"]*)"><div class="highlight"><pre>)(.*?)(</pre>)', re.S)


def line_spans(inner: str, skip: int = 0, max_indent: int = MAX_INDENT) -> str:
    """The inner HTML of a Pygments ``<pre>`` with each line wrapped in
    ``<span class="code-line" style="--indent: Nch">``; N is the line's indentation (leading
    spaces after the first ``skip`` characters, e.g. a diff's ``+``), at most ``max_indent``.

    The newlines stay between the spans, and every character of the text stays, so the
    ``<pre>``'s text is exactly what it was.  A token that spans lines (a docstring) is closed
    at the end of each line and reopened on the next.
    """
    lines, cur, stack = [], [], []
    for piece in _TAG.split(inner):
        if not piece:
            continue
        if piece.startswith("<"):
            cur.append(piece)
            if piece.startswith("</"):
                if stack:
                    stack.pop()
            elif not piece.endswith("/>"):
                stack.append(piece)
            continue
        parts = piece.split("\n")
        for i, part in enumerate(parts):
            if i:
                cur.append("</span>" * len(stack))
                lines.append(cur)
                cur = list(stack)
            if part:
                cur.append(part)
    lines.append(cur)
    out = []
    for n, pieces in enumerate(lines):
        body = "".join(pieces)
        text = html.unescape(_TAG.sub("", body))
        if n == len(lines) - 1 and not text:
            break                                   # the text's final newline: no line after it
        rest = text[skip:]
        indent = min(len(rest) - len(rest.lstrip(" ")) + (skip if rest.strip() else 0),
                     max_indent)
        if not text:
            body = ""                               # an empty line: CSS gives it a line's height
        else:
            body = _lead(pieces, skip)
        out.append(f'<span class="code-line" style="--indent: {indent}ch">{body}</span>')
    return "\n".join(out) + ("\n" if len(out) < len(lines) else "")


def _lead(pieces: list[str], skip: int) -> str:
    """A line's HTML with its leading spaces (after ``skip`` characters) in a
    ``<span class="code-indent">``, which CSS keeps unbreakable: a line too long for the column then
    wraps inside its code, never right after its indentation (which would show as a blank
    line)."""
    out, todo = [], True
    for piece in pieces:
        if todo and piece and not piece.startswith("<"):
            text = html.unescape(piece)
            keep = min(skip, len(text))
            skip -= keep
            rest = text[keep:]
            spaces = len(rest) - len(rest.lstrip(" "))
            if skip == 0 and (spaces or rest):
                todo = not rest[spaces:]                # still spaces only: the lead goes on
                piece = (html.escape(text[:keep], quote=False)
                         + (f'<span class="code-indent">{" " * spaces}</span>' if spaces else "")
                         + html.escape(rest[spaces:], quote=False))
        out.append(piece)
    return "".join(out)


def wrap_code_lines(body: str) -> str:
    """``line_spans`` applied to every highlighted ``<pre>`` of a page's body."""
    def one(m):
        head, classes, inner, tail = m.groups()
        if 'class="code-line' in inner:             # already done (the side-by-side view)
            return m.group(0)
        skip = 1 if "highlight-diff" in classes else 0
        return head + line_spans(inner, skip) + tail
    return _PRE.sub(one, body)


_CONCEPT = re.compile(r'<div class="concept-map[^"]*">.*?</table>', re.S)
_PRE_SPAN = re.compile(r'(<span class="pre">)([^<]*)(</span>)')
_PART = re.compile(r"(?<=[._(,/])(?=[^._(,/)])|(?<=[a-z])(?=[A-Z])")


def concept_map_breaks(body: str) -> str:
    """The code in the concept map may wrap only between the parts of an identifier: after
    ``.``, ``_``, ``(``, ``,`` and ``/``, and between the words of a CamelCase name.  Each
    part is an unbreakable span (``code-part``) and the parts are joined by ``<wbr>``, so
    narrow columns never cut a word ("torch.cuda.device_coun / t()") nor break at a hyphen
    ("--" / "node_rank")."""
    def code(m):
        parts = [p for p in _PART.split(m.group(2)) if p]
        return (m.group(1) + "<wbr>".join(f'<span class="code-part">{p}</span>' for p in parts)
                + m.group(3))
    return _CONCEPT.sub(lambda m: _PRE_SPAN.sub(code, m.group(0)), body)


def rewrite_body(app, pagename, templatename, context, doctree):
    body = context.get("body")
    if body:
        context["body"] = concept_map_breaks(wrap_code_lines(body))


def dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = (str(getattr(js, "filename", js) or ""),
               tuple(sorted((getattr(js, "attributes", None) or {}).items())))  # not priority
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def add_static_path(app):
    if str(STATIC) not in app.config.html_static_path:
        app.config.html_static_path.append(str(STATIC))


def setup(app):
    app.connect("html-page-context", dedupe_scripts)
    app.connect("html-page-context", rewrite_body)
    app.connect("builder-inited", add_static_path)
    app.add_css_file("book.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
