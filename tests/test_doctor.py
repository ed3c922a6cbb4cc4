"""d2lmini.hardware (nvidia-smi parsing, CUDA_VISIBLE_DEVICES, MXNet's GPU support, the GPU
build fixes), the GPU environments of the Makefile, and ``python -m d2lmini doctor`` against
fake ``nvidia-smi`` scripts (an H100, two A100s, a failing one) placed first on PATH."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from d2lmini import doctor, hardware
from d2lmini.frameworks import KEYS as FRAMEWORKS   # the book's order
from d2lmini.hardware import GpuInfo
from helpers import ROOT, fake_nvidia_smi

pytestmark = pytest.mark.slow   # imports every framework in subprocesses (about 40 s)

QUERY = "--query-gpu=index,name,compute_cap,memory.total,driver_version"
H100 = "0, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.65.06"
A100 = "0, NVIDIA A100-SXM4-80GB, 8.0, 81920, 580.82.07\n1, NVIDIA A100-SXM4-80GB, 8.0, 81920, 580.82.07"
FAILS = None  # nvidia-smi present but failing, as without a driver


def fake_smi(directory: Path, lines: str | None, *, sleep: float = 0, calls: Path | None = None):
    """An executable ``nvidia-smi`` in ``directory`` that answers the doctor's exact query with
    ``lines`` (and anything else with an error), or fails like a machine without a driver."""
    body = []
    if calls:
        body.append(f'echo called >> "{calls}"')
    if sleep:
        body.append(f"sleep {sleep}")
    if lines is None:
        body += ['echo "NVIDIA-SMI has failed because it could not communicate with the '
                 'NVIDIA driver."', "exit 9"]
    else:
        body += [f'[ "$1" = "{QUERY}" ] && [ "$2" = "--format=csv,noheader,nounits" ] || '
                 '{ echo "unexpected arguments: $*" >&2; exit 2; }',
                 "cat <<'EOF'", lines, "EOF"]
    return fake_nvidia_smi(directory, "\n".join(body))


@pytest.fixture
def smi_path(monkeypatch, tmp_path):
    """Put a fake nvidia-smi first on PATH for this process; returns a function of its lines."""
    hardware.nvidia_gpus.cache_clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def use(lines, **kw):
        d = fake_smi(tmp_path / f"bin{len(list(tmp_path.iterdir()))}", lines, **kw)
        monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
        return d
    yield use
    hardware.nvidia_gpus.cache_clear()


# --- nvidia-smi ---------------------------------------------------------------------------

def test_parse_nvidia_smi_reads_each_field_and_skips_what_does_not_parse():
    text = "\n".join([
        H100,
        "1, NVIDIA GeForce RTX 4090, 8.9, 24564, 570.86.10",
        "2, Weird, Name, With Commas, 7.5, 15360, 535.1",     # a comma in the name
        "",
        "garbage",
        "3, Tesla K80, [N/A], 11441, 470.1",                  # no compute capability
        "x, NVIDIA A100, 8.0, 81920, 580.1",                  # no index
        "4, NVIDIA A100, 8.0, [N/A], 580.1",                  # no memory
        "5, NVIDIA L4, 8.9, 23034",                           # a field missing
    ])
    assert hardware.parse_nvidia_smi(text) == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 81559, "580.65.06"),
        GpuInfo(1, "NVIDIA GeForce RTX 4090", (8, 9), 24564, "570.86.10"),
        GpuInfo(2, "Weird, Name, With Commas", (7, 5), 15360, "535.1"),
    ]
    assert GpuInfo(0, "x", (9, 0), 1, "d").sm == "sm_90"


FOUR = [GpuInfo(i, f"gpu{i}", (8, 0), 1000 + i, "580") for i in range(4)]


@pytest.mark.parametrize("cvd,names", [
    (None, ["gpu0", "gpu1", "gpu2", "gpu3"]),
    ("", []), ("-1", []), ("  ", []),
    ("2", ["gpu2"]),
    ("3,1", ["gpu3", "gpu1"]),
    ("0, 2", ["gpu0", "gpu2"]),
    ("1,7,2", ["gpu1"]),          # CUDA ignores everything from the first invalid entry on
    ("1,1", ["gpu1"]),
    ("GPU-8f2c1a2e-0000", ["gpu0", "gpu1", "gpu2", "gpu3"]),   # UUIDs: cannot tell, keep all
])
def test_cuda_visible_devices_selects_and_renumbers(cvd, names):
    seen = hardware.visible_gpus(FOUR, cvd)
    assert [g.name for g in seen] == names
    assert [g.index for g in seen] == list(range(len(names)))


def test_nvidia_gpus_from_a_fake_h100(smi_path):
    smi_path(H100)
    assert hardware.nvidia_gpus() == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 81559, "580.65.06")]


def test_nvidia_gpus_honours_cuda_visible_devices(smi_path, monkeypatch):
    smi_path(A100.replace("0, NVIDIA A100-SXM4-80GB, 8.0, 81920", "0, NVIDIA A100-SXM4-40GB, 8.0, 40960"))
    assert [g.memory_mib for g in hardware.nvidia_gpus()] == [40960, 81920]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [(g.index, g.memory_mib) for g in hardware.nvidia_gpus()] == [(0, 81920)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert hardware.nvidia_gpus() == []


def test_nvidia_gpus_is_cached_until_cache_clear(smi_path, tmp_path):
    calls = tmp_path / "calls"
    smi_path(H100, calls=calls)
    assert len(hardware.nvidia_gpus()) == len(hardware.nvidia_gpus()) == 1
    assert calls.read_text().count("called") == 1
    hardware.nvidia_gpus.cache_clear()
    hardware.nvidia_gpus()
    assert calls.read_text().count("called") == 2


def test_no_gpus_when_nvidia_smi_fails_is_missing_or_hangs(smi_path, monkeypatch, tmp_path):
    smi_path(FAILS)
    assert hardware.nvidia_gpus() == []
    hardware.nvidia_gpus.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert hardware.nvidia_gpus() == []
    monkeypatch.setenv("PATH", os.defpath)
    monkeypatch.setattr(hardware, "NVIDIA_SMI_TIMEOUT", 0.5)
    smi_path(H100, sleep=5)
    assert hardware.nvidia_gpus() == []


def test_host_has_gpu_agrees_with_nvidia_gpus(smi_path):
    from d2lmini import config
    clear = getattr(config.host_has_gpu, "cache_clear", lambda: None)
    smi_path(H100)
    clear()
    try:
        assert config.host_has_gpu() is True
    finally:
        clear()


# --- MXNet on a compute capability ------------------------------------------------------------

@pytest.mark.parametrize("cc,ok", [
    ((5, 0), True), ((5, 2), True), ((6, 1), True), ((7, 0), True), ((7, 5), True),
    ((8, 0), True), ((8, 6), True), ((8, 9), True),
    ((9, 0), False), ((10, 0), False), ((12, 0), False), ((3, 7), False), ((8, 5), True),
])
def test_mxnet_gpu_support(cc, ok):
    supported, reason = hardware.mxnet_gpu_support(cc)
    assert supported is ok
    assert f"{cc[0]}.{cc[1]}" in reason
    if not ok:
        assert "no kernel image is available" in reason and "CPU" in reason


# --- GPU environments -------------------------------------------------------------------------

PINS = {"torch": "torch===2.13.0", "jax": "jax[cuda12]==0.10.2",
        "paddle": "paddlepaddle-gpu==3.3.1", "mxnet": "mxnet-cu112==1.9.1"}


@pytest.mark.parametrize("fw", sorted(PINS))
def test_gpu_build_fix_names_the_target_and_the_pip_steps(fw):
    fix = hardware.gpu_build_fix(fw)
    b = hardware.GPU_BUILDS[fw]
    assert fix.startswith(f"make gpu-venv FW={fw} ")
    for cmd in hardware.pip_commands(fw):
        assert cmd in fix
        for arg in cmd.split():
            if arg.endswith(".txt"):
                assert (ROOT / arg).is_file(), arg
    text = (ROOT / b.requirements).read_text().splitlines()
    assert PINS[fw] in text
    assert b.venv == f".venv-gpu-{fw}"


def test_framework_names():
    assert hardware.canonical_framework("PyTorch") == "torch"
    assert hardware.canonical_framework("paddlepaddle") == "paddle"
    with pytest.raises(ValueError, match="unknown framework 'tensorflow'"):
        hardware.gpu_build_fix("tensorflow")


def test_fix_warns_about_a_driver_too_old(smi_path):
    smi_path("0, NVIDIA A100-SXM4-80GB, 8.0, 81920, 550.54.15")
    assert "driver 550.54.15 is older than 580" in hardware.gpu_build_fix("torch")
    assert "older" not in hardware.gpu_build_fix("jax")


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a file (comments and blank lines dropped)."""
    return [l.split("#")[0].strip() for l in path.read_text().splitlines()
            if l.split("#")[0].strip()]


def test_requirement_files_share_the_common_pins_and_nothing_else():
    for fw, b in hardware.GPU_BUILDS.items():
        files = [ROOT / a for step in b.pip_steps for a in step if a.endswith(".txt")]
        lines = [l for f in files for l in requirement_lines(f)]
        assert "-r requirements-common.txt" in lines or ROOT / "requirements-common.txt" in files
        # flax/optax (and their dependencies) only where JAX is
        assert ("-r requirements-flax.txt" in lines) == (fw == "jax")
        assert not any(l.startswith(("flax", "optax")) for l in lines)
    common = " ".join(requirement_lines(ROOT / "requirements-common.txt")).lower()
    for framework in ("torch==", "jax==", "jaxlib==", "paddlepaddle", "mxnet", "flax==", "optax=="):
        assert framework not in common
    flax = requirement_lines(ROOT / "requirements-flax.txt")
    assert "flax==0.12.8" in flax and "optax==0.2.8" in flax
    assert not any(l.startswith(("jax==", "jaxlib==", "-r")) for l in flax)
    cpu = requirement_lines(ROOT / "requirements.txt")
    assert "-r requirements-common.txt" in cpu and "-r requirements-flax.txt" in cpu
    assert not (ROOT / "requirements-gpu.txt").exists()


def make(*args, **env):
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.mark.parametrize("fw", sorted(PINS))
def test_makefile_gpu_venv_runs_the_same_pip_steps(fw):
    r = make("-n", "gpu-venv", f"FW={fw}")
    assert r.returncode == 0, r.stderr
    b = hardware.GPU_BUILDS[fw]
    for step in b.pip_steps:
        assert f'"{" ".join(step)}"' in r.stdout, (step, r.stdout)
    assert f".venv-gpu-{fw}/bin/python -m pip" in r.stdout
    assert "install --no-deps -e ." in r.stdout
    assert f'--name {b.kernel} --display-name "{b.display_name}"' in r.stdout
    # nothing of the CPU venv
    assert ".venv/" not in r.stdout.replace(f".venv-gpu-{fw}/", "")


def test_makefile_gpu_venv_wants_a_framework():
    r = make("gpu-venv", "FW=tensorflow")
    assert r.returncode != 0 and "usage: make gpu-venv FW=<torch|jax|paddle|mxnet>" in r.stderr


def fake_dist(site: Path, name: str, version: str, requires=(), files=None):
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    d.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires))
    for rel, text in (files or {}).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


@pytest.mark.parametrize("name,version,requires,files,gpu", [
    ("torch", "2.13.0+cpu", (), {"torch/version.py": "cuda: Optional[str] = None\n"}, False),
    ("torch", "2.13.0", ("nvidia-cudnn-cu13==9.20.0.48; platform_system == 'Linux'",),
     {"torch/version.py": "cuda: Optional[str] = None\n"}, True),
    ("torch", "2.11.0", (), {"torch/version.py": "cuda: Optional[str] = '13.0'\n"}, True),
    ("torch", "2.13.0+cu126", (), None, True),
    ("jax", "0.10.2", (), None, False),
    ("jax-cuda12-plugin", "0.10.2", (), None, True),
    ("jax-cuda13-pjrt", "0.10.2", (), None, True),
    ("paddlepaddle", "3.3.1", (), None, False),
    ("paddlepaddle-gpu", "3.3.1", (), None, True),
    ("mxnet", "1.9.1", (), None, False),
    ("mxnet-cu112", "1.9.1", (), None, True),
])
def test_gpu_builds_installed(tmp_path, name, version, requires, files, gpu):
    fake_dist(tmp_path, name, version, requires, files)
    found = hardware.gpu_builds_installed([str(tmp_path)])
    assert bool(found) is gpu, found
    if gpu:
        assert found[0].startswith(f"{name} {version}")


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A venv without pip: enough for the Makefile's guard, which uses only the stdlib."""
    v = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True)
    site = next(v.glob("lib/python3*/site-packages"))
    return v, site


def test_make_venv_refuses_a_venv_holding_a_gpu_build(bare_venv):
    v, site = bare_venv
    fake_dist(site, "paddlepaddle-gpu", "3.3.1")
    try:
        # PIP is overridden: were the guard to let the recipe through, nothing is installed
        r = make("venv", f"VENV={v}", "PIP=echo WOULD-PIP")
    finally:
        for d in site.glob("paddlepaddle_gpu-*"):
            shutil.rmtree(d)
    assert r.returncode != 0
    assert "WOULD-PIP" not in r.stdout
    assert "holds GPU builds (paddlepaddle-gpu 3.3.1)" in r.stderr
    assert "make gpu-venv FW=" in r.stderr
    assert not (v / ".installed").exists()


def test_make_venv_goes_on_in_a_cpu_venv(bare_venv):
    v, site = bare_venv
    fake_dist(site, "torch", "2.13.0+cpu")
    r = make("venv", f"VENV={v}", "PIP=echo WOULD-PIP")
    assert "WOULD-PIP install -r requirements.txt" in r.stdout
    assert "holds GPU builds" not in r.stderr


# --- the doctor --------------------------------------------------------------------------------

needs_cpu_venv = pytest.mark.skipif(
    bool(hardware.gpu_builds_installed()) or
    any(doctor.installed(fw)[0] is False for fw in FRAMEWORKS),
    reason="the doctor scenarios expect the CPU venv: all four frameworks, CPU builds")


def run_doctor(tmp_path, smi_lines, *args, env=None):
    """``python -m d2lmini doctor ARGS`` with a fake nvidia-smi first on PATH."""
    bindir = fake_smi(tmp_path / "smi", smi_lines)
    e = {k: v for k, v in os.environ.items()
         if k not in ("D2LMINI_PROFILE", "D2LMINI_NUM_DEVICES", "CUDA_VISIBLE_DEVICES")}
    e["PATH"] = f"{bindir}{os.pathsep}{e['PATH']}"
    e.update(env or {})
    r = subprocess.run([sys.executable, "-m", "d2lmini", "doctor", *args], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def run_doctor_both(tmp_path, smi_lines, *args, env=None):
    """One doctor run: its printed (human) report and the JSON report of ``--json-file``."""
    js = tmp_path / "report.json"
    r = run_doctor(tmp_path, smi_lines, "--json-file", str(js), *args, env=env)
    return r, json.loads(js.read_text())


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    """The doctor on a fake H100, once: human output and the JSON report."""
    return run_doctor_both(tmp_path_factory.mktemp("h100"), H100)


@pytest.fixture(scope="module")
def no_gpu(tmp_path_factory):
    """The doctor where nvidia-smi fails, once (3 simulated devices): human output and JSON."""
    return run_doctor_both(tmp_path_factory.mktemp("nogpu"), FAILS,
                           env={"D2LMINI_NUM_DEVICES": "3"})


@needs_cpu_venv
def test_doctor_without_gpu_is_happy_and_lists_cpu_devices(no_gpu):
    r, _ = no_gpu
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "host GPUs : none (nvidia-smi reports none)" in lines
    for fw in FRAMEWORKS:
        row = next(l for l in lines if l.startswith(fw + " "))
        assert "CPU only" in row and row.rstrip().endswith("ok"), row
        assert any(l.startswith(f"  {fw}: cpu") for l in lines), fw
    assert lines[-1] == "no problems."


@needs_cpu_venv
def test_doctor_json_without_gpu(no_gpu):
    r, rep = no_gpu
    assert r.returncode == 0
    assert rep["ok"] is True and rep["problems"] == [] and rep["host"]["gpus"] == []
    assert rep["profile"] == "cpu" and rep["num_devices"] == "3"
    assert list(rep["frameworks"]) == list(FRAMEWORKS)
    for fw, f in rep["frameworks"].items():
        assert f["installed"] and f["status"] == "ok" and f["build"] == "CPU", f
        assert f["gpus"] == 0 and f["devices"] and {d["kind"] for d in f["devices"]} == {"cpu"}
        assert f["version"]
        assert f["lessons"] in (None, "3 CPU"), f["lessons"]


@needs_cpu_venv
def test_doctor_on_an_h100_names_the_cpu_builds_and_mxnet(h100):
    human, rep = h100
    assert human.returncode == 1
    assert rep["ok"] is False and rep["profile"] == "gpu"
    assert rep["host"]["gpus"][0]["compute_capability"] == [9, 0]
    by_fw = {p["framework"]: p for p in rep["problems"]}
    assert set(by_fw) == set(FRAMEWORKS)
    for fw in (fw for fw in FRAMEWORKS if fw != "mxnet"):      # MXNet: no kernels for sm_90
        assert "CPU build" in by_fw[fw]["problem"]
        assert "fall back to the CPU" in by_fw[fw]["problem"]
        assert by_fw[fw]["fix"].startswith(f"make gpu-venv FW={fw} ")
        assert hardware.GPU_BUILDS[fw].requirements in by_fw[fw]["fix"]
        assert rep["frameworks"][fw]["status"] == "problem"
    mx = by_fw["mxnet"]
    assert "not supported" in mx["problem"] and "compute capability 9.0" in mx["problem"]
    assert "no kernel image is available" in mx["problem"]
    assert mx["fix"].startswith("none on compute capability 9.0")
    assert rep["frameworks"]["mxnet"]["gpu_supported"] is False
    # whatever build is installed, MXNet's notebooks run on CPU contexts there and say so
    assert rep["frameworks"]["mxnet"]["lessons"].endswith("CPU"), rep["frameworks"]["mxnet"]
    assert "use CPU contexts here" in mx["problem"]
    assert rep["frameworks"]["torch"]["lessons"] == "stops (GPUBuildMissing)"
    # the human output says the same, in the same order
    out = human.stdout
    assert f"{len(rep['problems'])} problems:" in out
    positions = [out.index(f". {p['framework']}: {p['problem'].splitlines()[0]}")
                 for p in rep["problems"]]
    assert positions == sorted(positions)
    for p in rep["problems"]:
        assert f"fix: {p['fix']}" in out
    assert "GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0" in out


@needs_cpu_venv
def test_doctor_on_a100s_mxnet_is_supported_but_a_cpu_build(tmp_path):
    r = run_doctor(tmp_path, A100, "--json", "-f", "mxnet", "--json-file",
                   str(tmp_path / "report.json"))
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert json.loads((tmp_path / "report.json").read_text()) == rep   # --json-file: the same
    assert list(rep["frameworks"]) == ["mxnet"] and len(rep["host"]["gpus"]) == 2
    assert rep["frameworks"]["mxnet"]["gpu_supported"] is True
    (p,) = rep["problems"]
    assert "CPU build" in p["problem"] and "not supported" not in p["problem"]
    assert p["fix"].startswith("make gpu-venv FW=mxnet ")


@needs_cpu_venv
def test_cuda_visible_devices_hides_the_fake_gpu(tmp_path):
    r = run_doctor(tmp_path, H100, "--json", "-f", "torch", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stdout
    rep = json.loads(r.stdout)
    assert rep["host"]["gpus"] == [] and rep["profile"] == "cpu" and rep["ok"]


@needs_cpu_venv
def test_a_crashing_failing_or_hanging_import_is_a_problem_not_a_traceback(tmp_path):
    fakes = tmp_path / "fakes"
    for name, body in {"mxnet": "import os\nos.abort()\n",
                       "jax": "raise ImportError('simulated: libcudart.so.12: cannot open')\n",
                       "paddle": "import time\ntime.sleep(600)\n"}.items():
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(body)
    # the hanging import is waited for this long; the real torch probe beside it takes ~2-6 s
    r = run_doctor(tmp_path, FAILS, "--json", "--timeout", "15",
                   env={"PYTHONPATH": str(fakes)})
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    by_fw = {p["framework"]: p["problem"] for p in rep["problems"]}
    assert set(by_fw) == set(FRAMEWORKS) - {"torch"}           # torch, the real one, is fine
    assert "crashed" in by_fw["mxnet"] and "SIGABRT" in by_fw["mxnet"]
    assert "ImportError: simulated: libcudart.so.12" in by_fw["jax"]
    assert "did not finish within 15 s" in by_fw["paddle"]
    assert rep["frameworks"]["torch"]["status"] == "ok"


def test_require_makes_a_missing_framework_a_problem(monkeypatch):
    monkeypatch.setattr(doctor, "installed", lambda fw: (False, None, None))
    monkeypatch.setattr(doctor, "nvidia_gpus", lambda: [])
    rep = doctor.diagnose(["mxnet", "paddle"], require={"paddle"})
    assert rep["frameworks"]["mxnet"]["status"] == "not installed"
    assert [p["framework"] for p in rep["problems"]] == ["paddle"]
    assert "not installed" in rep["problems"][0]["problem"] and not rep["ok"]
    rep = doctor.diagnose(["mxnet"])
    assert rep["ok"] and "not installed" in doctor.render(rep)


def test_doctor_cli_rejects_unknown_frameworks(capsys):
    from d2lmini.__main__ import main
    assert main(["doctor", "-f", "tensorflow"]) == 2
    assert "unknown framework 'tensorflow'" in capsys.readouterr().err


@needs_cpu_venv
def test_a_gpu_build_missing_a_system_library_gets_a_library_fix(tmp_path):
    fakes = tmp_path / "fakes"
    (fakes / "mxnet").mkdir(parents=True)
    (fakes / "mxnet" / "__init__.py").write_text(
        "raise OSError('libcudnn.so.8: cannot open shared object file: No such file or directory')\n")
    fake_dist(fakes, "mxnet-cu112", "1.9.1")
    r = run_doctor(tmp_path, FAILS, "--json", "-f", "mxnet", env={"PYTHONPATH": str(fakes)})
    assert r.returncode == 1
    (p,) = json.loads(r.stdout)["problems"]
    assert "OSError: libcudnn.so.8" in p["problem"]
    assert "libcudnn.so.8 is not on the library path" in p["fix"] and "mxnet-cu112" in p["fix"]


def test_old_driver_without_compute_cap_falls_back_to_the_gpu_list(tmp_path, monkeypatch):
    """A driver whose nvidia-smi rejects the compute_cap query still counts as a GPU host."""
    fake_nvidia_smi(tmp_path, 'if [ "$1" = "-L" ]; then\n'
                    '  echo "GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-1234)"\n'
                    '  echo "GPU 1: Tesla V100-SXM2-16GB (UUID: GPU-5678)"\n'
                    'else echo "Field compute_cap is not a valid field to query." >&2; exit 2; fi')
    from d2lmini import hardware
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hardware.nvidia_gpus.cache_clear()
    try:
        gpus = hardware.nvidia_gpus()
        assert [(g.index, g.name, g.compute_capability) for g in gpus] == [
            (0, "Tesla V100-SXM2-16GB", (0, 0)), (1, "Tesla V100-SXM2-16GB", (0, 0))]
        ok, why = hardware.mxnet_gpu_support((0, 0))
        assert ok and "unknown" in why
    finally:
        hardware.nvidia_gpus.cache_clear()
