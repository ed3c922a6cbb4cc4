"""Fashion-MNIST as NumPy arrays, verified, plus one batch iterator all four frameworks share.

Where the files are looked for, in order:

1. the directory in ``$D2LMINI_DATA`` (if set, it must hold all four files);
2. the user cache, ``$XDG_CACHE_HOME/d2lmini/fashion-mnist`` (``~/.cache/...``);
3. Debian's package ``dataset-fashion-mnist``: ``/usr/share/datasets/fashion-mnist``;
4. otherwise the four files are downloaded from the upstream mirror into the user cache.

Every file is checked before use: the SHA-256 of its *decompressed* bytes (Debian
re-compresses the archives, so the gzip bytes differ from upstream's while the contents do
not), the IDX header, the shape and the label range.  A missing or corrupt file raises
:class:`DataError`, which names the file and says how to fix it.  The verified, decompressed
bytes are kept in ``$XDG_CACHE_HOME/d2lmini/unpacked`` (named by the file's path, size and
modification time) and verified again at every load from there, 7 times faster than
decompressing: every launched rank loads the data.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["DataError", "FashionMNIST", "load_fashion_mnist", "find_data_dir", "BatchIterator",
           "TEXT_LABELS", "get_fashion_mnist_labels"]

UPSTREAM_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

# name -> (file, md5 of upstream's .gz, sha256 of the decompressed IDX bytes, shape)
FILES = {
    "train_images": ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                     "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                     (60000, 28, 28)),
    "train_labels": ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe",
                     "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
                     (60000,)),
    "test_images": ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79",
                    "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                    (10000, 28, 28)),
    "test_labels": ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310",
                    "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
                    (10000,)),
}
FILENAMES = [f[0] for f in FILES.values()]

TEXT_LABELS = ["t-shirt", "trouser", "pullover", "dress", "coat",
               "sandal", "shirt", "sneaker", "bag", "ankle boot"]

HOW_TO_FIX = (
    "To fix it, do one of:\n"
    "  * apt-get install dataset-fashion-mnist   (Debian/Ubuntu; files land in "
    f"{DEBIAN_DIR})\n"
    "  * delete the bad file so that it is downloaded again from " + UPSTREAM_URL + "\n"
    "  * put the four upstream files in a directory and set D2LMINI_DATA to it")


class DataError(RuntimeError):
    """Fashion-MNIST is missing or does not verify."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "d2lmini" / "fashion-mnist"


def get_fashion_mnist_labels(labels) -> list[str]:
    return [TEXT_LABELS[int(i)] for i in labels]


def _missing(directory: Path) -> list[str]:
    return [f for f in FILENAMES if not (directory / f).is_file()]


def _download(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for fname, md5, _, _ in FILES.values():
        target = directory / fname
        if target.is_file():
            continue
        url = UPSTREAM_URL + fname
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                payload = r.read()
        except OSError as e:
            raise DataError(
                f"Fashion-MNIST file {fname} is not on this machine and downloading it from "
                f"{url} failed ({e}).\n{HOW_TO_FIX}") from e
        got = hashlib.md5(payload).hexdigest()
        if got != md5:
            raise DataError(f"downloaded {url} but its MD5 is {got}, expected {md5}; "
                            f"the mirror sent something else.\n{HOW_TO_FIX}")
        with tempfile.NamedTemporaryFile(dir=directory, delete=False) as tmp:
            tmp.write(payload)
        os.replace(tmp.name, target)


def find_data_dir(download: bool = True, data_dir=None) -> Path:
    """The first directory that holds all four files (see the module docstring); ``data_dir``,
    when given, is the only one looked at, as ``$D2LMINI_DATA`` is."""
    explicit = data_dir or os.environ.get("D2LMINI_DATA")
    where = f"D2LMINI_DATA={explicit}" + (" (here from --data)" if data_dir else "")
    if explicit:
        d = Path(explicit)
        missing = _missing(d)
        if missing:
            raise DataError(
                f"{where} but these Fashion-MNIST files are not there: "
                f"{', '.join(missing)}.\nPut the upstream files "
                f"({', '.join(FILENAMES)}) there, or unset D2LMINI_DATA to use the cache, "
                f"Debian's package or a download.")
        return d
    for d in (cache_dir(), DEBIAN_DIR):
        if not _missing(d):
            return d
    if not download:
        raise DataError(f"Fashion-MNIST was not found in {cache_dir()} or {DEBIAN_DIR}.\n"
                        + HOW_TO_FIX)
    _download(cache_dir())
    return cache_dir()


def _unpacked_path(path: Path, sha256: str) -> Path | None:
    """Where the verified, decompressed bytes of ``path`` are kept (the user cache), named by
    the file's path, size and modification time: a file that changes is decompressed and
    verified again."""
    try:
        st = path.stat()
    except OSError:
        return None
    source = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return cache_dir().parent / "unpacked" / f"{sha256[:16]}-{source.hexdigest()[:16]}.idx"


def _read_unpacked(kept: Path | None, sha256: str) -> bytes | None:
    """The decompressed bytes kept at ``kept`` by an earlier load, if they still verify."""
    try:
        raw = kept.read_bytes() if kept else None
    except OSError:
        return None
    return raw if raw is not None and hashlib.sha256(raw).hexdigest() == sha256 else None


def _keep_unpacked(kept: Path | None, raw: bytes) -> None:
    """Keep the verified bytes for the next process (a launched rank, the next notebook):
    reading them back and checking their SHA-256 costs 0.05 s, decompressing 0.35 s.  Best
    effort: a cache that cannot be written changes nothing."""
    if kept is None:
        return
    tmp = None
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=kept.parent, delete=False) as tmp:
            tmp.write(raw)
        os.replace(tmp.name, kept)
    except OSError:
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)


def _read_idx(path: Path, sha256: str, shape: tuple[int, ...]) -> np.ndarray:
    kept = _unpacked_path(path, sha256)
    raw = _read_unpacked(kept, sha256)
    if raw is None:
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path} is not a readable gzip file ({e}).\n{HOW_TO_FIX}") from e
        got = hashlib.sha256(raw).hexdigest()
        if got != sha256:
            raise DataError(
                f"{path} is corrupt: the SHA-256 of its decompressed contents is {got}, "
                f"expected {sha256}.\n{HOW_TO_FIX}")
        _keep_unpacked(kept, raw)
    # IDX header: 2 zero bytes, dtype code 0x08 (uint8), number of dimensions, then sizes.
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if raw[:3] != b"\x00\x00\x08" or dims != shape:
        raise DataError(f"{path}: unexpected IDX header (shape {dims}, expected {shape}).\n"
                        + HOW_TO_FIX)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


@dataclass(frozen=True)
class FashionMNIST:
    """Images as float32 in [0, 1], shape (N, 1, 28, 28) (NCHW); labels as int64 in 0..9."""
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    source: str

    def __repr__(self) -> str:
        return (f"FashionMNIST(train={self.X_train.shape}, test={self.X_test.shape}, "
                f"source={self.source})")


@lru_cache(maxsize=1)
def _load_full(directory: str) -> tuple[np.ndarray, ...]:
    d = Path(directory)
    arrays = {name: _read_idx(d / fname, sha, shape)
              for name, (fname, _, sha, shape) in FILES.items()}
    for split in ("train", "test"):
        labels = arrays[f"{split}_labels"]
        if labels.max() > 9:
            raise DataError(f"{split} labels outside 0..9 in {d}.\n{HOW_TO_FIX}")
    return tuple(arrays[k] for k in ("train_images", "train_labels", "test_images", "test_labels"))


def _subset(X: np.ndarray, y: np.ndarray, n: int | None, seed: int):
    if n is None or n >= len(y):
        return X, y
    if n < 1:
        raise ValueError(f"a subset needs at least one sample, got {n}")
    idx = np.sort(np.random.default_rng(seed).permutation(len(y))[:n])
    return X[idx], y[idx]


def load_fashion_mnist(train_samples: int | None = None, test_samples: int | None = None,
                       seed: int = 0, data_dir=None) -> FashionMNIST:
    """Load (and verify) Fashion-MNIST; optionally a fixed random subset of each split.
    ``data_dir``: the directory of the four files (default: :func:`find_data_dir`'s search)."""
    d = find_data_dir(data_dir=data_dir)
    Xtr, ytr, Xte, yte = _load_full(str(d.resolve()))
    Xtr, ytr = _subset(Xtr, ytr, train_samples, seed)
    Xte, yte = _subset(Xte, yte, test_samples, seed + 1)
    to_float = lambda X: (X.astype(np.float32) / 255.0)[:, None, :, :]
    return FashionMNIST(to_float(Xtr), ytr.astype(np.int64), to_float(Xte),
                        yte.astype(np.int64), source=str(d))


class BatchIterator:
    """Minibatches of in-memory arrays, identical in every framework.

    With ``shuffle=True`` the order of epoch ``e`` is a permutation drawn from
    ``numpy.random.default_rng([seed, e])``; the epoch counter advances at each ``iter()``
    (or is set with :meth:`set_epoch`), so two iterators with the same seed yield the same
    batches in the same order.  The last batch is smaller unless ``drop_last=True``.
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False):
        if len(X) != len(y):
            raise ValueError(f"X has {len(X)} samples but y has {len(y)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.X, self.y = X, y
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n, b = len(self.y), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self):
        n = len(self.y)
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(n)
                 if self.shuffle else None)
        self.epoch += 1
        for i in range(len(self)):
            sl = slice(i * self.batch_size, min((i + 1) * self.batch_size, n))
            if order is None:
                yield self.X[sl], self.y[sl]
            else:
                idx = order[sl]
                yield self.X[idx], self.y[idx]



def calibration_batches(X: np.ndarray, y: np.ndarray, batch_size: int, num_batches: int = 5,
                        seed: int = 1) -> list:
    """The whole batches every framework re-estimates BatchNorm's statistics on.

    After training, BatchNorm's running statistics are an exponential average over batches
    seen with *past* weights, accumulated per device (or per rank) in most frameworks, over
    the whole batch under JAX's ``jit``.  The book evaluates every framework's model the same
    way instead: each backend's ``recalibrate_batchnorm`` sets the running statistics to the
    plain average of the batch statistics of the *final* weights over these batches (whole
    global batches, on one device), and every replica gets the same values.  The batches are
    the first ``num_batches`` of a :class:`BatchIterator` with ``seed`` (default 1, so not
    the training order of seed 0): the same images in every framework.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    it = BatchIterator(X, y, min(batch_size, len(y)), shuffle=True, seed=seed, drop_last=True)
    return [b for _, b in zip(range(num_batches), it)]
