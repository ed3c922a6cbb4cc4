"""Animator: a learning curve that updates live in Jupyter and never fails headless.

In a Jupyter kernel (a notebook, nbval, a book build that executes) the figure is shown once
with a display handle and that same output is updated at every :meth:`Animator.add`, so the
cell ends with exactly one figure, the final one, as a PNG (nbval does not compare PNGs; it
would compare SVG).  Outside a kernel (a script) nothing is displayed; the figure is kept
in ``animator.fig`` and :meth:`Animator.savefig` writes it.
"""
from __future__ import annotations

import matplotlib

__all__ = ["Animator", "in_notebook"]


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class Animator:
    """Plots ``len(legend)`` lines against x, adding one point per line at each ``add``."""

    def __init__(self, xlabel=None, ylabel=None, legend=None, xlim=None, ylim=None,
                 xscale="linear", yscale="linear", fmts=("-", "m--", "g-.", "r:", "b-", "c--"),
                 figsize=(4.5, 3.0), title=None):
        if not in_notebook():
            matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure  # no pyplot: no global state, no stray display
        self.fig = Figure(figsize=figsize, dpi=100)
        self.axes = self.fig.add_subplot(1, 1, 1)
        self.legend = list(legend or [])
        self.config = dict(xlabel=xlabel, ylabel=ylabel, xlim=xlim, ylim=ylim,
                           xscale=xscale, yscale=yscale, title=title)
        self.fmts = fmts
        self.X: list[list[float]] = []
        self.Y: list[list[float]] = []
        self._handle = None
        self._live = in_notebook()

    def _configure(self) -> None:
        ax, c = self.axes, self.config
        ax.set_xlabel(c["xlabel"] or "")
        ax.set_ylabel(c["ylabel"] or "")
        ax.set_xscale(c["xscale"])
        ax.set_yscale(c["yscale"])
        if c["xlim"]:
            ax.set_xlim(c["xlim"])
        if c["ylim"]:
            ax.set_ylim(c["ylim"])
        if c["title"]:
            ax.set_title(c["title"])
        if self.legend:
            ax.legend(self.legend)
        ax.grid(True)

    def add(self, x, y) -> None:
        """Add one point per line; ``y`` is a number or a sequence (None skips a line)."""
        ys = list(y) if hasattr(y, "__len__") else [y]
        xs = list(x) if hasattr(x, "__len__") else [x] * len(ys)
        if not self.X:
            self.X = [[] for _ in ys]
            self.Y = [[] for _ in ys]
        if len(ys) != len(self.Y):
            raise ValueError(f"Animator plots {len(self.Y)} lines, got {len(ys)} values")
        for i, (a, b) in enumerate(zip(xs, ys)):
            if a is not None and b is not None:
                self.X[i].append(float(a))
                self.Y[i].append(float(b))
        self.draw()

    def draw(self) -> None:
        self.axes.cla()
        for x, y, fmt in zip(self.X, self.Y, self.fmts):
            self.axes.plot(x, y, fmt)
        self._configure()
        self.fig.tight_layout()
        if self._live:
            from IPython.display import Image, display
            png = Image(data=self._png(), format="png")
            if self._handle is None:
                self._handle = display(png, display_id=True)
            else:
                self._handle.update(png)

    def _png(self) -> bytes:
        import io
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def savefig(self, path) -> None:
        self.fig.savefig(path)
