"""Draw the figures the chapter overviews (Markdown pages, which run no code) open with, from
d2lmini and the stored records, as deterministic SVG files next to the page, and write the
results they state (``results-table.md``, included by the page) from the stored runs.

    .venv/bin/python -m tools.overview_figures            # rewrites every figure
    .venv/bin/python -m tools.overview_figures --check    # exit 1 if one is out of date

tests/test_overview_figures.py draws them again and compares: a figure on a page is what the
code and the records give today.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def comm_scaling():
    """comm/index.md: predicted speed-up against k on NVLink 4, strong and weak scaling, from
    the three one-GPU steps measured on one H200 (the cost model page's predictions)."""
    from d2lmini import commcost as cc
    from d2lmini.config import get_profile
    steps = {label: s for label, s in cc.resnet18_step_times(256).items() if s.fit is not None}
    n_bytes = sum(l["grad_bytes"] for l in cc.resnet18_layer_costs())
    return cc.plot_scaling(steps, n_bytes, cc.card("H100 SXM").link,
                           global_batch=get_profile("gpu").concise.batch_size,
                           title="ResNet-18 on H100s over NVLink 4: predicted from steps "
                                 "measured on one H200")


def gpt_memory():
    """gpt/index.md: one GPU's step of GPT-2 small at the benchmark's batch, part by part
    (training state, activations, logits), lever after lever (the neutral page's
    ``figures.memory_levers``), against an H100's memory."""
    from d2lmini.commcost import card
    from d2lmini.config import get_profile
    from d2lmini.gpt import GPT2_SMALL, figures
    import matplotlib.pyplot as plt
    batch = get_profile("gpu").gpt.bench_batch
    fig, ax = plt.subplots(figsize=(8, 3.4))
    figures.plot_step_memory(figures.memory_levers(GPT2_SMALL, batch), ax=ax,
                          capacity=card("H100 SXM").memory_bytes, capacity_label="an H100's 80 GB")
    ax.set_title(f"GPT-2 small, {batch} x {GPT2_SMALL.context:,} tokens per GPU: one step's "
                 "memory (formulas)", fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {ROOT / "chapters" / "comm" / "scaling.svg": comm_scaling,
           ROOT / "chapters" / "gpt" / "memory.svg": gpt_memory}


def chapter_results(chapter: str):
    """``<chapter>/index.md``'s results: the stored runs and proofs (``d2lmini.tables``)."""
    def write() -> bytes:
        from d2lmini import tables
        return tables.overview_results(ROOT, chapter).encode()
    return write


#: The results fragments the overviews include (``{include} results-table.md``).
RESULTS = {ROOT / "chapters" / ch / "results-table.md": chapter_results(ch)
           for ch in ("scratch", "concise")}


def svg(draw) -> bytes:
    """The figure ``draw()`` returns, as SVG bytes that depend on nothing but the drawing:
    text as paths, fixed ids, no date."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with matplotlib.rc_context({"svg.hashsalt": "d2lmini", "svg.fonttype": "path"}):
        fig = draw()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return buf.getvalue()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path, draw in [*FIGURES.items(), *RESULTS.items()]:
        data = svg(draw) if path.suffix == ".svg" else draw()
        if "--check" in argv:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(path)
        else:
            path.write_bytes(data)
            print(f"wrote {path.relative_to(ROOT)} ({len(data):,} bytes)")
    for path in stale:
        print(f"out of date: {path.relative_to(ROOT)} (run tools/overview_figures.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
