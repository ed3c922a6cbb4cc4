"""d2lmini: the small shared library behind the book's notebooks.

``import d2lmini`` gives the framework-neutral core and imports no deep-learning framework.
Each framework has a thin backend with the same names in each::

    from d2lmini import torch as d2l    # or mxnet, jax, paddle
    devices = d2l.try_all_gpus()         # real GPUs, else simulated CPU devices

Importing a backend prepares its framework first (simulated device count for JAX, NumPy 2
compatibility for MXNet, Paddle's logging side effect undone).
"""
from .config import (PROFILES, DevicePlan, GPUBuildMissing, Profile, get_profile, host_has_gpu,
                     num_simulated_devices, plan_devices, requested_devices, settings,
                     settings_line)
from .data import (BatchIterator, DataError, FashionMNIST, TEXT_LABELS, calibration_batches,
                   find_data_dir,
                   get_fashion_mnist_labels, load_fashion_mnist)
from .utils import (TIE_MARGIN, Accumulator, Timer, check_device_count, evaluate_accuracy_with,
                    predictions_agree, shard_slices, show_diff, train_summary, unified_diff)
from .models import resnet18_init, resnet18_spec

__version__ = "0.1.0"

__all__ = ["Accumulator", "Animator", "BatchIterator", "DataError", "DevicePlan", "FashionMNIST",
           "GPUBuildMissing", "PROFILES", "calibration_batches", "TIE_MARGIN", "plan_devices", "predictions_agree",
           "requested_devices",
           "Profile", "TEXT_LABELS", "Timer", "check_device_count", "find_data_dir",
           "get_fashion_mnist_labels", "get_profile", "host_has_gpu", "load_fashion_mnist",
           "num_simulated_devices", "resnet18_init", "resnet18_spec", "shard_slices",
           "settings", "settings_line", "show_diff", "train_summary", "unified_diff", "evaluate_accuracy_with"]
from .collectives import Transfer, chunk_slices, naive_schedule, ring_schedule, traffic

__all__ += ["Transfer", "chunk_slices", "naive_schedule", "ring_schedule", "traffic"]
from . import results  # noqa: E402,F401  (records START_DIR: where this process started)
from .models import LENET_SHAPES, lenet_init  # noqa: E402

__all__ += ["LENET_SHAPES", "lenet_init"]

#: The chapters' packages: ``import d2lmini`` loads the core only, and ``d2lmini.<name>`` (or
#: ``from d2lmini import <name>``) loads one of these when first used -- a launched rank that
#: needs none of them does not pay for them.
CHAPTER_MODULES = ("commcost", "sharding", "recipe", "steptime", "tables", "scaling", "bench",
                   "launch", "doctor", "hardware", "reference", "gpt")


def __getattr__(name):
    # Animator needs matplotlib (0.3 s to import): loaded when first used, so that the ranks a
    # notebook launches, which never plot, do not pay for it.
    if name == "Animator":
        from .plot import Animator
        return Animator
    if name in CHAPTER_MODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
