"""The book's four frameworks, once: their names in each spelling, in the book's order.

Every list of frameworks in the library, the tools and the tests is this one (or a selection
from it by :func:`get`).  The spellings differ by job:

- ``key``: the backend module (``d2lmini.torch``) and the name in records and command lines;
- ``notebook``: the stem of a chapter's notebook and recipe files (``pytorch.ipynb``,
  ``pytorch_dp.py``);
- ``title``: what a reader sees (``PyTorch``);
- ``module``: what ``import`` takes (``paddle``), and ``aliases``: the other names a reader
  or a package index uses for it (``pytorch``, ``paddlepaddle``, ``jaxlib``);
- ``needs``: every module the book's notebooks of it import (JAX's: flax and optax too);
- ``distribution``: the pattern of its package's name on PyPI, CPU or GPU build
  (``paddlepaddle(-gpu)?``), and ``gpu_distribution``: how its GPU build's name begins
  (``mxnet-cu``).

The order is the book's: PyTorch first (the reader's most likely framework), then JAX, Paddle,
and MXNet (retired to the Apache Attic in 2023) last.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Framework", "FRAMEWORKS", "KEYS", "NOTEBOOKS", "TITLES", "ALIASES", "get"]


@dataclass(frozen=True)
class Framework:
    key: str
    notebook: str
    title: str
    module: str
    aliases: tuple[str, ...] = ()
    extra_modules: tuple[str, ...] = ()
    distribution: str = ""
    gpu_distribution: str = ""

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.module, *self.extra_modules)


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("torch", "pytorch", "PyTorch", "torch", ("pytorch",),
              distribution=r"torch", gpu_distribution="torch "),
    Framework("jax", "jax", "JAX", "jax", ("jaxlib", "flax"), ("flax", "optax"),
              distribution=r"jax", gpu_distribution="jax"),
    Framework("paddle", "paddle", "Paddle", "paddle", ("paddlepaddle", "paddlepaddle-gpu"),
              distribution=r"paddlepaddle(-gpu)?", gpu_distribution="paddlepaddle-gpu"),
    Framework("mxnet", "mxnet", "MXNet", "mxnet",
              distribution=r"mxnet(-cu\d+)?", gpu_distribution="mxnet-cu"),
)
KEYS: tuple[str, ...] = tuple(f.key for f in FRAMEWORKS)            # torch, jax, paddle, mxnet
NOTEBOOKS: tuple[str, ...] = tuple(f.notebook for f in FRAMEWORKS)  # pytorch, jax, paddle, mxnet
TITLES: dict[str, str] = {f.key: f.title for f in FRAMEWORKS}
ALIASES: dict[str, str] = {a: f.key for f in FRAMEWORKS for a in (f.notebook, *f.aliases)
                           if a != f.key}                     # pytorch -> torch, ...


def get(name: str) -> Framework:
    """The framework called ``name`` in any of its spellings (``torch``, ``pytorch``,
    ``PyTorch``, ``paddlepaddle``, ...); a ``ValueError`` naming the four otherwise."""
    low = name.strip().lower()
    for f in FRAMEWORKS:
        if low in (f.key, f.notebook, f.title.lower(), f.module, *f.aliases):
            return f
    raise ValueError(f"unknown framework {name!r}: give one of {', '.join(KEYS)} "
                     f"(or {', '.join(NOTEBOOKS)})")
