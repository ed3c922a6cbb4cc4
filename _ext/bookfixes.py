"""Small fixes to what jupyter-book 1.x emits, found by the browser test (tests/test_browser.py).

* sphinx-thebe registers its inline configuration script twice in this jupyter-book version,
  so the page declares ``const THEBE_JS_URL`` twice and the browser reports a SyntaxError.
  Identical scripts are emitted once.
* ``static/book.css``: the concept map's table fits the text column (inline code wraps), and
  code lines scroll inside their box.
"""
from pathlib import Path

STATIC = Path(__file__).parent / "static"


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
    app.connect("builder-inited", add_static_path)
    app.add_css_file("book.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
