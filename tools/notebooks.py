"""Reading and running the book's notebooks, once for every tool.

Two ways to run one, for two needs:

- :func:`execute_in_kernel`: in a fresh Jupyter kernel of this interpreter, from the
  notebook's folder, as a reader's JupyterLab would (``tools.execute_notebooks`` stores the
  outputs; ``tools.rehearse`` reads the trained runs out of the kernel after the last cell);
- :func:`run_cells`: the code cells in *this* process, in a namespace of the caller's, from
  the notebook's folder, outputs swallowed -- for a process that then uses what the cells
  defined (``tools.benchmark``'s workers time the functions; ``tools.gpu_run`` on a server
  without Jupyter checks that every cell runs).

Cells are chosen by their tags (:func:`code_cells`), never by the text of a heading.  nbval
itself (the tests, ``tools.gpu_run --mode nbval``) runs notebooks through pytest.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

#: nbval's comment markers, as the tags they stand for
MARKERS = {"NBVAL_SKIP": "nbval-skip", "NBVAL_RAISES_EXCEPTION": "raises-exception"}


def read(path: Path) -> dict:
    """The notebook at ``path`` as JSON."""
    return json.loads(Path(path).read_text())


def cell_tags(cell: dict) -> set[str]:
    """A cell's tags, with nbval's ``# NBVAL_...`` comment markers as the tags they stand for."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    src = "".join(cell.get("source", ""))
    tags |= {MARKERS[m] for m in (l.strip().lstrip("#").strip() for l in src.splitlines()
                                  if l.strip().startswith("#")) if m in MARKERS}
    return tags


def code_cells(nb: dict, stop: str | None = None, skip=()) -> list[tuple[int, int, str, set]]:
    """``(n, index, source, tags)`` of the code cells to run: ``n`` is nbval's "Cell n" (from
    0), ``index`` the cell's place among all cells.  Up to (not including) the first cell
    tagged ``stop``; without the cells carrying a tag of ``skip``."""
    out, n = [], -1
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        n += 1
        tags = cell_tags(cell)
        if stop is not None and stop in tags:
            break
        if tags & set(skip):
            continue
        out.append((n, i, "".join(cell["source"]), tags))
    return out


def run_cells(path: Path, namespace: dict, cells, sink: io.StringIO | None = None):
    """Execute ``cells`` (from :func:`code_cells`) of the notebook at ``path`` in this process,
    in ``namespace``, with the notebook's folder as the working directory (a process started
    there with ``python -m`` has it first on its path, as a kernel does); their output goes to
    ``sink``.  Yields ``(n, index, source, tags, error)`` after each cell (``error``: the
    exception it raised, or None), so that the caller decides what an error means."""
    path = Path(path)
    sink = io.StringIO() if sink is None else sink
    os.chdir(path.parent)
    for n, i, src, tags in cells:
        error = None
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                exec(compile(src, f"<{path.name} cell {n}>", "exec"), namespace)
        except BaseException as e:  # noqa: BLE001 -- SystemExit in a cell is an error too
            error = e
        yield n, i, src, tags, error


def execute_in_kernel(path: Path, timeout: int, *, after: str | None = None):
    """Run the notebook at ``path`` in a fresh kernel (``python3``, this interpreter), from its
    folder.  Without ``after``: every cell, raising at the first error (nbclient's
    ``CellExecutionError``); returns ``(nb, seconds)`` with the outputs in ``nb``.  With
    ``after``: the cells up to the first error, then the code ``after`` in the same kernel;
    returns ``(nb, seconds, error, after_cell)`` (``error``: "cell i: ..." or None)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    if after is None:
        client.execute()
        return nb, time.perf_counter() - t0
    error = None
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, i)
            except CellExecutionError as e:
                error = f"cell {i}: " + str(e).strip().splitlines()[-1][:500]
                break
        seconds = time.perf_counter() - t0
        probe = nbformat.v4.new_code_cell(after)
        nb.cells.append(probe)
        try:
            client.execute_cell(probe, len(nb.cells) - 1)
        except CellExecutionError as e:
            error = error or f"after the cells: {str(e).strip().splitlines()[-1][:300]}"
    return nb, seconds, error, probe
