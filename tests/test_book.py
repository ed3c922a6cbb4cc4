"""The book builds with zero warnings (-W, nitpicky) and every notebook in the table of
contents becomes a page that shows its stored outputs."""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        for ch in part["chapters"]:
            files.append(ch["file"])
            files += [s["file"] for s in ch.get("sections", [])]
    return files


def test_every_notebook_is_in_the_toc():
    listed = {f for f in toc_files()}
    notebooks = {str(p.relative_to(ROOT).with_suffix(""))
                 for p in (ROOT / "chapters").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts}
    assert notebooks <= listed, f"not in _toc.yml: {sorted(notebooks - listed)}"


def test_book_builds_without_warnings(built_book):
    html, log = built_book
    assert (html / "index.html").is_file()
    for f in toc_files():
        page = html / f"{f}.html"
        assert page.is_file(), f
        src = ROOT / f"{f}.ipynb"
        if src.is_file():  # stored outputs are rendered, not re-executed
            nb = json.loads(src.read_text())
            if any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"):
                assert "cell_output" in page.read_text(), f


def test_book_needs_nothing_from_the_network(built_book):
    """Every script and stylesheet is served with the book (MathJax included)."""
    html, _ = built_book
    for page in html.rglob("*.html"):
        text = page.read_text(errors="replace")
        assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', text), page
