"""Where the book's records are: one function, for every install.

The library reads records the book's commands wrote (``benchmarks/``: the GPU runs and the
step benchmark) that live in the book's checkout, not in the package.  :func:`book_root`
finds that checkout the same way whether d2lmini is installed editable (the package sits in
it), copied into site-packages (``pip install .``), or imported from a notebook's kernel:

1. ``D2LMINI_BOOK``, when set (a checkout elsewhere);
2. the folder the package sits in, when it is a checkout of the book;
3. the nearest folder at or above the working directory that is one (a notebook runs in
   ``chapters/<chapter>/``).

A checkout of the book is a folder holding ``_toc.yml`` and ``benchmarks/``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["book_root", "records", "BookNotFound"]


class BookNotFound(FileNotFoundError):
    """No checkout of the book was found; the message says how to point at one."""


def _is_book(folder: Path) -> bool:
    return (folder / "_toc.yml").is_file() and (folder / "benchmarks").is_dir()


def book_root(start: Path | str | None = None) -> Path:
    """The book's checkout (see the module's docstring); ``start`` replaces the working
    directory of rule 3.  Raises :class:`BookNotFound` with what to do."""
    env = os.environ.get("D2LMINI_BOOK")
    if env:
        root = Path(env).expanduser().resolve()
        if not _is_book(root):
            raise BookNotFound(f"D2LMINI_BOOK={env} is not a checkout of the book (no _toc.yml "
                               "and benchmarks/ there): point it at the repository's root")
        return root
    here = Path(__file__).resolve().parents[1]
    if _is_book(here):
        return here
    cwd = Path(start or os.getcwd()).resolve()
    for folder in (cwd, *cwd.parents):
        if _is_book(folder):
            return folder
    raise BookNotFound(f"the book's records were not found: d2lmini is installed at {here} and "
                       f"no folder at or above {cwd} is a checkout of the book. Run from the "
                       "book's checkout, or set D2LMINI_BOOK to its root")


def records(*parts: str) -> Path:
    """A path under the book's ``benchmarks/`` (the folder itself without ``parts``); where no
    checkout is found, a path under a folder that does not exist, so that reading a record
    says which file is missing (the loaders add how to fix it)."""
    try:
        return book_root().joinpath("benchmarks", *parts)
    except BookNotFound:
        return Path(os.getcwd()).resolve().joinpath("<no checkout of the book found: set "
                                                    "D2LMINI_BOOK>", "benchmarks", *parts)
