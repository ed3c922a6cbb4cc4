"""The book's one picture (``tools/manifest.py``, and ``d2lmini/frameworks.py`` for the
frameworks): the table of contents is made from it, every tool reads it, and no other file
keeps a list of the frameworks or the chapters.  A chapter added to the manifest in a copy of
the repository is picked up by every tool."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT
from tools import manifest

FRAMEWORK_NAMES = r"(?:torch|pytorch|jax|paddle|mxnet)"
CHAPTER_NAMES = r"(?:devices|scratch|concise|comm|sharded|comparison)"


def literal_lists(text: str, names: str, at_least: int = 3) -> list[str]:
    """Tuples, lists, sets or dict displays in ``text`` that spell out ``at_least`` or more of
    ``names`` as string literals (keys or items), one after the other."""
    # a spelling map's value: another spelling (``"torch": "pytorch"``, ``"pytorch_fast.py"``)
    value = rf"""(?:\s*:\s*r?['"]{names}(?:_\w+\.py)?['"])?"""
    item = rf"""['"]{names}['"]{value}"""
    pattern = rf"[\(\[\{{]\s*{item}(?:\s*,\s*{item}){{{at_least - 1},}}"
    return [m.group(0)[:80] for m in re.finditer(pattern, text)]


def test_the_search_finds_a_list_and_lets_a_pair_be():
    assert literal_lists('FW = ("torch", "jax", "paddle", "mxnet")', FRAMEWORK_NAMES)
    assert literal_lists("{'mxnet': 'mxnet', 'torch': 'pytorch', 'jax': 'jax'}", FRAMEWORK_NAMES)
    assert not literal_lists('if fw in ("mxnet", "jax"):', FRAMEWORK_NAMES)
    # per framework its own code or data (a dispatch table, its knob) is not a list of them
    assert not literal_lists('{"torch": Torch, "jax": Jax, "paddle": Paddle}', FRAMEWORK_NAMES)
    assert not literal_lists('{"torch": "channels_last", "jax": "donate", "paddle": "nhwc"}',
                             FRAMEWORK_NAMES)


def test_no_file_but_the_manifest_lists_the_frameworks_or_the_chapters():
    """Searched: every Python file of the library, the tools, the Sphinx extensions and the
    tests, for a literal tuple, list, set or dict of three or more framework (or chapter)
    names.  The manifest and the frameworks' module are the only places allowed."""
    allowed = {ROOT / "d2lmini" / "frameworks.py", ROOT / "tools" / "manifest.py",
               ROOT / "tests" / "test_manifest.py"}
    files = [p for folder in ("d2lmini", "tools", "_ext", "tests") for p in (ROOT / folder).rglob("*.py")]
    files.append(ROOT / "conftest.py")
    found = []
    for path in files:
        if path in allowed:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {hit}"
                  for hit in literal_lists(text, FRAMEWORK_NAMES) + literal_lists(text, CHAPTER_NAMES)]
    assert not found, ("lists of the frameworks or chapters outside tools/manifest.py and "
                       "d2lmini/frameworks.py:\n" + "\n".join(found))


def test_the_table_of_contents_is_the_manifests():
    assert (ROOT / "_toc.yml").read_text() == manifest.toc_yaml(), \
        "_toc.yml is not the manifest's: python -m tools.manifest --write-toc (make book does it)"
    listed = set(manifest.toc_files())
    for c in manifest.CHAPTERS:
        for f in c.files():
            assert any((ROOT / f"{f}{s}").is_file() for s in (".md", ".ipynb")), f
            assert f in listed


FAKE = '''    Chapter("fake", "A Fake Part", neutral=("model",), lab_pages=("deep",), profile="scratch",
            essentials=True,
            gpu_run=True, steps={"fake_step": "step"}, trains={"labs": "scratch"},
            rehearsal={"labs": dict(section="scratch", runs="[]",
                                    thresholds={"min_test_acc": "P.scratch.min_test_acc"})}),
'''
PROBE = r'''
import json
from tools import gpu_run, manifest, prose_budget, rehearse, tag_steps
fake = manifest.chapter("fake")
print("PROBE " + json.dumps({
    "toc": manifest.toc_files(),
    "written": open("_toc.yml").read(),
    "pages": [str(p.relative_to(manifest.ROOT)) for p in prose_budget.pages()],
    "essentials": list(prose_budget.ESSENTIALS),
    "gpu_run": list(gpu_run.CHAPTERS),
    "steps": tag_steps.STEPS.get("fake"),
    "rehearsal": rehearse.harvest_of(fake.lab("torch"))["section"],
    "lab": str(fake.lab("pytorch").relative_to(manifest.ROOT)),
}))
'''


def test_a_chapter_added_to_the_manifest_reaches_every_tool(tmp_path):
    """Adding a chapter is writing its files and one manifest entry: in a copy of the
    repository with a fake chapter, the TOC, the prose budget, the Essentials path, the GPU
    run, the step tags and the rehearsal all have it."""
    copy = tmp_path / "book"
    shutil.copytree(ROOT / "tools", copy / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "d2lmini").symlink_to(ROOT / "d2lmini")
    for f in ("intro.md", "api.md", "_toc.yml"):
        shutil.copy(ROOT / f, copy / f)
    text = (copy / "tools" / "manifest.py").read_text()
    anchor = '\n)\n\n\ndef chapter('
    assert anchor in text
    (copy / "tools" / "manifest.py").write_text(text.replace(anchor, "\n" + FAKE.rstrip("\n") + anchor, 1))
    fake = copy / "chapters" / "fake"
    fake.mkdir(parents=True)
    (fake / "index.md").write_text("# A fake chapter\n\nIts overview.\n")
    nb = {"cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# Fake\n"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    labs = ("pytorch", "jax", "paddle", "mxnet")
    for stem in ("model", *labs, *(f"{lab}-deep" for lab in labs)):
        (fake / f"{stem}.ipynb").write_text(json.dumps(nb))
    r = subprocess.run([sys.executable, "-m", "tools.manifest", "--write-toc"], cwd=copy,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=copy, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.split("PROBE ", 1)[1])
    files = ["chapters/fake/index", "chapters/fake/model", "chapters/fake/pytorch",
             "chapters/fake/jax", "chapters/fake/paddle", "chapters/fake/mxnet",
             "chapters/fake/pytorch-deep", "chapters/fake/jax-deep", "chapters/fake/paddle-deep",
             "chapters/fake/mxnet-deep"]
    assert [f for f in got["toc"] if f.startswith("chapters/fake/")] == files
    assert "caption: A Fake Part" in got["written"] and "file: chapters/fake/model" in got["written"]
    assert {f"{f}.md" if f.endswith("index") else f"{f}.ipynb" for f in files} <= set(got["pages"])
    assert "chapters/fake/index.md" in got["essentials"]
    assert "fake" in got["gpu_run"]
    assert got["steps"] == {"fake_step": "step"}
    assert got["rehearsal"] == "scratch"
    assert got["lab"] == "chapters/fake/pytorch.ipynb"


def _sections(path):
    cells = json.loads(path.read_text())["cells"]
    return [line for c in cells if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("chapter", [c.name for c in manifest.lab_chapters()])
def test_a_chapters_framework_notebooks_share_one_skeleton(chapter):
    """The labs of a chapter have the same ``##`` sections in the same order, and so do the
    in-depth pages written once per framework (``Chapter.lab_pages``): the differences a
    reader sees side by side are the frameworks'."""
    c = manifest.chapter(chapter)
    groups = {"labs": c.page("labs"), **{key: c.page(key) for key in c.lab_pages}}
    for key, paths in groups.items():
        skeletons = {p.name: _sections(p) for p in paths}
        first = next(iter(skeletons.values()))
        assert first, (chapter, key)
        differ = {name: s for name, s in skeletons.items() if s != first}
        assert not differ, f"{chapter} {key}: {paths[0].name} has {first}, but {differ}"
