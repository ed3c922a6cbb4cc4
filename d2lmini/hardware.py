"""The machine's NVIDIA GPUs and what each framework's GPU build needs -- framework-neutral.

Nothing here imports a deep-learning framework (nor anything outside the standard library),
so that it can answer before a framework is imported, in any environment -- also loaded as a
plain file by ``tools/gpu_env.py``, in a venv that may not hold d2lmini yet.

* :func:`nvidia_gpus` -- the GPUs ``nvidia-smi`` reports, as this process's CUDA would number
  them (``CUDA_VISIBLE_DEVICES`` honoured);
* :func:`mxnet_gpu_support` -- whether MXNet 1.9.1's GPU build has kernels for a compute
  capability (it has none for Hopper and newer);
* :data:`GPU_BUILDS` and :func:`gpu_build_fix` -- how to install each framework's GPU build:
  one venv per framework (``make gpu-venv FW=...``), because their pinned CUDA libraries
  cannot share one environment;
* :func:`gpu_builds_installed` -- which GPU builds an environment holds (the CPU venv must
  hold none: ``make venv`` would replace them);
* :func:`cpu_isa` and :func:`cpu_bf16_gap` -- the CPU's vector instructions as the frameworks'
  kernels may use them (the caps ``ONEDNN_MAX_CPU_ISA`` & co. honoured), and why bfloat16 is
  not worth running on this CPU, if it is not.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import subprocess
from functools import lru_cache
from importlib import metadata

__all__ = ["GpuInfo", "cpu_model", "cpu_isa", "cpu_bf16_gap", "ISA_CAPS", "AVX2_CAPS", "package_versions",
           "FRAMEWORK_PACKAGES", "nvidia_gpus",
           "parse_nvidia_smi", "visible_gpus", "mxnet_gpu_support", "mxnet_unsupported_gpu",
           "MXNET_SASS", "GpuBuild", "GPU_BUILDS", "PADDLE_INDEX", "canonical_framework",
           "gpu_build_fix", "gpu_builds_installed", "pip_commands", "driver_too_old"]

NVIDIA_SMI_QUERY = "index,name,compute_cap,memory.total,driver_version"
NVIDIA_SMI_TIMEOUT = 20.0   # seconds; a hung driver must not hang an import


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as ``nvidia-smi`` reports it (``index`` renumbered as CUDA numbers the
    visible GPUs: from 0, in ``CUDA_VISIBLE_DEVICES`` order)."""
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_mib: int
    driver_version: str

    @property
    def sm(self) -> str:
        """The architecture name CUDA code is built for, e.g. ``sm_90`` for an H100."""
        return "sm_%d%d" % self.compute_capability


def _int_or_none(text: str):
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parse the output of ``nvidia-smi --query-gpu=index,name,compute_cap,memory.total,
    driver_version --format=csv,noheader,nounits``; lines that do not parse are skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        # A name could hold a comma: the other four fields are counted from both ends.
        index, name = _int_or_none(parts[0]), ", ".join(parts[1:-3])
        cc, memory, driver = parts[-3], _int_or_none(parts[-2]), parts[-1]
        m = re.fullmatch(r"(\d+)\.(\d+)", cc)
        if index is None or memory is None or not m or not name or not driver:
            continue
        gpus.append(GpuInfo(index, name, (int(m.group(1)), int(m.group(2))), memory, driver))
    return gpus


def visible_gpus(gpus: list[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """The GPUs a CUDA process sees under ``CUDA_VISIBLE_DEVICES``, renumbered from 0.

    Unset: all.  ``""`` or ``-1``: none.  A comma list of indices: those, in that order; as
    in CUDA, the list ends at the first entry that is not a valid index (negative, unknown,
    repeated).  GPU/MIG UUIDs cannot be matched from these fields: all GPUs are kept.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    raw = cuda_visible_devices.strip()
    if raw in ("", "-1"):
        return []
    entries = [e.strip() for e in raw.split(",")]
    if any(e.upper().startswith(("GPU-", "MIG-")) for e in entries):
        return list(gpus)
    by_index = {g.index: g for g in gpus}
    chosen: list[GpuInfo] = []
    for e in entries:
        i = _int_or_none(e)
        if i is None or i not in by_index or by_index[i] in chosen:
            break
        chosen.append(by_index[i])
    return [dataclasses.replace(g, index=k) for k, g in enumerate(chosen)]


@lru_cache(maxsize=None)
def _query(smi: str | None) -> tuple[GpuInfo, ...]:
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, f"--query-gpu={NVIDIA_SMI_QUERY}",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = parse_nvidia_smi(out.stdout) if out.returncode == 0 else []
    if not gpus:
        # Drivers older than about 510 do not know the compute_cap field and fail the query:
        # fall back to the plain list, with the compute capability unknown (0, 0).
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True,
                                 timeout=NVIDIA_SMI_TIMEOUT)
        except (OSError, subprocess.SubprocessError):
            return ()
        if out.returncode == 0:
            gpus = parse_nvidia_smi_list(out.stdout)
    return tuple(gpus)


def parse_nvidia_smi_list(text: str) -> list[GpuInfo]:
    """Parse ``nvidia-smi -L`` ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)"): the GPUs of
    a driver too old for the query above, compute capability and memory unknown (0)."""
    gpus = []
    for m in re.finditer(r"^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?\s*$", text, re.M):
        gpus.append(GpuInfo(int(m.group(1)), m.group(2).strip(), (0, 0), 0, "unknown"))
    return gpus


def nvidia_gpus() -> list[GpuInfo]:
    """The NVIDIA GPUs this process can use, from ``nvidia-smi`` (no framework imported).

    [] when ``nvidia-smi`` is missing, fails or times out, or when ``CUDA_VISIBLE_DEVICES``
    hides every GPU.  The query runs once per ``nvidia-smi`` path (cached;
    ``nvidia_gpus.cache_clear()`` forgets it); ``CUDA_VISIBLE_DEVICES`` is applied at every call.
    """
    found = _query(shutil.which("nvidia-smi"))
    return visible_gpus(list(found), os.environ.get("CUDA_VISIBLE_DEVICES"))


nvidia_gpus.cache_clear = _query.cache_clear


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` of ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), for results files and reports."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


# The vector instructions that decide which kernels the frameworks run on the CPU, best first:
# (name, /proc/cpuinfo flags it needs).  oneDNN's bfloat16 kernels (PyTorch's, MXNet's,
# Paddle's) need AVX-512 (its "avx512_core": F, BW, VL, DQ), natively with AVX512-BF16 or AMX;
# below AVX-512 MXNet 1.9.1 has none ("could not create a primitive descriptor iterator") and
# PyTorch emulates them, 5-12x slower than float32.
_ISA_LEVELS = (("AMX", {"amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
               ("AVX-512 with BF16", {"avx512_bf16", "avx512f", "avx512bw", "avx512vl",
                                      "avx512dq"}),
               ("AVX-512", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
               ("AVX2", {"avx2", "fma"}),
               ("SSE4.1", {"sse4_1"}))
#: The variables that cap the instructions oneDNN (three spellings over its versions), XLA and
#: PyTorch's own kernels use: a test sets them to take an older CPU's path on a newer one.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKLDNN_MAX_CPU_ISA",
            "ATEN_CPU_CAPABILITY", "XLA_FLAGS")
#: An AVX2-only CPU's path on any newer one (``make test`` runs every notebook so once).
AVX2_CAPS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
             "MKLDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _cap_level(name: str, value: str) -> int | None:
    """The index in _ISA_LEVELS a cap variable allows at most (None: no cap)."""
    if name == "XLA_FLAGS":
        m = re.search(r"--xla_cpu_max_isa=(\S+)", value)
        if not m:
            return None
        value = m.group(1)
    v = value.strip().upper()
    if not v or (v in ("ALL", "DEFAULT") and name != "ATEN_CPU_CAPABILITY"):
        return None
    if "AMX" in v:
        return 0
    if "AVX512" in v:
        return 1 if "BF16" in v else 2
    if v.startswith("AVX2") or v == "AVX":
        return 3
    return 4                                # SSE41, DEFAULT (ATen) and older


def cpu_flags() -> frozenset:
    """The instruction-set flags of ``/proc/cpuinfo`` (empty where there is none)."""
    return frozenset((_cpuinfo("flags") or "").split())


def cpu_isa(flags=None, environ=None) -> tuple[str, str | None]:
    """``(best instructions the kernels may use, the cap that lowered them or None)``, e.g.
    ``("AVX2", "DNNL_MAX_CPU_ISA=AVX2")`` on an AVX-512 CPU capped for a test."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    environ = os.environ if environ is None else environ
    level = next((i for i, (_, need) in enumerate(_ISA_LEVELS) if need <= flags),
                 len(_ISA_LEVELS))
    cap = None
    for name in ISA_CAPS:
        allowed = _cap_level(name, environ.get(name, ""))
        if allowed is not None and allowed > level:
            level = allowed
            cap = (f"{name}={environ[name]}" if name != "XLA_FLAGS" else
                   "XLA_FLAGS " + re.search(r"--xla_cpu_max_isa=\S+", environ[name]).group(0))
    return (_ISA_LEVELS[level][0] if level < len(_ISA_LEVELS) else "older than SSE4.1"), cap


def cpu_bf16_gap(flags=None, environ=None) -> str | None:
    """Why bfloat16 does not pay on this CPU (None: it has AVX-512, oneDNN's bfloat16
    kernels run). Where it returns a reason, the book's fast-path ladders stop before their
    bfloat16 rung: MXNet 1.9.1 cannot run it at all, PyTorch emulates it many times slower
    than float32, and a rung that is only slower teaches nothing the GPU records do not."""
    isa, cap = cpu_isa(flags, environ)
    if isa.startswith(("AMX", "AVX-512")):
        return None
    return (f"bfloat16 needs AVX-512 on the CPU; this one has {isa}"
            + (f" (capped by {cap})" if cap else ""))


#: The distributions whose versions results files and reports record (CPU and GPU builds).
FRAMEWORK_PACKAGES = ("numpy", "torch", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
                      "flax", "optax", "paddlepaddle", "paddlepaddle-gpu", "mxnet", "mxnet-cu112")


def package_versions(*names: str) -> dict:
    """``{distribution: version}`` of those of ``names`` that are installed (default:
    :data:`FRAMEWORK_PACKAGES`), read from the metadata -- nothing is imported."""
    out = {}
    for n in names or FRAMEWORK_PACKAGES:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


# --- MXNet 1.9.1 (mxnet-cu112) on a given GPU ------------------------------------------------

#: The architectures ``libmxnet.so`` of mxnet-cu112 1.9.1 holds SASS for; it holds no PTX, so
#: nothing can be JIT-compiled for a newer architecture.
MXNET_SASS = ((5, 0), (6, 0), (7, 0), (8, 0), (8, 6))

_ARCH = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta/Turing", 8: "Ampere/Ada",
         9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}


def mxnet_gpu_support(cc: tuple[int, int]) -> tuple[bool, str]:
    """Whether MXNet 1.9.1's GPU build (mxnet-cu112) can run on compute capability ``cc``,
    and a sentence saying what happens.

    SASS built for ``sm_XY`` runs on the same major ``X`` with a minor >= ``Y``; there is no
    PTX to compile for anything else.  So 5.x, 6.x, 7.x and 8.x run (8.9, Ada, runs the sm_86
    code); 9.0 (Hopper: H100, H200), 10.x and 12.x (Blackwell) and anything below 5.0 do not.
    """
    major, minor = int(cc[0]), int(cc[1])
    if (major, minor) == (0, 0):      # unknown: nvidia-smi too old to report it
        return True, ("MXNet 1.9.1 (mxnet-cu112): this GPU's compute capability is unknown "
                      "(the NVIDIA driver is too old to report it); MXNet runs on 5.x-8.x only.")
    arch = _ARCH.get(major, "unknown architecture")
    built = [b for b in MXNET_SASS if b[0] == major and b[1] <= minor]
    if built:
        b = max(built)
        return True, (f"MXNet 1.9.1 (mxnet-cu112) runs on compute capability {major}.{minor} "
                      f"({arch}) with its sm_{b[0]}{b[1]} kernels.")
    return False, (
        f"MXNet 1.9.1 (mxnet-cu112, the last release) has no kernels for compute capability "
        f"{major}.{minor} ({arch}): it holds GPU code for sm_50/60/70/80/86 only and no PTX, so "
        f"its first GPU operator fails with \"no kernel image is available for execution on "
        f"the device\". Use MXNet's CPU contexts (mx.cpu(i)), a GPU of compute capability "
        f"5.x-8.x, or another framework for GPU runs.")


def mxnet_unsupported_gpu(gpus: list[GpuInfo] | None = None) -> tuple[GpuInfo, str] | None:
    """The first of ``gpus`` (default: :func:`nvidia_gpus`) that MXNet 1.9.1 has no kernels
    for, with a sentence saying so; None when it can run on all of them."""
    for gpu in nvidia_gpus() if gpus is None else gpus:
        ok, reason = mxnet_gpu_support(gpu.compute_capability)
        if not ok:
            return gpu, f"GPU {gpu.index} ({gpu.name}): {reason}"
    return None


# --- How to install each framework's GPU build ------------------------------------------------

PADDLE_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/cu126/"


@dataclasses.dataclass(frozen=True)
class GpuBuild:
    """One framework's GPU environment: ``make gpu-venv FW=<framework>`` creates ``venv`` and
    runs ``pip install`` with each of ``pip_steps`` in turn (then ``pip install --no-deps -e
    .``) -- the same arguments the Makefile and ``make gpu-check`` use."""
    framework: str
    package: str                  # the GPU build's distribution
    requirements: str             # its requirements file
    pip_steps: tuple[tuple[str, ...], ...]
    needs: str                    # driver / system prerequisites, one sentence
    kernel: str                   # Jupyter kernel name
    display_name: str
    min_driver: int               # oldest NVIDIA driver branch the build runs on

    @property
    def venv(self) -> str:
        return f".venv-gpu-{self.framework}"


GPU_BUILDS: dict[str, GpuBuild] = {
    "torch": GpuBuild(
        "torch", "torch (CUDA 13.0 build from PyPI)", "requirements-gpu-torch.txt",
        (("-r", "requirements-gpu-torch.txt"),),
        "an NVIDIA driver >= 580 and a GPU of compute capability >= 7.5 (CUDA 13)",
        "d2l-gpu-torch", "Python (d2l, PyTorch GPU)", 580),
    "jax": GpuBuild(
        "jax", "jax[cuda12] (jax-cuda12-plugin)", "requirements-gpu-jax.txt",
        (("-r", "requirements-gpu-jax.txt"),),
        "an NVIDIA driver >= 525 and a GPU of compute capability >= 5.2 (CUDA 12)",
        "d2l-gpu-jax", "Python (d2l, JAX GPU)", 525),
    "paddle": GpuBuild(
        "paddle", "paddlepaddle-gpu (cu126, from Paddle's own index)",
        "requirements-gpu-paddle.txt",
        (("-r", "requirements-gpu-paddle.txt", "--extra-index-url", PADDLE_INDEX),),
        "an NVIDIA driver >= 550 (CUDA 12.6) and Paddle's package index",
        "d2l-gpu-paddle", "Python (d2l, PaddlePaddle GPU)", 550),
    "mxnet": GpuBuild(
        "mxnet", "mxnet-cu112", "requirements-gpu-mxnet.txt",
        (("-r", "requirements-common.txt"), ("--no-deps", "-r", "requirements-gpu-mxnet.txt")),
        "a system CUDA 11.2 runtime, cuDNN 8, NCCL 2 and libquadmath0, an NVIDIA driver >= 450 "
        "and a GPU of compute capability 5.0-8.9 (not Hopper or newer)",
        "d2l-gpu-mxnet", "Python (d2l, MXNet GPU)", 450),
}

_ALIASES = {"pytorch": "torch", "paddlepaddle": "paddle", "jaxlib": "jax"}


def canonical_framework(name: str) -> str:
    """``torch``, ``jax``, ``paddle`` or ``mxnet`` for a framework name (``pytorch`` and
    ``paddlepaddle`` accepted); ValueError for anything else."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in GPU_BUILDS:
        raise ValueError(f"unknown framework {name!r}; choose one of {', '.join(GPU_BUILDS)}")
    return key


def pip_commands(framework: str, python: str = "python") -> list[str]:
    """The pip commands that install ``framework``'s GPU build into the environment of
    ``python``, from the repository root."""
    b = GPU_BUILDS[canonical_framework(framework)]
    steps = [*b.pip_steps, ("--no-deps", "-e", ".")]
    return [f"{python} -m pip install " + " ".join(step) for step in steps]


def driver_too_old(framework: str, driver_version: str) -> bool:
    """Whether an NVIDIA driver (``"550.54.15"``) is older than ``framework``'s GPU build needs."""
    m = re.match(r"(\d+)", driver_version or "")
    return bool(m) and int(m.group(1)) < GPU_BUILDS[canonical_framework(framework)].min_driver


def gpu_build_fix(framework: str) -> str:
    """The exact commands that install ``framework``'s GPU build, as one line of text (with a
    warning when this machine's NVIDIA driver is too old for it)."""
    b = GPU_BUILDS[canonical_framework(framework)]
    fix = (f"make gpu-venv FW={b.framework} (a new venv {b.venv} with the Jupyter kernel "
           f"{b.kernel!r}; needs {b.needs}); or, in an existing environment, from the "
           f"repository root: {' && '.join(pip_commands(b.framework))}")
    old = [g.driver_version for g in nvidia_gpus() if driver_too_old(b.framework, g.driver_version)]
    if old:
        fix += (f"; this machine's driver {old[0]} is older than {b.min_driver}: update it first"
                f" (or see {b.requirements} for an alternative)")
    return fix


# --- Which GPU builds an environment holds ----------------------------------------------------

def _torch_cuda(dist) -> str | None:
    """``torch.version.cuda`` of an installed torch, read from its version.py (no import)."""
    try:
        text = dist.locate_file("torch/version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def gpu_builds_installed(path: list[str] | None = None) -> list[str]:
    """The GPU builds of the frameworks installed in ``path`` (default: this interpreter's
    ``sys.path``): paddlepaddle-gpu, mxnet-cu*, jax CUDA/ROCm plugins, a CUDA or ROCm torch.
    Each as ``"name version (why)"``; [] for a CPU-only environment."""
    found = []
    for dist in metadata.distributions(**({"path": path} if path is not None else {})):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        version = dist.version
        if name == "paddlepaddle-gpu" or re.fullmatch(r"mxnet-cu\d+", name):
            found.append(f"{name} {version}")
        elif re.fullmatch(r"jax-(cuda|rocm)\d*-(plugin|pjrt)", name):
            found.append(f"{name} {version}")
        elif name == "jaxlib" and re.search(r"\+(cuda|rocm)", version):
            found.append(f"{name} {version}")
        elif name == "torch":
            cuda = _torch_cuda(dist)
            requires = [r.lower() for r in (dist.requires or [])]
            if re.search(r"\+(cu|rocm)", version):
                found.append(f"torch {version}")
            elif cuda or any(r.startswith(("nvidia-", "cuda-toolkit")) for r in requires):
                found.append(f"torch {version} (CUDA {cuda or 'build'})")
    return sorted(set(found))
