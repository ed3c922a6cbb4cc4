"""Small fixes to what jupyter-book 1.x emits, found by the browser test (tests/test_browser.py).

* sphinx-thebe registers its inline configuration script twice in this jupyter-book version,
  so the page declares ``const THEBE_JS_URL`` twice and the browser reports a SyntaxError.
  Identical scripts are emitted once.
"""


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


def setup(app):
    app.connect("html-page-context", dedupe_scripts)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
