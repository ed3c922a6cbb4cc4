"""What the concise chapter's recipe scripts share, written once (chapters/concise/recipe/).

Each framework has two scripts, ``<fw>_one.py`` (one device) and ``<fw>_dp.py`` (k devices),
and the notebook shows the diff between them: only the lines that data parallelism changes.
Everything that is the same in all eight -- the command line, the data, the training printout
and the results file -- lives here, so the scripts hold only the framework's own code.  (A
script copied alone, without d2lmini, stands in for these with a few lines at its end.)

    args = recipe.parse_args()                # --epochs --batch-size --lr --width --data --out
    data = recipe.load_data(args)             # Fashion-MNIST subset, NumPy arrays
    recipe.report(args, epoch, loss, test_acc, devices=k)   # the printout (+ results file)
"""
from __future__ import annotations

import argparse
import json
import os

from .config import get_profile
from .data import load_fashion_mnist


def parse_args(argv=None, knobs: tuple | None = None,
               default_knobs: tuple | None = None) -> argparse.Namespace:
    """The recipes' command line; defaults come from the profile's concise settings.

    ``knobs``: the fast-path recipes' settings (``recipe/<fw>_fast.py``): ``--knobs a,b``
    chooses among them (default ``default_knobs``, else all of them), ``args.knobs`` is the
    tuple chosen, and an unknown knob is an error that lists the known ones."""
    hp = get_profile().concise
    p = argparse.ArgumentParser(description="The concise chapter's recipe: ResNet-18 on "
                                "Fashion-MNIST, plain SGD, the same initial weights everywhere.")
    p.add_argument("--epochs", type=int, default=hp.epochs)
    p.add_argument("--batch-size", type=int, default=hp.batch_size,
                   help="the GLOBAL batch size (split over the devices)")
    p.add_argument("--lr", type=float, default=hp.lr)
    p.add_argument("--width", type=int, default=hp.width, help="channels of the first stage")
    p.add_argument("--train-samples", type=int, default=hp.train_samples)
    p.add_argument("--test-samples", type=int, default=hp.test_samples)
    p.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    p.add_argument("--data", default=None, help="the directory of the four Fashion-MNIST "
                   "files (default: $D2LMINI_DATA, else d2lmini's search, see d2lmini.data)")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    if knobs is not None:
        chosen = knobs if default_knobs is None else default_knobs
        p.add_argument("--knobs", default=",".join(chosen),
                       help=f"comma-separated, from: {', '.join(knobs)}")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.epochs < 1:
        p.error("--batch-size and --epochs must be >= 1")
    if knobs is not None:
        args.knobs = tuple(k for k in args.knobs.split(",") if k)
        unknown = sorted(set(args.knobs) - set(knobs))
        if unknown:
            p.error(f"unknown knobs {unknown}; choose from {', '.join(knobs)}")
    return args


def load_data(args):
    """The training and test images of ``args`` (NumPy, NCHW float32 in [0, 1]); ``--data``
    names their directory (the copied scripts take the same option)."""
    return load_fashion_mnist(args.train_samples, args.test_samples,
                              data_dir=getattr(args, "data", None))


def report(args, epoch: int, loss: float, test_acc: float, devices: int,
           framework: str, seconds: float | None = None) -> None:
    """Print the training printout of one epoch; after the last, write ``args.out``.

    Call it from one process only (rank 0).  The printout is the same in every framework::

        epoch 1: loss 1.234, test accuracy 0.567 (2 devices, 3.4 s)
    """
    t = f", {seconds:.1f} s" if seconds is not None else ""
    print(f"epoch {epoch + 1}: loss {loss:.3f}, test accuracy {test_acc:.3f} "
          f"({devices} device{'s' if devices != 1 else ''}{t})", flush=True)
    if args.out is None:
        return
    state = {"framework": framework, "devices": devices, "epochs": args.epochs,
             "batch_size": args.batch_size, "lr": args.lr, "width": args.width,
             "loss": [], "test_acc": [], "seconds": []}
    if epoch > 0 and os.path.exists(args.out):
        with open(args.out) as f:
            state = json.load(f)
    state["loss"].append(float(loss))
    state["test_acc"].append(float(test_acc))
    state["seconds"].append(seconds)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, args.out)


def report_run(run: dict, framework: str, profile=None, results_file: str = "results.json") -> None:
    """Print the one-line summary of a training run -- the same line in every concise
    notebook -- and, except under the ``smoke`` profile, record it in ``results_file``.

    ``profile``: the settings' name, or the ``concise`` section the run used (its settings'
    name is looked up), or None: the settings in force.

    ``run`` holds ``api, devices, batch_size, lr, epochs, test_acc, s_per_epoch,
    samples_per_s``::

        DDP/torchrun: 2 devices, batch 128, lr 0.05, 2 epochs: test accuracy 0.820, 11.5 s/epoch, 523 samples/s
    """
    profile = _settings_name(profile)
    d, e = run["devices"], run["epochs"]
    print(f"{run['api']}: {d} device{'s' if d != 1 else ''}, batch {run['batch_size']}, "
          f"lr {run['lr']:g}, {e} epoch{'s' if e != 1 else ''}: test accuracy "
          f"{run['test_acc']:.3f}, {run['s_per_epoch']:.1f} s/epoch, "
          f"{run['samples_per_s']:.0f} samples/s", flush=True)
    if profile != "smoke":
        from .results import record_result
        record_result(results_file, chapter="concise", framework=framework, api=run["api"],
                      devices=d, profile=profile, batch_size=run["batch_size"],
                      s_per_epoch=run["s_per_epoch"], samples_per_s=run["samples_per_s"],
                      test_acc=run["test_acc"], epochs=e, lr=run["lr"])


def accepted_knobs(check_knobs, knobs, device) -> tuple:
    """The knobs a fast recipe's ``check_knobs(knobs, device)`` accepts on `device`, one by
    one (it raises RuntimeError for a knob that cannot run, or does not pay, there): the
    recipe's default ``--knobs``."""
    def accepted(knob):
        try:
            check_knobs((knob,), device)
        except RuntimeError:
            return False
        return True
    return tuple(k for k in knobs if accepted(k))


def _settings_name(profile) -> str:
    """The name of the settings ``profile`` stands for: a name, a ``concise`` section (the
    first settings that hold it, those in force first), or None (those in force)."""
    from .config import PROFILES, get_profile
    if profile is None or isinstance(profile, str):
        return profile or get_profile().name
    current = get_profile()
    for p in (current, *PROFILES.values()):
        if p.concise == profile:
            return p.name
    return current.name


def size_args(hp, sep: str = "-", epochs: int | None = None) -> list[str]:
    """The command-line options that give a training script the sizes of the concise
    settings ``hp`` (``d2lmini.settings("concise")``): ``--epochs``, ``--width`` and, where the
    settings take a subset of Fashion-MNIST, ``--train-samples`` and ``--test-samples``
    (``sep="_"``: Paddle's scripts spell them ``--train_samples``).  The batch size and the
    learning rate stay with the caller: they are what a lesson's runs vary (``epochs``: fewer
    epochs than the settings')."""
    args = ["--epochs", str(epochs or hp.epochs), "--width", str(hp.width)]
    for name in ("train_samples", "test_samples"):
        value = getattr(hp, name)
        if value:
            args += ["--" + name.replace("_", sep), str(value)]
    return args


def optional_runs() -> bool:
    """Whether a concise notebook makes its optional training runs (the larger batch; JAX's
    ``shard_map`` and ``pmap`` runs): always, except under the quick test settings, whose runs
    only exercise code that the other runs exercise already."""
    from .config import get_profile
    return get_profile().name != "smoke"
