"""The GPT chapter's corpus: Jane Austen's six novels as one verified text, character tokens,
a held-out novel and reproducible (x, y) windows.

Source and licences.  The novels (*Sense and Sensibility*, *Pride and Prejudice*, *Mansfield
Park*, *Emma*, *Northanger Abbey*, *Persuasion*; Austen died in 1817) are in the **public
domain**; the texts are Project Gutenberg's as Julia Silge's R package ``janeaustenr`` 1.0.0
ships them (**MIT** licence, (c) 2016-2017 Julia Silge; Debian packaging MIT, (c) 2021 Andreas
Tille).  They come from Debian's package ``r-cran-janeaustenr`` 1.0.0-1, fetched with
``apt-get download`` (never installed: that would pull in R) or from Debian's mirror, and
decoded from its R data file by :mod:`d2lmini.gpt.rdata` (standard library only).

The text: the novels in order of publication, each line followed by ``"\\n"``, one empty line
between two novels: 4,025,033 characters, 81 distinct symbols.  ``make data`` (``python -m
d2lmini corpus``) stores it as ``austen.txt`` beside Fashion-MNIST in the user cache
(``$XDG_CACHE_HOME/d2lmini/austen/``), or ``$D2LMINI_CORPUS`` names the file.  Every load
checks the SHA-256 of the *decoded* text (:data:`TEXT_SHA256`): a missing or corrupt file
raises :class:`d2lmini.DataError` saying what to do.

Tokens are characters: ids 0..80 in code-point order (``CharTokenizer``), the same integers
in every framework.  Validation is the last novel, *Persuasion* (466,854 characters, 11.6 %
of the text); training is everything before it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..data import DataError, cache_dir
from .rdata import RDATA_DIR, deb_member, read_novels

__all__ = ["CORPUS_CHARS", "NOVELS", "TEXT_SHA256", "CharTokenizer", "AustenCorpus", "load_corpus",
           "load_text", "corpus_path", "obtain_corpus", "text_from_deb", "sample_windows",
           "WindowSampler", "eval_windows"]

#: (R object name, title) in order of publication: the order of the text.
NOVELS = (("sensesensibility", "Sense and Sensibility"), ("prideprejudice", "Pride and Prejudice"),
          ("mansfieldpark", "Mansfield Park"), ("emma", "Emma"),
          ("northangerabbey", "Northanger Abbey"), ("persuasion", "Persuasion"))
#: Characters of each novel in the text (its lines, each with its "\n").
NOVEL_CHARS = (673688, 684768, 883279, 883028, 433411, 466854)
VALIDATION_NOVEL = "persuasion"
#: SHA-256 of the decoded text, UTF-8 encoded.
TEXT_SHA256 = "887d811d970b962381ef54f0d0dde7d14e7ce7aa2c85fdef0a8a97a47e4390d0"
#: The 81 characters of the text in code-point order: token i is CORPUS_CHARS[i].
CORPUS_CHARS = ("\n !\"&'()*,-.0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_"
                "abcdefghijklmnopqrstuvwxyz\u00a3")
PACKAGE = "r-cran-janeaustenr"
DEB_URL = ("https://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/"
           "r-cran-janeaustenr_1.0.0-1_all.deb")

HOW_TO_FIX = (
    "To fix it, do one of:\n"
    "  * make data   (or: python -m d2lmini corpus), which runs `apt-get download "
    f"{PACKAGE}` or fetches {DEB_URL}, decodes and verifies the text\n"
    "  * python -m d2lmini corpus --deb FILE.deb   with that package copied from elsewhere\n"
    "  * delete the bad file and run one of the above again")


def corpus_path() -> Path:
    """Where the verified text is kept: ``$D2LMINI_CORPUS``, else ``austen.txt`` in the user
    cache beside Fashion-MNIST."""
    explicit = os.environ.get("D2LMINI_CORPUS")
    return Path(explicit) if explicit else cache_dir().parent / "austen" / "austen.txt"


def text_from_deb(deb: bytes) -> str:
    """The corpus text decoded from the bytes of the ``r-cran-janeaustenr`` package, verified.
    Raises :class:`DataError` if the package is unreadable or its text is not the expected."""
    try:
        novels = read_novels(deb_member(deb, RDATA_DIR + "Rdata.rdx"),
                             deb_member(deb, RDATA_DIR + "Rdata.rdb"))
        text = "\n".join("".join(line + "\n" for line in novels[name]) for name, _ in NOVELS)
    except (ValueError, KeyError) as e:
        raise DataError(f"the {PACKAGE} package could not be decoded ({e}).\n{HOW_TO_FIX}") from e
    _verify(text, f"the text decoded from {PACKAGE}")
    return text


def _verify(text: str, where: str) -> None:
    got = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if got != TEXT_SHA256:
        raise DataError(f"{where} is corrupt: the SHA-256 of its text is {got}, expected "
                        f"{TEXT_SHA256} ({len(text):,} characters; the corpus has "
                        f"{sum(NOVEL_CHARS) + len(NOVELS) - 1:,}).\n{HOW_TO_FIX}")


def _apt_download(directory: str) -> bytes | None:
    """The package's bytes by ``apt-get download`` (no root needed), or None."""
    if not shutil.which("apt-get"):
        return None
    try:
        r = subprocess.run(["apt-get", "download", "-q", PACKAGE], cwd=directory,
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    debs = sorted(Path(directory).glob(f"{PACKAGE}_*.deb"))
    return debs[-1].read_bytes() if r.returncode == 0 and debs else None


def _url_download() -> bytes:
    try:
        with urllib.request.urlopen(DEB_URL, timeout=120) as r:
            return r.read()
    except OSError as e:
        raise DataError(f"the corpus is not on this machine, apt-get could not download "
                        f"{PACKAGE}, and fetching {DEB_URL} failed ({e}).\n{HOW_TO_FIX}") from e


def obtain_corpus(download: bool = True, deb: str | os.PathLike | None = None) -> Path:
    """Make sure the verified text is at :func:`corpus_path` and return that path.

    Nothing to do if it is there and verifies.  Otherwise from ``deb`` (a ``.deb`` file)
    when given, else ``apt-get download r-cran-janeaustenr``, else Debian's mirror
    (:data:`DEB_URL`; only with ``download=True``).  A package whose decoded text does not
    verify is not used.  Raises :class:`DataError` with what to do."""
    path = corpus_path()
    try:
        load_text(path)
        return path
    except DataError:
        if deb is None and not download:
            raise
    if deb is not None:
        try:
            raw = Path(deb).read_bytes()
        except OSError as e:
            raise DataError(f"cannot read the package {deb} ({e}).\n{HOW_TO_FIX}") from e
        text = text_from_deb(raw)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            raw = _apt_download(tmp)
        try:
            text = text_from_deb(raw) if raw else None
        except DataError:
            text = None                      # another Debian revision: take the pinned one
        text = text or text_from_deb(_url_download())
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", dir=path.parent,
                                     delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    return path


def load_text(path: str | os.PathLike | None = None) -> str:
    """The corpus text from ``path`` (default :func:`corpus_path`), verified by SHA-256.
    A missing or corrupt file raises :class:`DataError` saying what to do."""
    path = Path(path) if path is not None else corpus_path()
    if not path.is_file():
        raise DataError(f"the Jane Austen corpus is missing: {path} does not exist.\n"
                        + HOW_TO_FIX)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is corrupt: not UTF-8 text ({e}).\n{HOW_TO_FIX}") from e
    _verify(text, str(path))
    return text


class CharTokenizer:
    """Characters <-> integer ids: id i is the i-th character of ``chars`` (sorted by code
    point for the corpus), so every framework sees the same integers."""

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: repeated characters")
        self.chars = chars
        points = np.array([ord(c) for c in chars], dtype=np.int64)
        self._table = np.full(int(points.max(initial=0)) + 2, -1, dtype=np.int64)
        self._table[points] = np.arange(len(chars))     # code point -> id; -1: not in chars

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """int64 ids of ``text``; a character outside the vocabulary raises ``ValueError``."""
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = self._table[np.minimum(points, len(self._table) - 1)]
        if (ids < 0).any():
            c = chr(points[np.argmax(ids < 0)])
            raise ValueError(f"CharTokenizer: {c!r} is not in the vocabulary of "
                             f"{self.vocab_size} characters")
        return ids

    def decode(self, ids) -> str:
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer: ids must lie in 0..{self.vocab_size - 1}")
        return "".join(self.chars[i] for i in ids)


@dataclass(frozen=True)
class AustenCorpus:
    """The verified text, its tokenizer, all ids and the two splits (int64 arrays);
    ``spans``: ``{novel: (start, end)}`` character offsets of each novel in ``text``."""
    text: str
    tokenizer: CharTokenizer
    ids: np.ndarray
    train_ids: np.ndarray
    val_ids: np.ndarray
    spans: dict

    def __repr__(self) -> str:
        return (f"AustenCorpus({len(self.text):,} characters, vocabulary "
                f"{self.tokenizer.vocab_size}, train {len(self.train_ids):,}, validation "
                f"{len(self.val_ids):,} ({VALIDATION_NOVEL}))")


@lru_cache(maxsize=2)
def _load(path: str, stamp: tuple) -> AustenCorpus:
    text = load_text(path)
    tok = CharTokenizer(CORPUS_CHARS)                    # == CharTokenizer.from_text(text)
    ids = tok.encode(text)
    spans, start = {}, 0
    for (name, _), n in zip(NOVELS, NOVEL_CHARS):
        spans[name] = (start, start + n)
        start += n + 1                                   # the empty line between novels
    val_start = spans[VALIDATION_NOVEL][0]
    ids.setflags(write=False)
    return AustenCorpus(text, tok, ids, ids[:val_start], ids[val_start:], spans)


def load_corpus(path: str | os.PathLike | None = None) -> AustenCorpus:
    """The corpus from ``path`` (default :func:`corpus_path`), verified, tokenized, split;
    kept in memory for the process (a changed file is read again)."""
    p = Path(path) if path is not None else corpus_path()
    try:
        st = p.stat()
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = None
    return _load(str(p), stamp)


def _check_windows(ids, batch: int, context: int) -> None:
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be >= 1, got {batch} and {context}")
    if len(ids) < context + 1:
        raise ValueError(f"{len(ids)} tokens hold no window of {context} + 1 tokens")


def sample_windows(ids: np.ndarray, batch: int, context: int, seed: int = 0,
                   step: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``, each ``(batch, context)`` int64: ``batch`` windows of ``ids`` starting at
    offsets drawn uniformly from ``numpy.random.default_rng([seed, step])``; ``y`` is ``x``
    shifted by one token (the next characters).  The same (seed, step) gives the same batch in
    every framework and process."""
    _check_windows(ids, batch, context)
    starts = np.random.default_rng([seed, step]).integers(0, len(ids) - context, size=batch)
    idx = starts[:, None] + np.arange(context + 1)
    w = np.asarray(ids)[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


class WindowSampler:
    """Training batches as :func:`sample_windows` draws them: ``sampler(step)`` is step
    ``step``'s batch, and iterating yields steps 0, 1, 2, ... without end."""

    def __init__(self, ids: np.ndarray, batch: int, context: int, seed: int = 0):
        _check_windows(ids, batch, context)
        self.ids, self.batch, self.context, self.seed = ids, batch, context, seed

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return sample_windows(self.ids, self.batch, self.context, self.seed, step)

    def __iter__(self):
        step = 0
        while True:
            yield self(step)
            step += 1


def eval_windows(ids: np.ndarray, context: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` fixed windows ``(x, y)`` spread evenly over ``ids`` (first at offset 0, last
    ending at the last token): the validation loss of every framework is the mean loss on
    these."""
    _check_windows(ids, max(count, 1), context)
    starts = np.linspace(0, len(ids) - context - 1, count).round().astype(np.int64)
    w = np.asarray(ids)[starts[:, None] + np.arange(context + 1)].astype(np.int64)
    return w[:, :-1], w[:, 1:]
