"""Framework-neutral helpers: Accumulator, Timer, and the arithmetic of splitting a batch."""
from __future__ import annotations

import time

import numpy as np

__all__ = ["Accumulator", "Timer", "shard_slices", "check_device_count", "predictions_agree",
           "TIE_MARGIN"]

# Two runs of the same model on different hardware (a GPU and the CPU, or two kernel choices)
# agree to float32 rounding, about 1e-6 relative per layer; after a deep network a few 1e-5.
# A prediction whose top two logits are closer than this may legitimately flip.
TIE_MARGIN = 1e-3


class Accumulator:
    """Sums ``n`` running totals (e.g. correct predictions and number of predictions)."""

    def __init__(self, n: int):
        self.data = [0.0] * n

    def add(self, *args) -> None:
        if len(args) != len(self.data):
            raise ValueError(f"Accumulator holds {len(self.data)} totals, got {len(args)} values")
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self) -> None:
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]


class Timer:
    """Records the durations of several runs (``start``/``stop`` pairs)."""

    def __init__(self):
        self.times: list[float] = []
        self._tik: float | None = None

    def start(self) -> None:
        self._tik = time.perf_counter()

    def stop(self) -> float:
        if self._tik is None:
            raise RuntimeError("Timer.stop() called before Timer.start()")
        self.times.append(time.perf_counter() - self._tik)
        self._tik = None
        return self.times[-1]

    def avg(self) -> float:
        return sum(self.times) / len(self.times) if self.times else 0.0

    def sum(self) -> float:
        return sum(self.times)

    def cumsum(self) -> list[float]:
        return np.array(self.times).cumsum().tolist()


def shard_slices(n: int, k: int) -> list[slice]:
    """Slices that cut ``n`` samples into ``k`` contiguous shards, as even as possible.

    An uneven ``n`` (the last batch of an epoch) gives shards whose sizes differ by one: the
    first ``n % k`` shards get one sample more.  Gradients stay exact when every device sums
    (does not average) its loss and the update divides by the *global* batch size ``n``: the
    sum of the shards' gradients is then the gradient of the whole batch.

    Raises ``ValueError`` when a device would get no sample at all.
    """
    if k < 1:
        raise ValueError(f"need at least one device, got {k}")
    if n < k:
        raise ValueError(
            f"cannot split a batch of {n} sample(s) across {k} devices: every device needs "
            f"at least one sample. Use a batch size >= {k}, fewer devices, or drop the last "
            f"batch (BatchIterator(..., drop_last=True)).")
    base, extra = divmod(n, k)
    bounds = np.cumsum([0] + [base + (i < extra) for i in range(k)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def check_device_count(requested: int, available: list, how_to_get_more: str) -> list:
    """The first ``requested`` devices of ``available``, or a ValueError saying what to do."""
    if requested < 1:
        raise ValueError(f"asked for {requested} devices; ask for at least one")
    if requested > len(available):
        raise ValueError(
            f"asked for {requested} devices but only {len(available)} exist "
            f"({', '.join(map(str, available))}). {how_to_get_more}")
    return list(available[:requested])


def train_summary(test_acc: float, s_per_epoch: float, devices, batch_size: int,
                  lr: float) -> str:
    """The last line of a from-scratch training run, the same in every framework::

        test acc 0.814, 24.0 s/epoch on 1 device(s) [cpu(0)], batch 256, lr 0.3

    ``devices`` is printed as given (a list of the framework's devices, or their names).
    """
    return (f"test acc {test_acc:.3f}, {s_per_epoch:.1f} s/epoch on {len(devices)} device(s) "
            f"{devices}, batch {batch_size}, lr {lr}")


def evaluate_accuracy_with(split_batch, accuracy, net, data_iter, devices) -> float:
    """The evaluation loop every backend shares: accuracy with each batch split over devices.

    ``net`` is a callable applied to each shard, or a list of callables, one per device.
    A batch smaller than the device count (the last one of a test set) uses only the first
    ``len(batch)`` devices: evaluation has no gradient to keep exact, so nothing is lost.
    """
    nets = list(net) if isinstance(net, (list, tuple)) else [net] * len(devices)
    if len(nets) != len(devices):
        raise ValueError(f"got {len(nets)} networks for {len(devices)} devices")
    metric = Accumulator(2)
    for X, y in data_iter:
        use = min(len(devices), len(y))
        X_shards, y_shards = split_batch(X, y, devices[:use])
        metric.add(sum(accuracy(f(Xs), ys) for f, Xs, ys in zip(nets[:use], X_shards, y_shards)),
                   len(y))
    return metric[0] / metric[1]


def predictions_agree(logits_a, logits_b, margin: float = TIE_MARGIN) -> bool:
    """Whether two sets of logits predict the same classes, except where a prediction is a
    near-tie (its top two logits in ``logits_a`` closer than ``margin``).

    On one machine the book's comparisons are exact; between a GPU and the CPU, or after a
    checkpoint is reloaded on other hardware, the logits differ by float32 rounding and a
    near-tie can flip.  A wrong checkpoint or a broken reload changes the logits by O(1) and
    fails this check.  Raises ``ValueError`` for logits of different shapes.
    """
    a, b = np.asarray(logits_a, np.float64), np.asarray(logits_b, np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"expected two (n, classes) arrays of one shape, got {a.shape} and "
                         f"{b.shape}")
    top2 = np.sort(a, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > margin
    return bool(np.array_equal(a.argmax(1)[clear], b.argmax(1)[clear]))



# The recipe scripts end with a block that only a copy of the file without d2lmini runs (its
# own data loader, model and command line); a diff of two recipes is about what precedes it.
COPY_ALONE_MARKER = "# -- This file copied alone"


def _lines_before_copy_block(text: str) -> list[str]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(COPY_ALONE_MARKER):
            return lines[:i]
    return lines


def unified_diff(old_path, new_path, context: int = 3) -> str:
    """The unified diff from file ``old_path`` to file ``new_path`` (text, no trailing newline),
    each file read up to its copy-alone block (``COPY_ALONE_MARKER``), if it has one."""
    import difflib
    from pathlib import Path
    old, new = Path(old_path), Path(new_path)
    for p in (old, new):
        if not p.is_file():
            raise FileNotFoundError(f"no file {p} (run from the notebook's folder)")
    return "\n".join(difflib.unified_diff(_lines_before_copy_block(old.read_text()),
                                          _lines_before_copy_block(new.read_text()),
                                          fromfile=old.name, tofile=new.name, n=context,
                                          lineterm=""))


def show_diff(old_path, new_path, context: int = 3) -> None:
    """Display :func:`unified_diff` as a highlighted ``diff`` block (plain text outside Jupyter)."""
    text = unified_diff(old_path, new_path, context)

    class _Diff:
        def _repr_markdown_(self):
            return f"```diff\n{text}\n```"

        def __repr__(self):
            return text

    try:
        from IPython.display import display
    except ImportError:
        print(text)
    else:
        display(_Diff())
