"""The framework-neutral core: profiles, Accumulator, Timer, shard arithmetic, BatchIterator,
all-reduce schedules, results records, the launcher, and the Animator (headless and in a kernel)."""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import d2lmini
from d2lmini import launch, results


# --- configuration ----------------------------------------------------------------------
def test_profiles_are_the_public_interface(monkeypatch):
    assert set(d2lmini.PROFILES) == {"smoke", "cpu", "gpu"}
    for name in d2lmini.PROFILES:
        monkeypatch.setenv("D2LMINI_PROFILE", name)
        assert d2lmini.get_profile().name == name
    monkeypatch.setenv("D2LMINI_PROFILE", "fast")
    with pytest.raises(ValueError, match="unknown profile 'fast'.*smoke, cpu, gpu"):
        d2lmini.get_profile()


def test_default_profile_follows_the_hardware(monkeypatch):
    monkeypatch.delenv("D2LMINI_PROFILE", raising=False)
    expected = "gpu" if d2lmini.host_has_gpu() else "cpu"
    assert d2lmini.get_profile().name == expected


def test_gpu_profile_keeps_the_original_hyperparameters():
    g = d2lmini.PROFILES["gpu"]
    # their batch and rate; 10 epochs, not their 5, which leave the larger batch short (0.645)
    assert (g.scratch.epochs, g.scratch.batch_size, g.scratch.lr) == (10, 256, 0.3)
    # the larger batch keeps lr 0.3: 0.6 is what the chapter shows collapsing to chance
    assert (g.scratch.big_batch_size, g.scratch.big_lr) == (512, 0.3)
    # their model, batch and rate; 3 epochs of their 10 keep a one-H100 run within minutes
    assert (g.concise.epochs, g.concise.batch_size, g.concise.lr, g.concise.width) == (3, 256, 0.1, 64)
    assert (g.concise.big_batch_size, g.concise.big_lr) == (512, 0.2)
    assert g.scratch.train_samples is None and g.concise.train_samples is None


@pytest.mark.parametrize("raw,ok", [("1", True), ("4", True), ("8", True), ("0", False),
                                    ("-2", False), ("two", False)])
def test_num_simulated_devices(monkeypatch, raw, ok):
    monkeypatch.setenv("D2LMINI_NUM_DEVICES", raw)
    if ok:
        assert d2lmini.num_simulated_devices() == int(raw)
    else:
        with pytest.raises(ValueError, match="positive integer"):
            d2lmini.num_simulated_devices()


@pytest.mark.parametrize("raw", ["9", "9999"])
def test_too_many_devices_is_a_clear_error(host, raw):
    """A typo such as 9999 must not split the CPU into thousands of devices: the error says
    what the book supports and what to do."""
    host(0, requested=raw)
    with pytest.raises(ValueError, match=r"D2LMINI_NUM_DEVICES=%s .*from 1 to 8.*unset it" % raw):
        d2lmini.requested_devices()


def test_a_machine_with_more_gpus_may_use_them_all(host):
    host(16, requested=16)
    assert d2lmini.requested_devices() == 16
    host(16, requested=17)
    with pytest.raises(ValueError, match="from 1 to 16.*this machine has 16 GPUs"):
        d2lmini.requested_devices()


# --- which devices a lesson uses ----------------------------------------------------------
from d2lmini import config  # noqa: E402

def test_plan_without_gpus_simulates_the_requested_count(host):
    host(0)
    p = d2lmini.plan_devices("torch", 0)
    assert (p.kind, p.count, p.gpus, p.stand_ins, p.note) == ("cpu", 2, 0, False, None)
    for k in range(1, 9):
        host(0, requested=k)
        assert d2lmini.plan_devices("jax", 0).count == k


def test_plan_uses_the_first_k_gpus_and_all_by_default(host):
    host(8)
    assert d2lmini.plan_devices("torch", 8) == config.DevicePlan("gpu", 8, 8, False, None)
    host(8, requested=3)
    assert d2lmini.plan_devices("torch", 8) == config.DevicePlan("gpu", 3, 3, False, None)


def test_plan_with_fewer_gpus_than_requested_uses_stand_ins_and_says_so(host):
    host(1, requested=4)
    p = d2lmini.plan_devices("torch", 1)
    assert (p.kind, p.count, p.gpus, p.stand_ins) == ("gpu", 4, 1, True)
    assert "repeated as stand-ins" in p.note and "1 GPU" in p.note
    p = d2lmini.plan_devices("jax", 1, stand_in="cpu")     # a mesh cannot hold a GPU twice
    assert (p.kind, p.count, p.gpus, p.stand_ins) == ("cpu", 4, 0, True)
    assert "simulated CPU devices" in p.note


def test_plan_at_least_gives_a_one_device_machine_stand_ins(host):
    host(0, requested=1)
    p = d2lmini.plan_devices("paddle", 0, at_least=2)
    assert (p.count, p.stand_ins) == (2, True) and "at least 2" in p.note
    host(1)                                                 # one GPU, nothing requested
    p = d2lmini.plan_devices("torch", 1, at_least=2)
    assert (p.kind, p.count, p.gpus, p.stand_ins) == ("gpu", 2, 1, True)
    host(2)
    assert d2lmini.plan_devices("torch", 2, at_least=2).stand_ins is False
    with pytest.raises(ValueError):
        d2lmini.plan_devices("torch", 2, at_least=0)


def test_plan_never_falls_back_silently_under_the_gpu_profile(host):
    host(2, profile="gpu")
    with pytest.raises(d2lmini.GPUBuildMissing, match=r"torch sees no GPU.*H100.*Install"):
        d2lmini.plan_devices("torch", 0)
    host(2, profile="smoke")                                # tests on a GPU host, CPU build
    p = d2lmini.plan_devices("torch", 0)
    assert p.kind == "cpu" and p.note.startswith("NOTE:") and "CPU build" in p.note


def test_plan_for_a_gpu_the_framework_has_no_kernels_for(host):
    host(1, profile="gpu", requested=2)
    p = d2lmini.plan_devices("mxnet", 1, unsupported="MXNet has no kernels for 9.0.")
    assert (p.kind, p.count, p.gpus) == ("cpu", 2, 0) and "no kernels" in p.note


def test_device_plan_is_decided_once_and_prints_its_note_once(host, capsys):
    host(0, requested=1)
    config.reset_device_plans()
    try:
        calls = []
        count = lambda: calls.append(1) or 0
        first = config.device_plan("torch", count, at_least=2)
        again = config.device_plan("torch", count, at_least=2)
        assert first is again and len(calls) == 1
        assert capsys.readouterr().out.count("NOTE:") == 1
        assert config.device_plan("torch", count) is first      # the lesson keeps its minimum
        assert config.device_plan("jax", count).count == 1      # another framework: its own
    finally:
        config.reset_device_plans()


def test_exact_numerics_are_scoped_by_default(monkeypatch):
    # training and timing keep the frameworks' GPU defaults; only D2LMINI_EXACT=1 makes the
    # whole process exact (and sets NVIDIA_TF32_OVERRIDE, which no block can undo)
    monkeypatch.delenv("D2LMINI_EXACT", raising=False)
    assert not config.exact_everywhere()
    assert "NVIDIA_TF32_OVERRIDE" not in os.environ or os.environ.get("D2LMINI_EXACT") == "1"
    monkeypatch.setenv("D2LMINI_EXACT", "1")
    assert config.exact_everywhere()


def test_predictions_agree_except_near_ties():
    a = np.array([[2.0, 0.0, 0.0], [0.5, 0.5 + 1e-4, 0.0], [0.0, 1.0, 3.0]])
    b = a.copy()
    b[1] = [0.6, 0.5, 0.0]                     # a near-tie flipped: allowed
    assert d2lmini.predictions_agree(a, b)
    b[0] = [0.0, 2.0, 0.0]                     # a clear prediction changed: caught
    assert not d2lmini.predictions_agree(a, b)
    with pytest.raises(ValueError):
        d2lmini.predictions_agree(a, a[:2])


# --- Accumulator, Timer -------------------------------------------------------------------
def test_accumulator():
    acc = d2lmini.Accumulator(2)
    acc.add(3, 10)
    acc.add(np.float32(2.5), 5)
    assert acc[0] == 5.5 and acc[1] == 15
    with pytest.raises(ValueError):
        acc.add(1)
    acc.reset()
    assert acc.data == [0.0, 0.0]


def test_timer():
    t = d2lmini.Timer()
    with pytest.raises(RuntimeError):
        t.stop()
    for _ in range(3):
        t.start()
        time.sleep(0.01)
        t.stop()
    assert len(t.times) == 3 and t.avg() >= 0.009
    assert t.sum() == pytest.approx(sum(t.times))
    assert t.cumsum()[-1] == pytest.approx(t.sum())


# --- splitting -------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_shard_slices_cover_the_batch_once(k):
    for n in range(k, 40):
        sl = d2lmini.shard_slices(n, k)
        covered = np.concatenate([np.arange(n)[s] for s in sl])
        assert np.array_equal(covered, np.arange(n))
        sizes = [s.stop - s.start for s in sl]
        assert max(sizes) - min(sizes) <= 1


def test_shard_slices_too_small_batch():
    with pytest.raises(ValueError, match="cannot split a batch of 2 sample\\(s\\) across 3 devices"):
        d2lmini.shard_slices(2, 3)
    with pytest.raises(ValueError):
        d2lmini.shard_slices(5, 0)


def test_uneven_shards_give_the_exact_gradient():
    """Summed per-shard gradients / global n == the full-batch mean gradient (least squares)."""
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(11, 3)), rng.normal(size=11), rng.normal(size=3)
    full = X.T @ (X @ w - y) / len(y)
    for k in (2, 3, 4):
        parts = [X[s].T @ (X[s] @ w - y[s]) for s in d2lmini.shard_slices(len(y), k)]
        assert np.allclose(sum(parts) / len(y), full)
        # averaging per shard instead is wrong for uneven shards:
        means = [X[s].T @ (X[s] @ w - y[s]) / (s.stop - s.start) for s in d2lmini.shard_slices(len(y), k)]
        assert not np.allclose(sum(means) / k, full)


# --- BatchIterator -------------------------------------------------------------------------
def test_batch_iterator_is_seeded_and_covers_each_epoch():
    X, y = np.arange(50).reshape(25, 2), np.arange(25)
    a = d2lmini.BatchIterator(X, y, 8, shuffle=True, seed=3)
    b = d2lmini.BatchIterator(X, y, 8, shuffle=True, seed=3)
    e0a, e0b = [yb.tolist() for _, yb in a], [yb.tolist() for _, yb in b]
    assert e0a == e0b and len(e0a) == 4 and [len(v) for v in e0a] == [8, 8, 8, 1]
    assert sorted(sum(e0a, [])) == list(range(25))
    e1a = [yb.tolist() for _, yb in a]
    assert e1a != e0a                      # a new order each epoch
    b.set_epoch(1)
    assert [yb.tolist() for _, yb in b] == e1a
    for xb, yb in d2lmini.BatchIterator(X, y, 8, shuffle=True, seed=3):
        assert np.array_equal(xb[:, 0] // 2, yb)   # samples stay with their labels


def test_batch_iterator_options():
    X, y = np.zeros((10, 1)), np.arange(10)
    assert len(d2lmini.BatchIterator(X, y, 4)) == 3
    assert len(d2lmini.BatchIterator(X, y, 4, drop_last=True)) == 2
    assert [b.tolist() for _, b in d2lmini.BatchIterator(X, y, 4)][0] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        d2lmini.BatchIterator(X, y[:5], 4)
    with pytest.raises(ValueError):
        d2lmini.BatchIterator(X, y, 0)


# --- all-reduce schedules -----------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4, 5, 8])
def test_ring_schedule_computes_the_sum_and_its_traffic(k):
    n = 1001
    rng = np.random.default_rng(k)
    bufs = [rng.normal(size=n) for _ in range(k)]
    expected = sum(bufs)
    chunks = d2lmini.chunk_slices(n, k)
    for step in d2lmini.ring_schedule(k):
        msgs = [(t, bufs[t.src][chunks[t.chunk]].copy()) for t in step]  # concurrent sends
        for t, payload in msgs:
            if t.op == "add":
                bufs[t.dst][chunks[t.chunk]] += payload
            else:
                bufs[t.dst][chunks[t.chunk]] = payload
    assert all(np.allclose(b, expected) for b in bufs)
    ring = d2lmini.traffic(d2lmini.ring_schedule(k), n, k, itemsize=4)
    assert sum(ring["sent"]) == 2 * (k - 1) * n * 4
    assert max(ring["sent"]) - min(ring["sent"]) <= 2 * (k - 1) * 4
    naive = d2lmini.traffic(d2lmini.naive_schedule(k), n, k, itemsize=4)
    assert naive["sent"][0] + naive["received"][0] == 2 * (k - 1) * n * 4


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_traffic_table_of_the_scratch_chapter_holds_for_lenet(k):
    """The from-scratch labs' traffic table (LeNet's gradient, float32): device 0 of the naive
    scheme sends and receives 2(k-1)N numbers, each ring device sends 2(k-1)/k N (within one
    element per step), and both schemes send the same total."""
    n = sum(int(np.prod(shape)) for shape in d2lmini.LENET_SHAPES)
    naive = d2lmini.traffic(d2lmini.naive_schedule(k), n, k, 4)
    ring = d2lmini.traffic(d2lmini.ring_schedule(k), n, k, 4)
    assert naive["sent"][0] + naive["received"][0] == 2 * (k - 1) * n * 4
    assert all(abs(s - 2 * (k - 1) / k * n * 4) <= 2 * (k - 1) * 4 for s in ring["sent"])
    assert sum(naive["sent"]) == sum(ring["sent"])


def test_scratch_runs_are_checked_and_kept_out_of_the_results_under_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("D2LMINI_PROFILE", "smoke")
    good = dict(devices=2, batch_size=64, lr=0.1, test_acc=0.99, s_per_epoch=1.0)
    results.check_scratch_runs([good], "torch", results_file=str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()          # the tests never rewrite the records
    with pytest.raises(AssertionError, match="did not learn"):
        results.check_scratch_runs([dict(good, test_acc=0.0)], "torch")


# --- results records ------------------------------------------------------------------------
def test_record_result_replaces_matching_records(tmp_path):
    p = tmp_path / "r.json"
    key = dict(chapter="scratch", framework="torch", api="scratch", profile="cpu", batch_size=256)
    results.record_result(p, devices=1, test_acc=0.5, **key)
    results.record_result(p, devices=2, test_acc=0.6, **key)
    results.record_result(p, devices=1, test_acc=0.7, **key)
    recs = results.load_results(p)
    assert sorted((r["devices"], r["test_acc"]) for r in recs) == [(1, 0.7), (2, 0.6)]
    assert recs[0]["hardware"]["cpu_cores"] == os.cpu_count()
    assert "numpy" in recs[0]["versions"]


# --- launcher ---------------------------------------------------------------------------------
def test_free_port_is_bindable():
    port = launch.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_launch_failure_shows_the_error():
    code = "import sys; print('rank 1 says hello'); sys.exit('rank 1: boom')"
    with pytest.raises(launch.LaunchError) as e:
        launch.run([sys.executable, "-c", code], timeout=60)
    assert e.value.returncode == 1
    assert "rank 1: boom" in str(e.value) and "rank 1 says hello" in e.value.log


def test_launch_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
            "time.sleep(300)\n")
    t0 = time.perf_counter()
    with pytest.raises(launch.LaunchError, match="did not finish within 3 s"):
        launch.run([sys.executable, "-c", code], timeout=3)
    assert time.perf_counter() - t0 < 30
    child = int(pidfile.read_text())
    time.sleep(0.2)
    with open(f"/proc/{child}/stat") as f:  # gone, or a zombie awaiting its reaper
        state = f.read().split()[2] if os.path.exists(f"/proc/{child}") else "Z"
    assert state == "Z"


def test_read_rank_results(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0}))
    with pytest.raises(FileNotFoundError, match="rank1.json"):
        launch.read_rank_results(tmp_path, 2)
    (tmp_path / "rank1.json").write_text(json.dumps({"rank": 1}))
    assert [r["rank"] for r in launch.read_rank_results(tmp_path, 2)] == [0, 1]


# --- Animator ---------------------------------------------------------------------------------
def test_animator_headless_script(tmp_path):
    code = ("import d2lmini\n"
            "a = d2lmini.Animator(xlabel='epoch', legend=['train', 'test'], xlim=[1, 3])\n"
            "for e in range(1, 4):\n    a.add(e, (1.0 / e, None if e == 2 else 0.5))\n"
            f"a.savefig({str(tmp_path / 'f.png')!r})\n"
            "print(a.X, a.Y)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "DISPLAY"})
    assert r.returncode == 0, r.stderr
    assert "[[1.0, 2.0, 3.0], [1.0, 3.0]]" in r.stdout
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_animator_in_a_kernel_leaves_one_png():
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import d2lmini\na = d2lmini.Animator(legend=['acc'])\n"
        "for e in range(5):\n    a.add(e, e / 10)")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert len(outputs) == 1, outputs
    data = outputs[0]["data"]
    assert "image/png" in data and "image/svg+xml" not in data


# -- the recipe scripts' shared parts ---------------------------------------------------------

def test_unified_diff_shows_only_the_changed_lines(tmp_path):
    a, b = tmp_path / "one.py", tmp_path / "dp.py"
    a.write_text("import x\n\ndef main():\n    net = build()\n    train(net)\n")
    b.write_text("import x\n\ndef main():\n    net = wrap(build())\n    train(net)\n")
    diff = d2lmini.unified_diff(a, b)
    assert diff.splitlines()[:2] == ["--- one.py", "+++ dp.py"]
    changed = [l for l in diff.splitlines()[2:] if l[:1] in "+-"]
    assert changed == ["-    net = build()", "+    net = wrap(build())"]
    with pytest.raises(FileNotFoundError, match="no file"):
        d2lmini.unified_diff(a, tmp_path / "missing.py")
    # a block only a copy of the file runs (identical or not) is left out of the diff
    from d2lmini.utils import COPY_ALONE_MARKER
    b.write_text(b.read_text() + f"{COPY_ALONE_MARKER}, without d2lmini\nextra = 1\n")
    assert [l for l in d2lmini.unified_diff(a, b).splitlines()[2:] if l[:1] in "+-"] == changed


def test_recipe_report_prints_the_printout_and_accumulates_the_results(tmp_path, capsys):
    import json
    from d2lmini import recipe
    out = tmp_path / "r.json"
    args = recipe.parse_args(["--epochs", "2", "--batch-size", "64", "--out", str(out)])
    recipe.report(args, 0, 2.0, 0.25, devices=2, framework="torch", seconds=1.25)
    recipe.report(args, 1, 1.5, 0.5, devices=2, framework="torch", seconds=1.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["epoch 1: loss 2.000, test accuracy 0.250 (2 devices, 1.2 s)",
                     "epoch 2: loss 1.500, test accuracy 0.500 (2 devices, 1.0 s)"]
    r = json.loads(out.read_text())
    assert r["loss"] == [2.0, 1.5] and r["test_acc"] == [0.25, 0.5] and r["devices"] == 2
    assert r["batch_size"] == 64 and r["framework"] == "torch"
    with pytest.raises(SystemExit):
        recipe.parse_args(["--batch-size", "0"])


def test_calibration_batches_are_whole_reproducible_and_not_the_training_order():
    X = np.arange(100, dtype=np.float32).reshape(100, 1)
    y = np.arange(100)
    a = d2lmini.calibration_batches(X, y, batch_size=16, num_batches=3)
    b = d2lmini.calibration_batches(X, y, batch_size=16, num_batches=3)
    assert len(a) == 3 and all(len(yb) == 16 for _, yb in a)
    assert all(np.array_equal(p[1], q[1]) for p, q in zip(a, b))
    assert len(np.unique(np.concatenate([yb for _, yb in a]))) == 48   # no image twice
    first_training_batch = next(iter(d2lmini.BatchIterator(X, y, 16, shuffle=True, seed=0)))[1]
    assert not np.array_equal(a[0][1], first_training_batch)
    assert len(d2lmini.calibration_batches(X, y, batch_size=500, num_batches=9)) == 1
    with pytest.raises(ValueError):
        d2lmini.calibration_batches(X, y, batch_size=16, num_batches=0)


def test_fault_injection_wraps_a_step_and_fails_only_the_chosen_rank_and_step(monkeypatch):
    calls = []
    step = lambda x: calls.append(x) or x
    monkeypatch.setenv("D2LMINI_FAIL_RANK", "1")
    monkeypatch.setenv("D2LMINI_FAIL_STEP", "2")
    other = launch.failing(step, rank=lambda: 0)
    assert [other(i) for i in range(4)] == [0, 1, 2, 3]          # rank 0: never fails
    chosen = launch.failing(step, rank=lambda: 1)
    assert chosen("a") == "a" and chosen("b") == "b"
    with pytest.raises(RuntimeError, match=r"injected failure on rank 1 at step 2 "
                                           r"\(D2LMINI_FAIL_RANK=1: rank 1 fails on purpose\)"):
        chosen("c")
    assert calls == [0, 1, 2, 3, "a", "b"]                      # the failing step never ran
    monkeypatch.delenv("D2LMINI_FAIL_RANK")
    launch.maybe_fail(1, 2)                                      # not set: no fault


def test_plot_schedule_draws_one_arrow_per_message():
    import matplotlib
    matplotlib.use("Agg")
    from d2lmini.collectives import naive_schedule, plot_schedule, plot_schedules, ring_schedule
    for k in (2, 4, 5):
        for sched in (ring_schedule(k), naive_schedule(k)):
            ax = plot_schedule(sched, k)
            arrows = [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
            assert len(arrows) == sum(len(step) for step in sched)
    assert len(plot_schedules(4).axes) == 3


def test_import_d2lmini_loads_the_core_only_and_a_chapter_package_when_used():
    """A launched rank imports d2lmini: it must not pay for the chapters' packages (commcost's
    14 modules, sharding, the recipe helpers, the step timer); they load on first use."""
    import subprocess
    import sys
    code = ("import sys, d2lmini\n"
            "core = sorted(m for m in sys.modules if m.startswith('d2lmini'))\n"
            "print(','.join(core))\n"
            "print(d2lmini.sharding.bytes_per_parameter(4, 3), 'd2lmini.commcost' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    loaded = out[0].split(",")
    for chapter in d2lmini_chapter_modules():
        assert f"d2lmini.{chapter}" not in loaded, loaded
    assert len(loaded) <= 8, loaded
    assert out[1] == "4.0 True"                    # used: loaded, with what it imports


def d2lmini_chapter_modules():
    import d2lmini
    return d2lmini.CHAPTER_MODULES


def test_settings_read_a_section_and_refuse_an_unknown_one():
    import d2lmini
    smoke = d2lmini.settings("scratch", "smoke")
    assert smoke == d2lmini.PROFILES["smoke"].scratch
    assert d2lmini.settings("concise", d2lmini.PROFILES["gpu"]) == d2lmini.PROFILES["gpu"].concise
    line = d2lmini.settings_line(smoke)
    assert f"epochs={smoke.epochs}" in line and "min_test_acc" not in line
    with pytest.raises(ValueError, match="choose one of .*scratch"):
        d2lmini.settings("scratchh")
