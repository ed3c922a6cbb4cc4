"""Visible prose per chapter page: the words a reader sees without opening a folded block.

    .venv/bin/python -m tools.prose_budget          # a table, every page of the TOC

The Essentials path (``ESSENTIALS``: the introduction and the overviews of the chapters the
manifest marks ``essentials``, which show every framework's code side by side) is held to ``ESSENTIALS_BUDGET`` words in all.

Counted: the markdown cells of a notebook (or a page's Markdown), outside fenced code and
math blocks, HTML comments, and folded blocks -- a ``dropdown`` directive, or any directive
with ``:class: dropdown`` (an admonition folded by sphinx-book-theme).  Inline code and
inline math count as words, and so do the titles of folded blocks (a reader sees them).  tests/test_book.py holds every page to ``BUDGET`` words.
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


def essentials_words() -> int:
    """Visible words of the Essentials path, start to end."""
    return sum(visible_words(ROOT / p) for p in ESSENTIALS)


def main() -> int:
    over = 0
    for p in pages():
        n = visible_words(p)
        total = len(WORD.findall(page_markdown(p)))
        flag = "  OVER" if n > BUDGET else ""
        over += n > BUDGET
        print(f"{n:6d} visible / {total:6d} all  {p.relative_to(ROOT)}{flag}")
    print(f"budget {BUDGET} visible words a page; {over} page(s) over")
    total = essentials_words()
    print(f"Essentials path ({len(ESSENTIALS)} pages): {total} visible words, budget "
          f"{ESSENTIALS_BUDGET}{'  OVER' if total > ESSENTIALS_BUDGET else ''}")
    return 1 if over or total > ESSENTIALS_BUDGET else 0


if __name__ == "__main__":
    sys.exit(main())
