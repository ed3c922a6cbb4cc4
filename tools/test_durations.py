"""Record how long each unit of work of the test suite took, for ``make test``'s scheduling.

    .venv/bin/python -m pytest ... --junitxml=_build/junit.xml
    .venv/bin/python -m tools.test_durations _build/junit.xml     # rewrites tests/durations.json
    .venv/bin/python -m tools.test_durations _build/junit.xml _build/cpu-seconds.json

A unit is what one xdist worker runs in one go (``conftest.work_unit``): a notebook at one
device count, a test file, or the tests of the built book. ``make test`` hands the units out
longest first, so that the longest ones do not start last. The file only orders the work; a
unit missing from it runs anyway (counted as ``conftest.UNKNOWN_SECONDS``).

It also prints the seconds per kind of unit (docs/test-time.md: where the time goes), and the
CPU seconds per kind when the run wrote them (``--cpu-seconds``, which ``make test`` passes:
``_build/cpu-seconds.json`` beside the XML is read by default).
"""
from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    """The repository's root conftest.py (tests/ has a conftest.py of its own)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("repo_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_h = _harness()
DURATIONS, work_unit = _h.DURATIONS, _h.work_unit


def nodeid(case: ET.Element) -> str:
    """pytest's node id back from JUnit's classname + name (classname is the path with dots)."""
    cls, name = case.get("classname", ""), case.get("name", "")
    file = case.get("file")
    if file:
        return f"{file}::{name}"
    parts = cls.split(".")
    # notebooks: chapters.comm.jax.ipynb[k=8] -> chapters/comm/jax.ipynb[k=8]
    for i, p in enumerate(parts):
        if p.startswith("ipynb"):
            return "/".join(parts[:i - 1]) + f"/{parts[i - 1]}.{p}::{name}"
    # tests.test_core -> tests/test_core.py (classes: tests.test_x.TestY)
    for i in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:i]).with_suffix(".py")
        if path.is_file():
            return "/".join(parts[:i]) + ".py::" + "::".join(parts[i:] + [name])
    return f"{cls}::{name}"


def unit_seconds(junit: Path) -> dict[str, float]:
    out: dict[str, float] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        out[work_unit(nodeid(case))] += float(case.get("time") or 0)
    return dict(out)


def machine() -> dict:
    """The CPU the run was made on (the times hold for it only), with its cores."""
    import os
    from d2lmini.hardware import cpu_isa, cpu_model
    return {"cpu": cpu_model(), "isa": cpu_isa(environ={})[0], "cores": os.cpu_count()}


def kind(unit: str) -> str:
    if unit.startswith("chapters/"):
        marks = unit.partition("[")[2].rstrip("]").split(",")
        k = next((m[2:] for m in marks if m.startswith("k=")), "default")
        return f"notebooks, k = {k}" + (", capped at AVX2" if "avx2" in marks else "")
    return "unit, fault, multi-node, lab, browser and book tests"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    seconds = unit_seconds(Path(argv[0]))
    DURATIONS.write_text(json.dumps(
        {"machine": machine(), "seconds": {u: round(s, 1) for u, s in
                                           sorted(seconds.items(), key=lambda kv: -kv[1])}},
        indent=1) + "\n")
    per_kind = collections.Counter()
    for u, s in seconds.items():
        per_kind[kind(u)] += s
    # CPU seconds per unit (conftest.py --cpu-seconds), when the run wrote them beside the XML
    cpu_file = Path(argv[1]) if len(argv) > 1 else Path(argv[0]).with_name("cpu-seconds.json")
    cpu = json.loads(cpu_file.read_text()) if cpu_file.is_file() else {}
    cpu_kind = collections.Counter()
    for u, s in cpu.items():
        cpu_kind[kind(u)] += s
    head = "test time" + ("      CPU (user + system)" if cpu else "")
    print(f"{'':55s} {head}")
    for k, s in sorted(per_kind.items()):
        extra = f"   {cpu_kind[k] / 60:6.1f} min" if cpu else ""
        print(f"{k:55s} {s / 60:6.1f} min{extra}")
    extra = f"   {sum(cpu.values()) / 60:6.1f} min" if cpu else ""
    print(f"{'total (summed over workers)':55s} {sum(seconds.values()) / 60:6.1f} min{extra}")
    if cpu:
        print("largest CPU users:")
        for u, s in sorted(cpu.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {u:53s} {s:6.0f} s CPU, {seconds.get(u, 0):6.0f} s test time")
    print(f"wrote {DURATIONS.relative_to(ROOT)} ({len(seconds)} units)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
