"""The gpu profile's training settings are those a machine has run (tools/rehearse.py).

The stored rehearsals (``benchmarks/rehearsal/*.json``) hold the profile to what ran: a
setting or threshold changed after its rehearsal fails here until it is rehearsed again, and
every rehearsed run must clear its threshold by the stated margin.
"""
import dataclasses
import json

import nbformat
import pytest

import d2lmini

from tools import manifest, rehearse

ROOT = manifest.ROOT

RECORDS = sorted((ROOT / "benchmarks" / "rehearsal").glob("*.json"))


def test_there_are_rehearsals():
    assert RECORDS, "no rehearsal stored in benchmarks/rehearsal"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_a_rehearsal_matches_the_profile_and_clears_its_thresholds(path):
    rec = json.loads(path.read_text())
    nb = ROOT / rec["notebook"]
    assert nb.exists() and rehearse.out_path(nb) == path
    section = rehearse.harvest_of(nb)["section"]
    profile = d2lmini.PROFILES[rec["profile"]]
    now = dataclasses.asdict(getattr(profile, section))
    settings = {k: v for k, v in now.items() if k not in rehearse.THRESHOLDS}
    assert rec["settings"] == settings, (
        f"{rec['notebook']}: the {rec['profile']} profile's {section} settings changed since "
        f"they were rehearsed; run make rehearse NB={rec['notebook']} again")
    if "expected_val_loss" in rec["thresholds_at_the_run"]:   # a loss the settings state
        target = now["expected_val_loss"]
        assert target is not None, f"{rec['notebook']}: set expected_val_loss from the rehearsal"
        for run in rec["runs"]:
            assert abs(run["val_loss"] - target) <= rehearse.LOSS_ROUNDING, (
                f"{rec['notebook']}: rehearsed validation loss {run['val_loss']:.4f}, the "
                f"{rec['profile']} settings state {target}: set it from the rehearsal")
        return
    for run in rec["runs"]:                     # the thresholds in force now, with the margin
        assert run["test_acc"] >= now["min_test_acc"] + rehearse.MARGIN, (
            f"{rec['notebook']}: {run} does not clear min_test_acc {now['min_test_acc']} by "
            f"{rehearse.MARGIN}: set it from the rehearsed runs")
    if "max_acc_gap" in rec["thresholds_at_the_run"]:
        accs = [r["test_acc"] for r in rec["runs"]]
        assert max(accs) - min(accs) + rehearse.GAP_MARGIN <= now["max_acc_gap"], (
            f"{rec['notebook']}: runs {accs} differ by more than max_acc_gap "
            f"{now['max_acc_gap']} less {rehearse.GAP_MARGIN}")


def test_every_chapter_the_gpu_profile_trains_is_rehearsed_or_says_why_not():
    """A page whose training the gpu profile sizes (the manifest's ``Chapter.trains``) is
    rehearsed, or its chapter's ``not_rehearsed`` says why its thresholds are safe without."""
    gpu, cpu = d2lmini.PROFILES["gpu"], d2lmini.PROFILES["cpu"]
    rehearsed = {ROOT / json.loads(p.read_text())["notebook"] for p in RECORDS}
    trained = [(c, key, section) for c in manifest.CHAPTERS for key, section in c.trains.items()]
    assert len(trained) >= 4
    for c, key, section in trained:
        assert getattr(gpu, section) != getattr(cpu, section), (c.name, key)
        assert key in c.rehearsal or key in c.not_rehearsed, (c.name, key)
        assert rehearsed & set(c.page(key)) or key in c.not_rehearsed, (c.name, key)


def test_the_runs_are_read_even_when_a_check_fails(tmp_path):
    """The tool reads the runs out of the kernel after the first failing cell: a threshold
    that is wrong must show by how much, not only that it failed."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("runs = [{'test_acc': 0.645}, {'test_acc': 0.81}]"),
                nbformat.v4.new_code_cell("assert all(r['test_acc'] > 0.7 for r in runs), runs"),
                nbformat.v4.new_code_cell("never = 1")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    data, error, seconds = rehearse.execute(
        path, "import json\nprint('REHEARSAL ' + json.dumps({'runs': runs, "
              "'thresholds': {'min_test_acc': 0.7}}))", timeout=60)
    assert error.startswith("cell 1: ") and "AssertionError" in error
    assert [r["test_acc"] for r in data["runs"]] == [0.645, 0.81]
    v = rehearse.verdict(data)
    assert v["lowest_test_acc"] == 0.645 and v["clearance"] == pytest.approx(-0.055)
    gap = rehearse.verdict(dict(data, thresholds={"min_test_acc": 0.5, "max_acc_gap": 0.1}))
    assert gap["acc_gap"] == pytest.approx(0.165) and gap["gap_clearance"] == pytest.approx(-0.065)
