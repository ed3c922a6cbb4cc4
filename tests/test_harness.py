"""The test harness of ``make test`` (conftest.py at the repository's root): every notebook at
several device counts in one run, a notebook's cells kept on one kernel in order when the run
is spread over processes, and the durations file that orders the work."""
import importlib.util
import json
import shutil
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from helpers import ROOT

pytestmark = pytest.mark.harness   # pytest sessions and kernels of its own



def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = load("repo_conftest", ROOT / "conftest.py")  # the root one, not tests/conftest.py


def notebook(path: Path, stored: str):
    """Two cells: the second needs the first's variable and prints the kernel's device count."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\nx = 41", execution_count=1),
                nbformat.v4.new_code_cell(
                    "print(os.environ.get('D2LMINI_NUM_DEVICES', 'unset'), x + 1)",
                    execution_count=2,
                    outputs=[nbformat.v4.new_output("stream", name="stdout", text=stored)])]
    nbformat.write(nb, path)


def run(tmp_path, *args, devices=None):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    env = dict(os.environ)
    env.pop("D2LMINI_NUM_DEVICES", None)
    if devices is not None:
        env["D2LMINI_NUM_DEVICES"] = devices
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
                        "--rootdir", str(tmp_path), "--nbval", "--nbval-current-env",
                        "-v", *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def test_a_device_count_reaches_the_notebooks_kernel(tmp_path):
    notebook(tmp_path / "nb.ipynb", "8 42\n")
    rc, out = run(tmp_path, "--device-counts", "8", "nb.ipynb")
    assert rc == 0 and "nb.ipynb[k=8]::Cell 1 PASSED" in out, out
    rc, out = run(tmp_path, "--device-counts", "1", "nb.ipynb")        # kernel sees 1, not 8
    assert rc != 0 and "nb.ipynb[k=1]::Cell 1 FAILED" in out, out


def test_at_one_device_a_lesson_needing_two_runs_its_setup_and_skips_the_repeat(tmp_path):
    """A notebook that asks for at least 2 devices runs at k = 1 on 2 stand-ins, the k = 2
    run's computation: at k = 1 only its cells up to the one that asks run."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("devices = 'try_all_gpus(at_least=2)'"),
                nbformat.v4.new_code_cell("raise SystemExit('the repeat ran')")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    rc, out = run(tmp_path, "--device-counts", "1", "nb.ipynb", "-rs")
    assert rc == 0 and "nb.ipynb[k=1]::Cell 0 PASSED" in out and "Cell 1 SKIPPED" in out, out
    assert harness.STAND_IN_REASON in out.replace("\n", " ")
    rc, out = run(tmp_path, "--device-counts", "2", "nb.ipynb")       # any other count: all
    assert rc != 0 and "nb.ipynb[k=2]::Cell 1 FAILED" in out, out
    concise = sorted((ROOT / "chapters" / "concise").glob("*.ipynb"))
    assert len(concise) >= 4 and all(harness.setup_only_until(p, "1") == 0 for p in concise)
    assert harness.setup_only_until(ROOT / "chapters/scratch/pytorch.ipynb", "1") is None
    assert harness.setup_only_until(concise[0], "8") is None


def test_a_cell_the_same_at_every_k_runs_in_the_first_run_only(tmp_path):
    """A cell tagged ``same-at-every-k`` (one device whatever k is) runs in the first run of
    ``--device-counts`` (make test: k = 8, capped at AVX2); the later runs skip it with the
    reason.  In the book, no later cell of such a notebook reads a name only such a cell binds
    (a later run would fail on it)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("raise SystemExit('the one-device cell ran')",
                                          metadata={"tags": [harness.SAME_AT_EVERY_K]}),
                nbformat.v4.new_code_cell("x")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    rc, out = run(tmp_path, "--device-counts", "8,1", "nb.ipynb", "-rs")
    assert rc != 0 and "nb.ipynb[k=8]::Cell 1 FAILED" in out, out
    assert "nb.ipynb[k=1]::Cell 1 SKIPPED" in out and "nb.ipynb[k=1]::Cell 2 PASSED" in out, out
    assert harness.SAME_AT_EVERY_K_REASON in " ".join(out.split())
    for first in ("default", "8"):      # alone, or first: it runs
        rc, out = run(tmp_path, "--device-counts", first, "nb.ipynb")
        assert rc != 0 and "Cell 1 FAILED" in out, out
    import json
    from test_book import _bound_and_loaded
    tagged_notebooks = 0
    for path in sorted((ROOT / "chapters").glob("*/*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        only_skipped, seen = {}, set()
        for i, c in enumerate(cells):
            try:
                bound, loaded = _bound_and_loaded("".join(c["source"]))
            except SyntaxError:          # IPython magics: not Python, not checked
                continue
            if harness.SAME_AT_EVERY_K in c.get("metadata", {}).get("tags", []):
                only_skipped.update({n: i for n in bound - seen})
                continue
            needs = sorted(n for n in loaded - bound if n in only_skipped and n not in seen)
            assert not needs, f"{path.relative_to(ROOT)} code cell {i} reads {needs}, bound " \
                              f"only in same-at-every-k cell(s) {[only_skipped[n] for n in needs]}"
            seen |= bound
        tagged_notebooks += bool(only_skipped)
    assert tagged_notebooks >= 4, "the concise chapter's fast path is tagged same-at-every-k"


def test_a_run_capped_at_avx2_reaches_the_kernel_and_its_launched_processes(tmp_path):
    """``@avx2`` starts the kernel with the caps, which the processes it starts inherit, and
    which d2lmini.hardware then reads as an AVX2 CPU; the other runs see no cap."""
    from d2lmini.hardware import AVX2_CAPS
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'from "
        "d2lmini.hardware import cpu_isa; print(cpu_isa()[0] == \"AVX2\")'], "
        "capture_output=True, text=True).stdout.strip())", execution_count=1,
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="True\n")])]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    env_cap = {name: os.environ.get(name) for name in AVX2_CAPS}
    rc, out = run(tmp_path, "--device-counts", "default@avx2,8@avx2", "nb.ipynb")
    assert rc == 0 and "nb.ipynb[avx2]::Cell 0 PASSED" in out \
        and "nb.ipynb[k=8,avx2]::Cell 0 PASSED" in out, out
    assert {name: os.environ.get(name) for name in AVX2_CAPS} == env_cap
    if not any(env_cap.values()):        # an AVX2 host prints True uncapped too
        from d2lmini.hardware import cpu_isa
        rc, out = run(tmp_path, "--device-counts", "default,8@avx2", "nb.ipynb")
        assert "nb.ipynb[k=8,avx2]::Cell 0 PASSED" in out, out
        assert ("2 passed" if cpu_isa()[0] == "AVX2" else "1 failed, 1 passed") in out, out


def test_default_keeps_the_environment_and_the_run_restores_it(tmp_path):
    notebook(tmp_path / "nb.ipynb", "unset 42\n")
    rc, out = run(tmp_path, "--device-counts", "default", "nb.ipynb")
    assert rc == 0 and "2 passed" in out, out
    # the k = 8 notebook runs first; the default one after it still sees no count
    rc, out = run(tmp_path, "--device-counts", "8,default", "nb.ipynb")
    assert "nb.ipynb[k=8]::Cell 1 FAILED" in out and "1 failed, 3 passed" in out, out


def test_spread_over_workers_a_notebooks_cells_share_one_kernel(tmp_path):
    for name in ("a", "b", "c"):
        notebook(tmp_path / f"{name}.ipynb", "8 42\n")
    rc, out = run(tmp_path, "-n", "2", "--dist", "loadfile", "--device-counts", "default,8",
                  "a.ipynb", "b.ipynb", "c.ipynb", devices="8")
    assert rc == 0 and "12 passed" in out, out        # a NameError if cell 1 ran elsewhere
    assert "b.ipynb[k=8]::Cell 1" in out, out


def test_the_harness_runs_without_pytest_xdist(tmp_path):
    """A GPU server has pytest and nbval but no pytest-xdist: the xdist hook must be optional."""
    notebook(tmp_path / "nb.ipynb", "8 42\n")
    rc, out = run(tmp_path, "-p", "no:xdist", "--device-counts", "8", "nb.ipynb")
    assert rc == 0 and "nb.ipynb[k=8]::Cell 1 PASSED" in out, out


@pytest.mark.parametrize("bad", ["9", "0", "two", "1,1", "8@avx1", "8,8@avx2"])
def test_a_bad_device_count_is_a_usage_error(tmp_path, bad):
    """Each bad value is refused by the option's parser (in this process); one of them also
    through a whole pytest run, which stops with a usage error (exit code 4)."""
    class Config:
        def getoption(self, name, default=None):
            return bad
    with pytest.raises(pytest.UsageError, match="--device-counts"):
        harness.device_counts(Config())
    if bad == "9":
        notebook(tmp_path / "nb.ipynb", "8 42\n")
        rc, out = run(tmp_path, "--device-counts", bad, "--collect-only", "nb.ipynb")
        assert rc == 4 and "--device-counts" in out, out


def test_units_are_notebooks_at_a_count_test_files_and_the_book():
    assert harness.work_unit("chapters/comm/jax.ipynb[k=8]::Cell 3") == \
        "chapters/comm/jax.ipynb[k=8]"
    assert harness.work_unit("chapters/comm/jax.ipynb::Cell 3") == "chapters/comm/jax.ipynb"
    assert harness.work_unit("tests/test_core.py::test_x[a-b]") == "tests/test_core.py"
    assert harness.work_unit("tests/test_browser.py::test_y") == harness.BOOK_GROUP
    assert harness.work_unit("tests/test_book.py::test_z") == harness.BOOK_GROUP


def test_a_jax_notebooks_counts_run_one_after_the_other_on_one_worker():
    """Its units share compiled programs through JAX's cache: one group, handed out whole,
    its units in collection order; the other units on their own, longest group first."""
    assert harness.schedule_group("chapters/concise/jax.ipynb[k=8]") == \
        harness.schedule_group("chapters/concise/jax.ipynb") == "chapters/concise/jax.ipynb"
    assert harness.schedule_group("chapters/concise/pytorch.ipynb[k=8]") == \
        "chapters/concise/pytorch.ipynb[k=8]"
    assert harness.schedule_group("tests/test_jax_concise.py") == "tests/test_jax_concise.py"

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    class Config:
        workerinput = {"workerid": "gw0"}

    ids = ["ch/a.ipynb::Cell 0", "ch/a.ipynb[k=1]::Cell 0", "ch/jax.ipynb::Cell 0",
           "ch/jax.ipynb::Cell 1", "ch/b.ipynb::Cell 0", "ch/jax.ipynb[k=1]::Cell 0",
           "ch/jax.ipynb[k=8]::Cell 0", "ch/jax.ipynb[k=8]::Cell 1", "tests/test_x.py::t"]
    items = [Item(i) for i in ids]
    harness.pytest_collection_modifyitems(Config(), items)   # none recorded: 30 s a unit
    assert [it.nodeid for it in items] == [
        "ch/jax.ipynb::Cell 0", "ch/jax.ipynb::Cell 1", "ch/jax.ipynb[k=1]::Cell 0",
        "ch/jax.ipynb[k=8]::Cell 0", "ch/jax.ipynb[k=8]::Cell 1",
        "ch/a.ipynb::Cell 0", "ch/a.ipynb[k=1]::Cell 0", "ch/b.ipynb::Cell 0",
        "tests/test_x.py::t"]


def test_durations_come_from_junit_and_name_the_units(tmp_path):
    from tools import test_durations as td
    junit = tmp_path / "junit.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
        <testcase classname="chapters.comm.jax.ipynb[k=8]" name="Cell 1" time="5.5"/>
        <testcase classname="chapters.comm.jax.ipynb[k=8]" name="Cell 2" time="1.5"/>
        <testcase classname="chapters.comparison.batch-size.ipynb" name="Cell 0" time="2"/>
        <testcase classname="chapters.comm.jax.ipynb[avx2]" name="Cell 0" time="3"/>
        <testcase classname="tests.test_core" name="test_a[x-1]" time="0.5"/>
        <testcase classname="tests.test_browser" name="test_b" time="3"/>
        <testcase classname="tests.test_book" name="test_c" time="4"/>
        </testsuite></testsuites>"""))
    assert td.unit_seconds(junit) == {"chapters/comm/jax.ipynb[k=8]": 7.0,
                                      "chapters/comparison/batch-size.ipynb": 2.0,
                                      "chapters/comm/jax.ipynb[avx2]": 3.0,
                                      "tests/test_core.py": 0.5, harness.BOOK_GROUP: 7.0}
    assert [td.kind(u) for u in ("chapters/a/b.ipynb[avx2]", "chapters/a/b.ipynb[k=8]",
                                 "chapters/a/b.ipynb[k=1,avx2]", "chapters/a/b.ipynb")] == [
        "notebooks, k = default, capped at AVX2", "notebooks, k = 8",
        "notebooks, k = 1, capped at AVX2", "notebooks, k = default"]
    # every unit the recorded durations name is one that the suite has today
    recorded = harness.recorded_seconds()
    assert set(json.loads(harness.DURATIONS.read_text())["machine"]) == {"cpu", "isa", "cores"}
    assert all(u == harness.BOOK_GROUP or (ROOT / u.split("[")[0]).is_file()
               for u in recorded), [u for u in recorded if not (ROOT / u.split("[")[0]).exists()]


def test_workers_give_kernels_one_openmp_thread_and_a_shared_jax_cache(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\nprint(os.environ['OMP_NUM_THREADS'], os.environ["
        "'JAX_COMPILATION_CACHE_DIR'] == os.path.join(os.getcwd(), '_build', 'jax-cache'))",
        execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout",
                                                          text="1 True\n")])]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    saved = {v: os.environ.pop(v, None) for v in ("OMP_NUM_THREADS", "JAX_COMPILATION_CACHE_DIR")}
    try:
        rc, out = run(tmp_path, "-n", "1", "nb.ipynb")
    finally:
        os.environ.update({v: x for v, x in saved.items() if x is not None})
    assert rc == 0 and "1 passed" in out, out


def test_cpu_seconds_count_each_units_kernel_and_its_children(tmp_path):
    """--cpu-seconds: a notebook whose kernel computes for about a second, through a child
    process it waits for, is charged that second; a test file that only sleeps is not."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 1.5: pass'], check=True)", execution_count=1)]
    nbformat.write(nb, tmp_path / "busy.ipynb")
    (tmp_path / "test_idle.py").write_text("import time\n\ndef test_sleeps():\n"
                                           "    time.sleep(1.5)\n")
    for workers in ("0", "2"):
        out_file = tmp_path / f"cpu-{workers}.json"
        rc, out = run(tmp_path, "-n", workers, "--cpu-seconds", str(out_file),
                      "busy.ipynb", "test_idle.py")
        assert rc == 0 and "2 passed" in out, out
        seconds = json.loads(out_file.read_text())
        assert set(seconds) == {"busy.ipynb", "test_idle.py"}, seconds
        assert seconds["busy.ipynb"] >= 1.4, seconds     # the child's 1.5 s of CPU
        assert seconds["test_idle.py"] < 0.5, seconds
        assert not list(tmp_path.glob(out_file.name + ".gw*"))   # the workers' parts merged


def test_make_check_runs_the_harness_tests_only_when_the_harness_changed():
    """make check selects tests by their markers: what only make test runs (the built book,
    launched ranks, browsers) stays out, the harness's own tests come in when it changed."""
    from tools import check
    quiet, changed = check.marker_expression(set()), check.marker_expression({"conftest.py"})
    assert check.marker_expression({"chapters/comm/jax.ipynb", "tools/check.py"}) == changed

    def collected(expr):
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                            "no:randomly", "-m", expr, "tests"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return {l.split("::")[0] for l in r.stdout.splitlines() if "::" in l}
    files = collected(quiet)
    assert "tests/test_core.py" in files and "tests/test_harness.py" not in files
    assert not files & {"tests/test_browser.py", "tests/test_lab.py", "tests/test_multinode.py",
                        "tests/test_faults_pytorch.py", "tests/test_ddp_knobs.py"}
    assert "tests/test_book.py" in files               # its tests that need no built book
    assert "tests/test_harness.py" in collected(changed)