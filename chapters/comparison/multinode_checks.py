"""multinode_torch.py with a fault injected, for the checks of the cluster page: the lesson
trains as it is, and ``D2LMINI_FAIL_RANK=r`` (``D2LMINI_FAIL_STEP``, ``D2LMINI_FAIL_MODE=hang``,
see ``d2lmini.launch.maybe_fail``) makes rank r raise, or stop responding, at that step.
The fault strikes a job's first run only: a run that Slurm restarts
(``SLURM_RESTART_COUNT`` >= 1) trains cleanly.

    sbatch slurm/torch.sbatch multinode_checks.py --out DIR [--checkpoint FILE]
"""
import os

import multinode_torch as lesson
from d2lmini import launch


def rank():
    import torch.distributed as dist
    return dist.get_rank()


if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    launch.install_fault_injection(lesson, rank)

if __name__ == "__main__":
    lesson.main()
