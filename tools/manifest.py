"""The book, once: its parts, chapters and pages, and what each tool does with them.

    python -m tools.manifest              # the book as the tools see it
    python -m tools.manifest --write-toc  # _toc.yml from this manifest (make book does it)

Every tool, ``conftest.py``, ``_ext`` and the tests read the book's picture here (and the
frameworks from :mod:`d2lmini.frameworks`): adding a chapter is writing its files and adding
one :class:`Chapter` to :data:`CHAPTERS` (``tests/test_manifest.py`` adds a fake one in a copy
of the repository and shows every tool picking it up).

A chapter lives in ``chapters/<name>/``: an overview ``index.md``; its neutral pages (the
lesson written once, before the labs); with ``labs``, one notebook per framework
(``pytorch.ipynb``, ...; :data:`d2lmini.frameworks.NOTEBOOKS`); its in-depth pages written once
per framework (``pytorch-in-depth.ipynb``, ...: a lab's appendix, in the labs' order); then
its further pages.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from d2lmini.frameworks import (ALIASES, FRAMEWORKS, KEYS, NOTEBOOKS, TITLES,  # noqa: F401
                                Framework, get)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS_DIR = "chapters"


@dataclass(frozen=True)
class Chapter:
    """One chapter: ``chapters/<name>/``.

    - ``part``: the caption of the TOC part it belongs to (parts keep their first order);
    - ``neutral``: stems of its framework-neutral pages, listed before the labs (the lesson
      written once; ``tests/test_written_once.py`` holds the labs to it);
    - ``labs``: whether it has one notebook per framework;
    - ``lab_pages``: stems of in-depth pages written once per framework, each a lab's
      appendix (``<notebook>-<stem>.ipynb``: ``pytorch-in-depth.ipynb``, ...), listed after
      the labs in the frameworks' order, with the same sections in all four;
    - ``pages``: stems of further pages, listed after the labs;
    - ``profile``: the :class:`d2lmini.config.Profile` field its labs' sizes are in;
    - ``essentials``: its overview is on the Essentials path (``tools.prose_budget``);
    - ``gpu_run``: ``tools.gpu_run`` runs its framework notebooks on a GPU server;
    - ``steps``: ``{function: step}`` -- the cells defining these functions are tagged
      ``step:<step>`` (``tools.tag_steps``) for the framework tabs;
    - ``trains``: ``{page: profile section}`` of the notebooks whose training the gpu profile
      sizes (``"labs"`` for the framework notebooks);
    - ``rehearsal``: ``{page: what tools.rehearse harvests}`` and ``not_rehearsed``:
      ``{page: why its thresholds are safe without a rehearsal}``."""
    name: str
    part: str
    neutral: tuple[str, ...] = ()
    labs: bool = True
    lab_pages: tuple[str, ...] = ()
    pages: tuple[str, ...] = ()
    profile: str | None = None
    essentials: bool = False
    gpu_run: bool = False
    steps: dict = field(default_factory=dict)
    trains: dict = field(default_factory=dict)
    rehearsal: dict = field(default_factory=dict)
    not_rehearsed: dict = field(default_factory=dict)

    @property
    def folder(self) -> str:
        return f"{CHAPTERS_DIR}/{self.name}"

    def lab_stems(self) -> tuple[str, ...]:
        return NOTEBOOKS if self.labs else ()

    def lab_page_stems(self, notebook: str | None = None) -> tuple[str, ...]:
        """The in-depth pages written once per framework (``<notebook>-<stem>``), in reading
        order; with ``notebook``, that lab's only."""
        return tuple(f"{nb}-{stem}" for stem in self.lab_pages for nb in self.lab_stems()
                     if notebook in (None, nb))

    def files(self) -> list[str]:
        """The chapter's pages in reading order, as TOC entries (no suffix): the overview,
        the neutral pages, the labs, the labs' in-depth pages, the further pages."""
        return [f"{self.folder}/{s}" for s in
                ("index", *self.neutral, *self.lab_stems(), *self.lab_page_stems(), *self.pages)]

    def lab(self, framework: str) -> Path:
        """The lab notebook of ``framework`` (any spelling)."""
        if not self.labs:
            raise ValueError(f"the {self.name} chapter has no framework notebooks")
        return ROOT / self.folder / f"{get(framework).notebook}.ipynb"

    def page(self, key: str) -> list[Path]:
        """The notebooks a ``trains``/``rehearsal`` key names: ``"labs"``, a ``lab_pages``
        stem (its four notebooks) or a page stem."""
        if key == "labs":
            return [self.lab(fw.key) for fw in FRAMEWORKS]
        if key in self.lab_pages:
            return [ROOT / self.folder / f"{s}.ipynb" for s in self.lab_page_stems()
                    if s.endswith(f"-{key}")]
        return [ROOT / self.folder / f"{key}.ipynb"]


ROOT_PAGE = "intro"
#: Pages outside the chapters: (TOC part caption, files), after the chapters' parts.
REFERENCE = (("Reference", ("api",)),)

CHAPTERS: tuple[Chapter, ...] = (
    Chapter("devices", "Foundations", gpu_run=True),
    Chapter("scratch", "Data Parallelism", profile="scratch", essentials=True, gpu_run=True,
            steps={"init_params": "model", "get_params": "get_params",
                   "allreduce": "allreduce", "train_step": "train_step",
                   "ring_allreduce": "ring_allreduce"},
            trains={"labs": "scratch"},
            rehearsal={"labs": dict(
                section="scratch",
                runs="[{key: r[key] for key in ('devices', 'batch_size', 'lr', 'test_acc')}"
                     " for r in (run_1, run_k, run_big)]",
                thresholds={"min_test_acc": "P.scratch.min_test_acc"})}),
    Chapter("concise", "Data Parallelism", lab_pages=("in-depth",), pages=("ddp-knobs",),
            profile="concise", essentials=True, gpu_run=True,
            trains={"labs": "concise", "in-depth": "concise"},
            not_rehearsed={"labs": (
                "ResNet-18 at width 64 on all 60,000 images for 3 epochs is ~490 TFLOP per "
                "run, about 80 minutes per run on 2 cores and five runs a notebook. Its "
                "threshold (0.8) has been met on GPUs: every training check of concise/pytorch "
                "and concise/jax passed under the gpu profile on one H200 (2026-11-27, "
                "../shared/gpu-runs), and on the CPU the same recipe at width 16 on 6,000 "
                "images reaches 0.73-0.77 in 2 epochs."),
                "in-depth": (
                "The fast path's accuracy is held to the defaults' within the seeds' spread "
                "(d2lmini.steptime.same_accuracy), a verdict relative to a run of the same "
                "settings: no absolute threshold of the gpu profile is asserted there.")}),
    Chapter("comm", "Cost and Memory", neutral=("model",), profile="comm", essentials=True,
            gpu_run=True),
    Chapter("sharded", "Cost and Memory", neutral=("model",), profile="sharded", essentials=True,
            gpu_run=True,
            trains={"labs": "sharded"},
            rehearsal={"labs": dict(
                section="sharded",
                runs="[{'run': name, 'test_acc': acc} for name, acc in accuracy.items()]",
                thresholds={"min_test_acc": "P.sharded.min_test_acc",
                            "max_acc_gap": "P.sharded.max_acc_gap"})}),
    Chapter("gpt", "Transformers", neutral=("model",), profile="gpt", gpu_run=True,
            trains={"labs": "gpt"},
            rehearsal={"labs": dict(
                section="gpt",
                runs="[{key: run[key] for key in ('steps', 'devices', 'train_loss', 'val_loss')}]",
                thresholds={"expected_val_loss": "P.gpt.expected_val_loss"})},
            not_rehearsed={"labs": (
                "The GPU settings' model (10.8 M parameters, 5,000 AdamW steps of 64 x 256 "
                "tokens: about 5 PFLOP) would train for about 15 hours on 2 cores. Their "
                "expected_val_loss is unset, so a GPU run is held to beating the uniform loss "
                "by a margin only (gpt.lab.learned). The CPU settings' expected_val_loss comes "
                "from a rehearsal (benchmarks/rehearsal/gpt-pytorch.json).")}),
    Chapter("comparison", "Comparison", labs=False, pages=("results", "batch-size", "cluster"),
            trains={"batch-size": "scaling"},
            not_rehearsed={"batch-size": (
                "36 LeNet runs of 10 epochs on 59,392 images: about 5 hours on 2 cores. Its "
                "verdicts are relative (a policy against the base batch, within the seeds' "
                "spread), and no absolute threshold of the gpu profile is asserted.")}),
)


def chapter(name: str) -> Chapter:
    for c in CHAPTERS:
        if c.name == name:
            return c
    raise ValueError(f"no chapter {name!r} in tools/manifest.py: "
                     f"{', '.join(c.name for c in CHAPTERS)}")


def chapter_of(path: Path | str) -> Chapter:
    """The chapter a file under ``chapters/<name>/`` belongs to."""
    parts = Path(path).resolve().relative_to(ROOT).parts
    if len(parts) < 3 or parts[0] != CHAPTERS_DIR:
        raise ValueError(f"{path} is not a chapter's file (chapters/<name>/...)")
    return chapter(parts[1])


def page_key(path: Path | str) -> tuple[Chapter, str]:
    """``(chapter, key)`` of a notebook: ``"labs"`` for a framework notebook, the
    ``lab_pages`` stem for a lab's in-depth page, else its stem."""
    c, stem = chapter_of(path), Path(path).stem
    if c.labs and stem in NOTEBOOKS:
        return c, "labs"
    if stem in c.lab_page_stems():
        return c, next(key for key in c.lab_pages if stem.endswith(f"-{key}"))
    return c, stem


def essentials() -> tuple[str, ...]:
    """The Essentials path's files, in reading order: the introduction, then the overviews
    of the chapters marked ``essentials``."""
    return (f"{ROOT_PAGE}.md", *(f"{c.folder}/index.md" for c in CHAPTERS if c.essentials))


def gpu_run_chapters() -> tuple[str, ...]:
    return tuple(c.name for c in CHAPTERS if c.gpu_run)


def lab_chapters() -> tuple[Chapter, ...]:
    return tuple(c for c in CHAPTERS if c.labs)


def toc() -> dict:
    """The table of contents (``_toc.yml``'s content) made from :data:`CHAPTERS`."""
    parts: dict[str, list] = {}
    for c in CHAPTERS:
        first, *rest = c.files()
        parts.setdefault(c.part, []).append(
            {"file": first, "sections": [{"file": f} for f in rest]} if rest else {"file": first})
    for caption, files in REFERENCE:
        parts.setdefault(caption, []).extend({"file": f} for f in files)
    return {"format": "jb-book", "root": ROOT_PAGE,
            "parts": [{"caption": cap, "chapters": chs} for cap, chs in parts.items()]}


def toc_yaml() -> str:
    """:func:`toc` as the YAML jupyter-book reads, with a header saying where it comes from."""
    lines = ["# Written by `python -m tools.manifest --write-toc` (make book) from tools/manifest.py:",
             "# edit the manifest, not this file.",
             f"format: {toc()['format']}", f"root: {ROOT_PAGE}", "parts:"]
    for part in toc()["parts"]:
        lines.append(f"  - caption: {part['caption']}")
        lines.append("    chapters:")
        for ch in part["chapters"]:
            lines.append(f"      - file: {ch['file']}")
            if ch.get("sections"):
                lines.append("        sections:")
                lines += [f"          - file: {s['file']}" for s in ch["sections"]]
    return "\n".join(lines) + "\n"


def toc_files() -> list[str]:
    """Every file of the TOC, the root first, in reading order."""
    out = [ROOT_PAGE]
    for part in toc()["parts"]:
        for ch in part["chapters"]:
            out.append(ch["file"])
            out += [s["file"] for s in ch.get("sections", [])]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-toc", action="store_true", help="write _toc.yml")
    args = ap.parse_args(argv)
    if args.write_toc:
        path = ROOT / "_toc.yml"
        text = toc_yaml()
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    print("frameworks:", ", ".join(f"{f.title} ({f.key}, {f.notebook}.ipynb)" for f in FRAMEWORKS))
    for c in CHAPTERS:
        flags = [n for n in ("essentials", "gpu_run") if getattr(c, n)]
        print(f"{c.part:18s} {c.name:11s} {' '.join(c.files()[1:]) or '-'}"
              f"{'  [' + ', '.join(flags) + ']' if flags else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
