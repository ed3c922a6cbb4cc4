"""pytest set-up for the whole repository: every notebook at several device counts in one run,
and the run spread over worker processes (``make test``; see README, "Tests").

``--device-counts 8,1`` collects each notebook once per count. ``default`` is the notebook as
the environment gives it (``D2LMINI_NUM_DEVICES`` unset: 2 simulated devices on a CPU
machine); a number ``k`` starts that notebook's kernel with ``D2LMINI_NUM_DEVICES=k`` and
names its items ``chapters/<ch>/<fw>.ipynb[k=8]::Cell 3``. Nothing else changes: the same
cells, the same nbval comparisons, the same sanitizers as separate pytest runs, except that
a cell tagged ``same-at-every-k`` runs in the first run listed only (:data:`SAME_AT_EVERY_K`).

A count followed by ``@avx2`` (``default@avx2``, ``8@avx2``) runs that notebook with the CPU's
instructions capped at AVX2 (``d2lmini.hardware.AVX2_CAPS``: oneDNN's and PyTorch's own
kernels, and what the notebooks read of the CPU), its items named ``<fw>.ipynb[avx2]`` or
``<fw>.ipynb[k=8,avx2]``: on a CPU with AVX-512 the run takes the path an AVX2-only CPU takes,
and its stored outputs must pass there too (``make test``: ``8@avx2,1``).

Under pytest-xdist (``-n N --dist loadfile``) a notebook at one device count is one unit of
work (its cells share one kernel, in order), and so is a test file (its module fixtures are
built once); the tests that use the built book form one unit, so it is built once. A JAX
notebook's units at its device counts go to one worker, one after the other, so that each
finds the programs the others compiled in JAX's persistent cache (:func:`schedule_group`).
Groups are handed out longest first, by the seconds recorded in ``tests/durations.json``
(``tools/test_durations.py`` rewrites it from a run's JUnit XML); a unit not recorded there
counts as :data:`UNKNOWN_SECONDS`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
DURATIONS = ROOT / "tests" / "durations.json"
UNKNOWN_SECONDS = 30.0
BOOK_GROUP = "the built book"


def recorded_seconds() -> dict:
    """``{unit: seconds}`` of :data:`DURATIONS`, which also names the run's machine
    (``{"machine": {"cpu": ..., "isa": ...}, "seconds": {...}}``: the same suite takes about
    twice as long on an AVX2-only CPU as on one with AVX-512)."""
    return json.loads(DURATIONS.read_text())["seconds"]


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-seconds", default="", metavar="PATH",
        help="write the CPU seconds (user + system) each unit of work took, its processes and "
             "every process they waited for included, to PATH as JSON (make test: "
             "_build/cpu-seconds.json; tools/test_durations.py reads it)")
    parser.addoption(
        "--device-counts", default="",
        help="comma-separated device counts to run every notebook with, e.g. "
             "'default,1,8' ('default': D2LMINI_NUM_DEVICES as the environment sets it)")


def pytest_configure(config):
    # CPU accounting (--cpu-seconds) where tests run: not in xdist's controller
    _cpu["runs_tests"] = bool(config.getoption("cpu_seconds", default="")) and (
        hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None))
    # JAX compiles every program it runs, and on 2 cores XLA's compilation is most of the JAX
    # notebooks' time (concise/jax, k = 2: 127 s cold, 36 s with every program cached). The
    # kernels, launched scripts and test processes of one run compile many of the same
    # programs, so they share JAX's persistent cache (keyed by the program and the JAX/XLA
    # versions: a hit is the program that would have been compiled).  d2lmini.jax keys a CPU
    # program without its device assignment and the host's device count
    # (share_compiled_programs_across_cpu_devices): a per-device program compiles once for
    # the 8 stand-ins, and a notebook's one-device programs once for k = 1, 2 and 8.
    # JAX_COMPILATION_CACHE_DIR set (even empty: no cache) is left as it is.
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(config.rootpath / "_build" / "jax-cache")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    # Each xdist worker's kernels keep their IPython history in a folder of their own: the
    # default, one SQLite file for every kernel of the machine, is shared by concurrent kernels.
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:
        # One OpenMP thread per process under xdist: the workers already keep the cores busy,
        # and a PyTorch or Paddle kernel whose second OpenMP thread waits for a core held by
        # the other worker spins at every parallel region (the sharded PyTorch notebook at
        # k = 8 took 182 s next to another worker with 2 threads, 74 s with 1). Processes that
        # set their own thread count (the launched ranks, torch.set_num_threads) still do.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")
    if worker and "IPYTHONDIR" not in os.environ:
        import tempfile
        os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix=f"ipython-{worker}-")


def device_counts(config) -> list[tuple[str | None, bool]]:
    """The runs of ``--device-counts``: (count, None for 'default'; capped at AVX2);
    [(None, False)] without the option."""
    raw = config.getoption("device_counts", default="") or ""
    out: list[tuple[str | None, bool]] = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        count, _, isa = part.partition("@")
        if isa not in ("", "avx2"):
            raise pytest.UsageError(f"--device-counts: {part!r}: the only cap is '@avx2' "
                                    "(example: --device-counts default@avx2,1,8)")
        if count == "default":
            out.append((None, bool(isa)))
        elif count.isdigit() and 1 <= int(count) <= 8:
            out.append((count, bool(isa)))
        else:
            raise pytest.UsageError(
                f"--device-counts: {part!r} is neither 'default' nor a device count from 1 "
                "to 8 (example: --device-counts default,1,8)")
    if len({k for k, _ in out}) != len(out):
        raise pytest.UsageError(f"--device-counts {raw!r} names a count twice")
    return out or [(None, False)]


def run_name(filename: str, count: str | None, avx2: bool) -> str:
    """The collected name of a notebook at one run: ``nb.ipynb``, ``nb.ipynb[k=8]``,
    ``nb.ipynb[avx2]``, ``nb.ipynb[k=8,avx2]``."""
    marks = ([f"k={count}"] if count else []) + (["avx2"] if avx2 else [])
    return f"{filename}[{','.join(marks)}]" if marks else filename


def avx2_caps() -> dict:
    from d2lmini.hardware import AVX2_CAPS
    return AVX2_CAPS


try:
    from nbval.plugin import IPyNbFile
except ImportError:                  # nbval missing: notebooks are not collected at all
    IPyNbFile = None

if IPyNbFile is not None:
    class NotebookAtDeviceCount(IPyNbFile):
        """nbval's notebook collector whose kernel starts with ``env`` added to the
        environment (``D2LMINI_NUM_DEVICES=k``, the AVX2 caps)."""
        env: dict = {}
        #: index of the last code cell to run; the later ones are skipped (see
        #: :func:`setup_only_until`)
        until: int | None = None

        #: whether this is the first run of ``--device-counts``, the one that computes the
        #: cells tagged :data:`SAME_AT_EVERY_K`
        primary: bool = True

        def collect(self):
            items = list(super().collect())
            if self.until is not None:
                for item in items[self.until + 1:]:
                    item.add_marker(pytest.mark.skip(reason=STAND_IN_REASON))
            if not self.primary:
                code = [c for c in json.loads(self.path.read_text())["cells"]
                        if c["cell_type"] == "code"]
                for item, cell in zip(items, code):
                    if SAME_AT_EVERY_K in cell.get("metadata", {}).get("tags", []):
                        item.add_marker(pytest.mark.skip(reason=SAME_AT_EVERY_K_REASON))
            return items

        def setup(self):
            saved = {name: os.environ.get(name) for name in self.env}
            os.environ.update(self.env)
            try:
                super().setup()              # starts the kernel, which copies os.environ
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    collected = yield
    runs = device_counts(parent.config)
    if runs == [(None, False)] or file_path.suffix != ".ipynb" or IPyNbFile is None:
        return collected
    out = []
    for node in collected:
        if type(node) is not IPyNbFile:
            out.append(node)
            continue
        for i, (k, avx2) in enumerate(runs):
            if k is None and not avx2 and i == 0:
                out.append(node)
            else:
                name = run_name(file_path.name, k, avx2)
                nb = NotebookAtDeviceCount.from_parent(
                    parent, path=file_path, name=name, nodeid=_nodeid(parent, name))
                nb.env = {**({"D2LMINI_NUM_DEVICES": k} if k else {}),
                          **(avx2_caps() if avx2 else {})}
                nb.until = setup_only_until(file_path, k)
                nb.primary = i == 0
                out.append(nb)
    return out


#: The cell tag of a cell whose computation does not depend on the device count (it uses one
#: device whatever k is: the concise chapter's fast path): only the first run of
#: ``--device-counts`` computes it (``make test``: k = 8, capped at AVX2); the others skip it,
#: since it would be the same program against the same stored output.  A later cell must not
#: need what it defines (tests/test_harness.py checks the tagged cells).
SAME_AT_EVERY_K = "same-at-every-k"
SAME_AT_EVERY_K_REASON = ("one device whatever k is: the first run of --device-counts computes "
                          "this cell, the same program against the same stored output")

STAND_IN_REASON = ("k = 1 in a lesson that compares k >= 2 devices with one: it runs on 2 "
                   "stand-ins; the lesson itself is checked by the runs at more devices")


def setup_only_until(path: Path, count: str | None) -> int | None:
    """For a notebook that asks for at least 2 devices (``try_all_gpus(at_least=2)``: the
    concise chapter) at k = 1, the index of the code cell that asks: the run checks that the
    lesson starts on 2 stand-ins with its note, and skips the rest, the lesson at k = 2,
    which ``make test``'s run at k = 8 checks with more devices (about a tenth of make test's
    work).  None otherwise: every cell runs."""
    if count != "1":
        return None
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(cells):
        if "at_least=2" in "".join(cell["source"]):
            return i
    return None


def _nodeid(parent, name: str):
    rel = (parent.path / name).relative_to(parent.config.rootpath)
    text = rel.as_posix()
    try:                                   # pytest >= 9: structured node ids
        from _pytest.nodes import NodeId
    except ImportError:
        return text
    return NodeId(path=text)


BOOK_FILES = ("tests/test_book.py", "tests/test_browser.py")   # the built_book fixture's users


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its notebook at its device count, its test file,
    or the built book."""
    unit = nodeid.split("::", 1)[0]
    return BOOK_GROUP if unit in BOOK_FILES else unit


# Notebooks whose units at the different device counts compile many of the same programs into
# JAX's persistent cache: the one-device programs at every count, and all of them where a
# lesson needs at least 2 devices (concise: k = 1 runs the k = 2 programs).  A program is in the
# cache only once the unit that compiled it has stored it, so two such units side by side both
# compile it (concise/jax in the fresh-clone run of 25c2c03: k = 1 took 161 s next to k = 8,
# k = 2 75 s after them; alone from an empty cache, k = 2 then k = 1: 94 s and 49 s).
SHARE_COMPILED = ("jax.ipynb",)


def schedule_group(unit: str) -> str:
    """The units that one worker runs one after the other: a JAX notebook at all its device
    counts (see :data:`SHARE_COMPILED`); any other unit on its own."""
    path = unit.split("[", 1)[0]
    return path if Path(path).name in SHARE_COMPILED else unit


@pytest.hookimpl(optionalhook=True)     # pytest without pytest-xdist (a GPU server) must still run
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the groups of :func:`schedule_group` (units of
    :func:`work_unit`), handed out in collection order (which
    :func:`pytest_collection_modifyitems` sorts longest first)."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class WorkUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule_group(work_unit(nodeid))

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):      # only the xdist workers' collection
        return
    try:
        seconds = recorded_seconds()
    except (OSError, ValueError):
        seconds = {}
    first, group_first, group_seconds = {}, {}, {}
    for i, item in enumerate(items):
        unit = work_unit(item.nodeid)
        if unit in first:
            continue
        group = schedule_group(unit)
        first[unit] = i
        group_first.setdefault(group, i)
        group_seconds[group] = (group_seconds.get(group, 0.0)
                                + float(seconds.get(unit, UNKNOWN_SECONDS)))

    def order(item):
        unit = work_unit(item.nodeid)
        group = schedule_group(unit)
        return -group_seconds[group], group_first[group], first[unit]
    # Longest group first, a group's units together in collection order (stable: a unit's
    # items keep their order, nbval cells run in order).
    items.sort(key=order)


# --- CPU seconds per unit of work (--cpu-seconds) --------------------------------------------
# A unit's CPU time is this process's own plus that of every child it waited for (a notebook's
# kernel when nbval shuts it down, and with it the launched ranks the kernel waited for),
# counted from the unit's first test to the next unit's first test.  Wall time alone cannot
# tell a unit that computes from one that waits, nor how much two busy workers slow each other.
_cpu = {"unit": None, "start": 0.0, "seconds": {}, "runs_tests": True}


def _cpu_now() -> float:
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _cpu_close() -> None:
    if _cpu["unit"] is not None:
        seconds = _cpu["seconds"]
        seconds[_cpu["unit"]] = seconds.get(_cpu["unit"], 0.0) + _cpu_now() - _cpu["start"]


def pytest_runtest_logstart(nodeid, location):
    if not _cpu["runs_tests"]:                 # no --cpu-seconds, or xdist's controller
        return
    unit = work_unit(nodeid)
    if unit != _cpu["unit"]:
        _cpu_close()
        _cpu.update(unit=unit, start=_cpu_now())


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("cpu_seconds", default="")
    if not path:
        return
    _cpu_close()
    _cpu["unit"] = None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if worker:                             # each worker its own file; the controller merges
        path.with_name(f"{path.name}.{worker}").write_text(json.dumps(_cpu["seconds"]))
        return
    merged = dict(_cpu["seconds"])
    for part in sorted(path.parent.glob(path.name + ".gw*")):
        for unit, sec in json.loads(part.read_text()).items():
            merged[unit] = merged.get(unit, 0.0) + sec
        part.unlink()
    path.write_text(json.dumps({u: round(s, 1) for u, s in
                                sorted(merged.items(), key=lambda kv: -kv[1])}, indent=1) + "\n")
