"""Launching multi-process training from a notebook or a test, without ever hanging.

Framework-neutral: builds no framework object, only runs processes.  Used for
``torchrun`` / ``python -m torch.distributed.run``, ``python -m paddle.distributed.launch``
and plain scripts that call ``torch.multiprocessing.spawn`` / ``paddle.distributed.spawn``.

* :func:`free_port` picks a rendezvous port that is free right now (never a fixed one that
  another job may hold).
* :func:`run` starts the launcher in its own process group, streams nothing to the notebook
  but keeps the whole log, and on a timeout kills the *group* (launcher and every rank).
  A non-zero exit raises :class:`LaunchError` carrying the tail of the log, so the failing
  rank's traceback is shown where the reader ran the cell.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LaunchError", "LaunchResult", "free_port", "run", "run_all", "read_rank_results",
           "python", "maybe_fail", "failing",
           "default_timeout", "training_processes"]


def python() -> str:
    """The interpreter of the running kernel (so launched ranks use the same environment)."""
    return sys.executable


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LaunchError(RuntimeError):
    """The launched job failed or timed out; ``.log`` holds its full output."""

    def __init__(self, message: str, log: str, returncode: int | None):
        super().__init__(message)
        self.log, self.returncode = log, returncode


@dataclass
class LaunchResult:
    returncode: int
    log: str
    seconds: float


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run(cmd: list[str], timeout: float | None = None, env: dict | None = None,
        cwd: str | None = None, echo: bool = False) -> LaunchResult:
    """Run ``cmd`` (a launcher and its ranks) to completion or kill it after ``timeout`` s
    (None: :func:`default_timeout`, a last resort sized to the settings in force).

    ``env`` is added to the current environment.  Raises :class:`LaunchError` on a non-zero
    exit or a timeout, with the last lines of the combined output in the message.
    """
    import time
    timeout = default_timeout() if timeout is None else timeout
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        raise LaunchError(
            f"{' '.join(cmd[:4])} ... did not finish within {timeout:.0f} s and was killed "
            f"with all its processes (a rank stuck in a collective?). Last output:\n"
            f"{_tail(out or '')}", out or "", None) from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    seconds = time.perf_counter() - t0
    if echo:
        print(out, end="")
    if proc.returncode != 0:
        raise LaunchError(
            f"{' '.join(cmd[:4])} ... failed with exit code {proc.returncode} after "
            f"{seconds:.1f} s. Last output:\n{_tail(out)}", out, proc.returncode)
    return LaunchResult(proc.returncode, out, seconds)


def run_all(cmds: list[list[str]], timeout: float | None = None, envs: list[dict] | None = None,
            cwd: str | None = None) -> list[LaunchResult]:
    """Run several commands at once -- e.g. one launcher per "node" -- and wait for all.

    Fail fast: as soon as one exits non-zero, the others are killed (a peer waiting for it
    in a rendezvous or collective would otherwise wait for its own timeout), and
    :class:`LaunchError` reports which command failed with the tail of its output.  On the
    overall ``timeout`` (None: :func:`default_timeout`) every process group is killed.
    """
    import tempfile
    import time
    timeout = default_timeout() if timeout is None else timeout
    envs = envs or [{}] * len(cmds)
    logs = [tempfile.TemporaryFile(mode="w+") for _ in cmds]
    procs = []
    t0 = time.perf_counter()
    try:
        for cmd, env, log in zip(cmds, envs, logs):
            full_env = dict(os.environ)
            full_env.update({k: str(v) for k, v in env.items()})
            full_env.setdefault("PYTHONUNBUFFERED", "1")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                          env=full_env, cwd=cwd, start_new_session=True))
        failed = None
        while True:
            codes = [p.poll() for p in procs]
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            if time.perf_counter() - t0 > timeout:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    seconds = time.perf_counter() - t0
    if failed is not None:
        raise LaunchError(
            f"command {failed} ({' '.join(cmds[failed][:4])} ...) failed with exit code "
            f"{procs[failed].returncode} after {seconds:.1f} s; the others were stopped. "
            f"Its last output:\n{_tail(outs[failed])}", "\n".join(outs), procs[failed].returncode)
    if any(p.returncode != 0 for p in procs):
        raise LaunchError(f"{len(cmds)} commands did not all finish within {timeout:.0f} s and "
                          f"were killed. Last output of the first:\n{_tail(outs[0])}",
                          "\n".join(outs), None)
    return [LaunchResult(p.returncode, o, seconds) for p, o in zip(procs, outs)]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_rank_results(directory, world_size: int, pattern: str = "rank{rank}.json") -> list[dict]:
    """Load the JSON file each rank wrote; a clear error names the ranks that wrote none."""
    d = Path(directory)
    paths = [d / pattern.format(rank=r) for r in range(world_size)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"these ranks wrote no result: {', '.join(missing)}")
    return [json.loads(p.read_text()) for p in paths]


# ------------------------------------------------------------------ fault injection (tests)
def maybe_fail(rank: int, step: int) -> None:
    """Fault injection for the fault tests, driven by the environment:
    ``D2LMINI_FAIL_RANK=r`` and ``D2LMINI_FAIL_STEP=s`` (default 0) make rank r raise at its
    step s, or stop responding there with ``D2LMINI_FAIL_MODE=hang``."""
    if os.environ.get("D2LMINI_FAIL_RANK") != str(rank) or \
            step != int(os.environ.get("D2LMINI_FAIL_STEP", "0")):
        return
    if os.environ.get("D2LMINI_FAIL_MODE", "raise") == "hang":
        import time
        print(f"rank {rank} hangs at step {step} (D2LMINI_FAIL_MODE=hang)", flush=True)
        time.sleep(24 * 3600)
    raise RuntimeError(f"injected failure on rank {rank} at step {step} "
                       f"(D2LMINI_FAIL_RANK={rank}: rank {rank} fails on purpose)")


def failing(train_step, rank):
    """``train_step`` that first calls :func:`maybe_fail` with ``rank()`` and its own count
    of steps: how a ``*_checks.py`` script injects faults into a lesson's script without a
    line of test code in it."""
    steps = [0]

    def step(*args, **kwargs):
        maybe_fail(rank(), steps[0])
        steps[0] += 1
        return train_step(*args, **kwargs)
    return step


def install_fault_injection(lesson, rank) -> None:
    """In a ``*_checks.py`` script, at import (ranks started by spawn re-import it): with
    ``D2LMINI_FAIL_RANK`` set, wrap the lesson module's ``train_step`` with :func:`failing`."""
    if "D2LMINI_FAIL_RANK" in os.environ:
        lesson.train_step = failing(lesson.train_step, rank)


def checks_main(lesson, proof, description: str, proof_help: str, argv=None) -> None:
    """The ``main`` of a ``*_checks.py`` script: the lesson's command line plus ``--proof``;
    with it the ranks run ``proof(args)`` instead of training, without it they train exactly
    as the lesson does (with any injected fault)."""
    import argparse
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--proof", default=None, help=proof_help)
    args = lesson.parse_args(argv, parser)
    lesson.main(args=args, work=proof if args.proof else None)


# --------------------------------------------------------------------------------------------
# What a lesson's launches default to (the settings in force are read here, out of the page)
# --------------------------------------------------------------------------------------------

def default_timeout() -> float:
    """Seconds after which :func:`run` (and ``run_all``) kill a launched job when the caller
    gives no ``timeout``: a last resort against a rank stuck outside any collective, sized to
    the settings in force (10 min for the quick test settings, 30 min for the CPU's, 2 h for
    the GPU's); the collectives' own timeouts end a job with a failed rank much sooner."""
    from .config import get_profile
    return {"smoke": 600.0, "cpu": 1800.0}.get(get_profile().name, 7200.0)


def training_processes(k: int, divides=()) -> int:
    """How many processes a lesson's launched training runs use on ``k`` devices: ``k``, at
    least 2 (a lesson compares k >= 2 devices with one).  2 when a global batch in
    ``divides`` is not a multiple of that count, and always 2 under the quick test settings
    (their runs only exercise the code; with k = 8 they would take 8 processes' start-up)."""
    from .config import get_profile
    n = max(int(k), 2)
    if get_profile().name == "smoke" or any(int(b) % n for b in divides):
        return 2
    return n
