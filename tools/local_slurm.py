"""A real two-node Slurm cluster on this one machine, for trying the book's sbatch scripts.

Debian's ``slurm-wlm`` (22.05) and ``munge`` (``make slurm`` installs them as root).  Everything
is private to one directory: a munge daemon with its own key and socket, a ``slurm.conf`` whose
two nodes ``n1`` and ``n2`` are this host (``NodeAddr=127.0.0.1``, a port each), one
``slurmctld`` and one ``slurmd -N n1`` / ``-N n2``, all on ports free at start::

    with LocalSlurm() as cluster:                      # up in a few seconds
        job = cluster.sbatch(["torch.sbatch", "multinode_torch.py", "--out", "res"], cwd=...)
        print(job.state, job.exit_code, job.output)

    python -m tools.local_slurm up      # prints `export SLURM_CONF=...`; `down` stops it

Every client command (``sbatch``, ``srun``, ``scontrol``...) finds the cluster through
``SLURM_CONF``; ``stop()`` shuts the daemons down and kills whatever of theirs is left, so
nothing keeps running.  Slurm runs jobs as root here: it is a test bed, not a cluster.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
NODES = ("n1", "n2")
CPUS_PER_NODE = 8


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why and what to do."""


def missing() -> str | None:
    """Why a local Slurm cannot start here, or None."""
    absent = [d for d in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol")
              if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if absent:
        return (f"{', '.join(absent)} not found: install Debian's slurm-wlm and munge "
                "(make slurm, as root)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs (run the tests as root)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Job:
    """A finished (or timed-out) batch job: ``state`` as ``scontrol`` gives it (COMPLETED,
    FAILED, CANCELLED, ...), ``exit_code`` of the batch script, ``output`` its output file."""
    job_id: int
    state: str
    exit_code: int
    output: str
    seconds: float
    returncode: int             # sbatch --wait's own exit status


class LocalSlurm:
    """Start with :meth:`start` (or ``with``); :meth:`stop` leaves nothing running."""

    def __init__(self, directory: str | None = None, cpus_per_node: int = CPUS_PER_NODE):
        self.dir = Path(directory or tempfile.mkdtemp(prefix="slurm-"))
        self.cpus = cpus_per_node
        self.conf = self.dir / "slurm.conf"
        self.procs: dict[str, int] = {}

    # ------------------------------------------------------------------ up and down
    def env(self, extra: dict | None = None) -> dict:
        """The environment for client commands (and jobs: sbatch exports it); ``extra``
        adds variables, or removes those it maps to None."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for k, v in (extra or {}).items():       # None: leave the variable out
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env

    def _write_config(self) -> None:
        d = self.dir
        for sub in ("state", "log", "munge", "spool"):       # a fresh cluster every time
            shutil.rmtree(d / sub, ignore_errors=True)
        for sub in ("state", "log", "munge", *(f"spool/{n}" for n in NODES)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        ctld, *node_ports = _free_ports(1 + len(NODES))
        self.ctld_port = ctld
        host = socket.gethostname().split(".")[0]
        # A private munge: its own key, socket and files (munged checks their permissions).
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(d / "munge", 0o700)
        os.chmod(key, 0o400)
        self.munge_socket = d / "munge" / "munge.socket"
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} "
            f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN" for n, p in zip(NODES, node_ports))
        self.conf.write_text(f"""\
ClusterName=book{os.getpid()}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=4
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
{nodes}
PartitionName=book Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def start(self, timeout: float = 60) -> "LocalSlurm":
        why = missing()
        if why:
            raise SlurmUnavailable(why)
        self._write_config()
        d = self.dir
        munge = subprocess.run(
            [_exe("munged"), "--force", f"--socket={self.munge_socket}",
             f"--key-file={d / 'munge' / 'munge.key'}", f"--pid-file={d / 'munge' / 'munged.pid'}",
             f"--log-file={d / 'munge' / 'munged.log'}", f"--seed-file={d / 'munge' / 'seed'}"],
            capture_output=True, text=True, timeout=30)
        if munge.returncode:
            self.stop()
            raise SlurmUnavailable(f"munged did not start: {munge.stderr.strip()}")
        self.procs["munged"] = self._read_pid(d / "munge" / "munged.pid", "munged")
        env = self.env()
        for name, cmd, pidfile in [
                ("slurmctld", [_exe("slurmctld"), "-f", str(self.conf)], d / "slurmctld.pid"),
                *[(f"slurmd-{n}", [_exe("slurmd"), "-f", str(self.conf), "-N", n],
                   d / f"slurmd-{n}.pid") for n in NODES]]:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
            if r.returncode:
                self.stop()
                raise SlurmUnavailable(f"{name} did not start: {r.stderr.strip()}\n"
                                       f"{self.logs()}")
            self.procs[name] = self._read_pid(pidfile, name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                return self
            time.sleep(0.5)
        self.stop()
        raise SlurmUnavailable(f"the nodes did not come up within {timeout:.0f} s "
                               f"(sinfo: {r.stdout.strip()!r})\n{self.logs()}")

    def _read_pid(self, path: Path, name: str, timeout: float = 10) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return int(path.read_text().split()[0])
            except (FileNotFoundError, ValueError, IndexError):
                time.sleep(0.1)
        self.stop()
        raise SlurmUnavailable(f"{name} wrote no pid file {path}\n{self.logs()}")

    def logs(self, lines: int = 20) -> str:
        out = []
        for p in sorted((self.dir / "log").glob("*.log")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job, shut the daemons down, kill what is left of them and their jobs."""
        if self.conf.exists() and "slurmctld" in self.procs:
            self.run(["scancel", "--full", "--quiet", "--user", "root"], check=False, timeout=10)
            self.run(["scontrol", "shutdown"], check=False, timeout=10)
        slurm = [p for n, p in self.procs.items() if p and n != "munged"]
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in slurm) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in [*slurm, self.procs.get("munged")]:
            if pid:
                _kill(pid)
        # slurmstepd and the jobs' processes: whatever still runs from this cluster's spool
        deadline = time.monotonic() + 10
        while (left := self.leftovers()) and time.monotonic() < deadline:
            for pid in left:
                _kill(pid)
            time.sleep(0.1)
        self.procs.clear()

    def leftovers(self) -> list[int]:
        """Processes still running that belong to this cluster: the daemons it started, and
        every process with this cluster's SLURM_CONF in its environment that is a Slurm daemon
        or part of a job (SLURM_JOB_ID set) -- never a shell that merely exported SLURM_CONF."""
        conf, found = f"SLURM_CONF={self.conf}\0".encode(), set()
        mine = _ancestors(os.getpid())
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) in mine:
                continue
            try:
                env = (p / "environ").read_bytes()
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if conf in env and (b"\0SLURM_JOB_ID=" in env or env.startswith(b"SLURM_JOB_ID=")
                                or comm in ("slurmstepd", "slurmd", "slurmctld")):
                found.add(int(p.name))
        found |= {pid for pid in self.procs.values() if pid}
        return sorted(pid for pid in found if _alive(pid) and pid not in mine)

    def job_processes(self, job_id: int) -> list[int]:
        """The running processes of one job of this cluster (by SLURM_JOB_ID in their
        environment): its batch script, srun, and every rank."""
        mark, conf, found = f"SLURM_JOB_ID={job_id}\0".encode(), f"SLURM_CONF={self.conf}".encode(), []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    env = (p / "environ").read_bytes()
                except OSError:
                    continue
                if mark in env and conf in env and _alive(int(p.name)):
                    found.append(int(p.name))
        return found

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ jobs
    def run(self, cmd: list[str], check: bool = True, timeout: float = 30,
            env: dict | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, env=self.env(env), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def job_info(self, job_id: int) -> dict:
        r = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def sbatch(self, args: list[str], cwd: str, env: dict | None = None,
               timeout: float = 120, output: str = "slurm-%j.out") -> Job:
        """``sbatch --wait ARGS`` in ``cwd``; a job still running after ``timeout`` s is
        cancelled and reported as such (state TIMEOUT-BY-TEST), never waited on forever."""
        return self.sbatch_start(args, cwd, env, output).result(timeout)

    def sbatch_start(self, args: list[str], cwd: str, env: dict | None = None,
                     output: str = "slurm-%j.out") -> "Pending":
        """Start ``sbatch --wait ARGS`` and return at once: ``.job_id`` as soon as the job
        is submitted, ``.result(timeout)`` the finished :class:`Job`."""
        proc = subprocess.Popen(["sbatch", "--wait", "--parsable", f"--chdir={cwd}",
                                 f"--output={output}", *args],
                                env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        return Pending(self, proc, args, cwd, output)

    def final_info(self, job_id: int, timeout: float = 15) -> dict:
        """``scontrol show job`` once the job has reached a final state (it takes a moment
        after sbatch --wait returns or scancel is sent)."""
        deadline = time.monotonic() + timeout
        info = self.job_info(job_id)
        while info.get("JobState") not in FINAL and time.monotonic() < deadline:
            time.sleep(0.2)
            info = self.job_info(job_id)
        return info


class Pending:
    """A running ``sbatch --wait`` (see :meth:`LocalSlurm.sbatch_start`).  A thread reads
    the job's final state as soon as sbatch returns, before slurmctld forgets the job."""

    def __init__(self, cluster, proc, args, cwd, output):
        import threading
        self.cluster, self.proc, self.args, self.cwd, self.output = cluster, proc, args, cwd, output
        self.t0 = time.monotonic()
        line = proc.stdout.readline()           # --parsable prints the id when submitted
        m = re.match(r"(\d+)", line)
        if not m:
            proc.kill()
            raise RuntimeError(f"sbatch {' '.join(args)} submitted nothing: "
                               f"{proc.communicate()[1].strip()}")
        self.job_id = int(m.group(1))
        self.info: dict = {}
        self.ended: float | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        self.proc.communicate()
        self.ended = time.monotonic()
        self.info = self.cluster.final_info(self.job_id)

    def result(self, timeout: float) -> Job:
        self.thread.join(max(1.0, timeout - (time.monotonic() - self.t0)))
        timed_out = self.thread.is_alive()
        if timed_out:
            self.cluster.run(["scancel", str(self.job_id)], check=False)
            self.proc.kill()
            self.thread.join(30)
        info = self.info or {}
        path = Path(self.cwd) / self.output.replace("%j", str(self.job_id))
        text = path.read_text(errors="replace") if path.exists() else ""
        state = "TIMEOUT-BY-TEST" if timed_out else info.get("JobState", "?")
        code = int(info.get("ExitCode", "-1:0").split(":")[0])
        end = self.ended or time.monotonic()
        return Job(self.job_id, state, code, text, end - self.t0, self.proc.returncode)


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                    # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _ancestors(pid: int) -> set[int]:
    """``pid`` and the processes above it (never to be killed by :meth:`LocalSlurm.stop`)."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--dir", default="/tmp/book-slurm", help="the cluster's private directory")
    a = p.parse_args(argv)
    cluster = LocalSlurm(a.dir)
    if a.action == "up":
        try:
            cluster.start()
        except SlurmUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={cluster.conf}   # then sbatch/srun/sinfo; "
              f"`python -m tools.local_slurm down --dir {a.dir}` stops it")
        return 0
    for name, pidfile in [("slurmctld", cluster.dir / "slurmctld.pid"),
                          *[(f"slurmd-{n}", cluster.dir / f"slurmd-{n}.pid") for n in NODES],
                          ("munged", cluster.dir / "munge" / "munged.pid")]:
        try:
            cluster.procs[name] = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
