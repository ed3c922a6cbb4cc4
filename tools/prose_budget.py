"""Visible prose per chapter page: the words a reader sees without opening a folded block.

    .venv/bin/python -m tools.prose_budget          # a table, every page of the TOC

The Essentials path (``ESSENTIALS``: the introduction and the overviews of the chapters the
manifest marks ``essentials``, which show every framework's code side by side) is held to ``ESSENTIALS_BUDGET`` words in all.

Counted: the markdown cells of a notebook (or a page's Markdown), outside fenced code and
math blocks, HTML comments, and folded blocks -- a ``dropdown`` directive, or any directive
with ``:class: dropdown`` (an admonition folded by sphinx-book-theme).  Inline code and
inline math count as words, and so do the titles of folded blocks (a reader sees them).  tests/test_book.py holds every page to ``BUDGET`` words.

What a reader reads on a page, folded blocks opened (``reader_words``): the prose, folded or
not, the Markdown a page includes (``{include}``: the generated results tables), and the
Markdown and text that its visible cells print -- at most ``PAGE_BUDGET`` words a page.  A
folded block is worth opening: at least ``MIN_DROPDOWN`` words; a note shorter than that is a
sentence of the page.  Pages over the budget are a lesson with an appendix inside it: the
appendix goes to an in-depth page of its chapter (AUTHORING.md, *Pages*).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tools import manifest

ROOT = manifest.ROOT
BUDGET = 2500
ESSENTIALS_BUDGET = 8000
PAGE_BUDGET = 4000          # words a reader reads on a page, folded blocks included
MIN_DROPDOWN = 60           # words in a folded block
# The Essentials path, in reading order (intro.md's "Two ways through the book" lists it).
ESSENTIALS = manifest.essentials()
WORD = re.compile(r"[A-Za-z0-9$`\\][\w'’.$`\\{}^-]*")
FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})(.*)$")


def visible_text(markdown: str) -> str:
    """``markdown`` without code/math blocks, comments and folded blocks."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    out, stack = [], []       # stack of (fence, hidden) for the open blocks
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if stack and m and m.group(2) == stack[-1][0] and not m.group(3).strip():
            stack.pop()                                   # closes the innermost block
            i += 1
            continue
        if m and m.group(3).strip():                      # opens a block
            fence, info = m.group(2), m.group(3).strip()
            hidden = any(h for _, h in stack)
            directive = re.match(r"\{([\w:-]+)\}", info)
            if fence.startswith("`") and not directive:
                hidden = True                             # a code block
            elif directive:
                name = directive.group(1)
                opts = []
                j = i + 1
                while j < len(lines) and lines[j].lstrip().startswith(":") and not FENCE.match(lines[j]):
                    opts.append(lines[j])
                    j += 1
                folded = name == "dropdown" or any(
                    re.match(r"\s*:class:.*\bdropdown\b", o) for o in opts)
                if not hidden and len(info) > len(directive.group(0)):
                    out.append(info[len(directive.group(0)):])   # a title: shown, even folded
                if folded or name in ("code-cell", "code-block", "code", "math",
                                      "literalinclude", "framework-tabs", "side-by-side"):
                    hidden = True
            stack.append((fence, hidden))
            i += 1
            continue
        if not any(h for _, h in stack) and not line.lstrip().startswith(":"):
            out.append(line)
        i += 1
    text = "\n".join(out)
    return re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)


def page_markdown(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        return "\n\n".join("".join(c["source"]) for c in nb["cells"]
                           if c["cell_type"] == "markdown")
    return path.read_text()


def visible_words(path: Path) -> int:
    return len(WORD.findall(visible_text(page_markdown(path))))


def pages() -> list[Path]:
    found = []
    for f in manifest.toc_files():
        for suffix in (".ipynb", ".md"):
            if (ROOT / f"{f}{suffix}").is_file() and ROOT / f"{f}{suffix}" not in found:
                found.append(ROOT / f"{f}{suffix}")
    return found


def _all_prose(markdown: str) -> str:
    """``markdown`` without code and math blocks and comments, folded blocks kept."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    out, stack = [], []
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if stack and m and m.group(2) == stack[-1][0] and not m.group(3).strip():
            stack.pop()
            continue
        if m and m.group(3).strip():
            fence, info = m.group(2), m.group(3).strip()
            directive = re.match(r"\{([\w:-]+)\}", info)
            code = (fence.startswith("`") and not directive) or (directive and directive.group(1) in (
                "code-cell", "code-block", "code", "math", "literalinclude", "framework-tabs",
                "side-by-side", "include"))
            if directive and not code and len(info) > len(directive.group(0)):
                out.append(info[len(directive.group(0)):])
            stack.append((fence, code or any(h for _, h in stack)))
            continue
        if not any(h for _, h in stack) and not line.lstrip().startswith(":"):
            out.append(line)
    return re.sub(r"\$\$.*?\$\$", " ", "\n".join(out), flags=re.S)


def _included(path: Path, markdown: str) -> str:
    """The Markdown files a page includes with ``{include}``, one after another."""
    found = re.findall(r"^\s*(?:`{3,}|:{3,})\{include\}\s+(\S+\.md)\s*$", markdown, flags=re.M)
    return "\n\n".join((path.parent / f).read_text() for f in found
                         if (path.parent / f).is_file())


def _printed(cell: dict) -> str:
    """The Markdown and text a visible code cell shows (none for a removed cell or output)."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    if tags & {"remove-cell", "remove-output"}:
        return ""
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
            out.append("".join(o["text"]))
        elif o.get("output_type") in ("display_data", "execute_result"):
            data = o.get("data", {})
            if "text/markdown" in data:
                out.append(_all_prose("".join(data["text/markdown"])))
            elif "text/html" not in data and "image/svg+xml" not in data \
                    and "image/png" not in data and "text/plain" in data:
                out.append("".join(data["text/plain"]))
    return "\n".join(out)


def reader_words(path: Path) -> int:
    """Words a reader reads on the page with every folded block opened: prose, included
    Markdown, and what the visible cells print (module docstring)."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        parts = [_all_prose("".join(c["source"])) if c["cell_type"] == "markdown"
                 else _printed(c) for c in nb["cells"]]
    else:
        md = path.read_text()
        parts = [_all_prose(md), _all_prose(_included(path, md))]
    return len(WORD.findall("\n".join(parts)))


def dropdowns(path: Path) -> list[tuple[str, int]]:
    """``(title, words)`` of every folded block of the page's prose (a ``dropdown``, or a
    directive with ``:class: dropdown``), nested ones counted in their own right."""
    found, stack = [], []                 # stack: [fence, title or None, lines]
    for line in page_markdown(path).splitlines():
        m = FENCE.match(line)
        if stack and m and m.group(2) == stack[-1][0] and not m.group(3).strip():
            fence, title, body = stack.pop()
            if title is not None:
                found.append((title, len(WORD.findall(_all_prose("\n".join(body))))))
            if stack:
                stack[-1][2].extend(body)
            continue
        if m and m.group(3).strip():
            info = m.group(3).strip()
            directive = re.match(r"\{([\w:-]+)\}", info)
            title = info[len(directive.group(0)):].strip() if directive else None
            stack.append([m.group(2), title if directive and directive.group(1) == "dropdown"
                          else None, []])
            continue
        if stack:
            if re.match(r"\s*:class:.*\bdropdown\b", line) and stack[-1][1] is None \
                    and not stack[-1][2]:
                stack[-1][1] = "(folded)"
            stack[-1][2].append(line)
    return found


def essentials_words() -> int:
    """Visible words of the Essentials path, start to end."""
    return sum(visible_words(ROOT / p) for p in ESSENTIALS)


def main() -> int:
    over = 0
    for p in pages():
        n, read = visible_words(p), reader_words(p)
        small = [t for t, w in dropdowns(p) if w < MIN_DROPDOWN and not t.startswith("Answer")]
        flag = ("  OVER" if n > BUDGET or read > PAGE_BUDGET else "") + \
            (f"  {len(small)} dropdown(s) under {MIN_DROPDOWN} words" if small else "")
        over += n > BUDGET or read > PAGE_BUDGET
        print(f"{n:6d} visible / {read:6d} read  {p.relative_to(ROOT)}{flag}")
    print(f"budget {BUDGET} visible words and {PAGE_BUDGET} read a page; {over} page(s) over")
    total = essentials_words()
    print(f"Essentials path ({len(ESSENTIALS)} pages): {total} visible words, budget "
          f"{ESSENTIALS_BUDGET}{'  OVER' if total > ESSENTIALS_BUDGET else ''}")
    return 1 if over or total > ESSENTIALS_BUDGET else 0


if __name__ == "__main__":
    sys.exit(main())
