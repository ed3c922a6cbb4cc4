"""The GPT chapter's corpus (d2lmini.gpt.corpus, .rdata, .ngram): the verified text, clear
errors when it is missing or corrupt, the R data decoder, character tokens, the held-out
novel, reproducible windows and the n-gram entropies."""
import gzip
import io
import math
import struct
import tarfile
import zlib
from collections import Counter

import numpy as np
import pytest

import d2lmini
from d2lmini.gpt import corpus as C
from d2lmini.gpt import ngram, rdata


@pytest.fixture(scope="module")
def corpus():
    return C.load_corpus()              # `make data` put it there (as Fashion-MNIST)


@pytest.fixture
def elsewhere(monkeypatch, tmp_path):
    """The corpus file is looked for in tmp_path only."""
    path = tmp_path / "austen.txt"
    monkeypatch.setenv("D2LMINI_CORPUS", str(path))
    return path


def test_the_text_verifies_and_splits_by_novel(corpus):
    text = corpus.text
    assert len(text) == sum(C.NOVEL_CHARS) + len(C.NOVELS) - 1
    assert C.CharTokenizer.from_text(text).chars == C.CORPUS_CHARS
    assert corpus.tokenizer.vocab_size == len(set(text))
    for name, title in C.NOVELS:                              # each span is that novel
        start, end = corpus.spans[name]
        assert text[start:end].lower().startswith(title.lower())
        assert text[end - 1] == "\n" and text[end:end + 1] in ("\n", "")   # the blank line
    start = corpus.spans["persuasion"][0]
    assert np.array_equal(np.concatenate([corpus.train_ids, corpus.val_ids]), corpus.ids)
    assert corpus.tokenizer.decode(corpus.val_ids[:10]) == text[start:start + 10] == "Persuasion"
    assert corpus.tokenizer.decode(corpus.ids[-1000:]) == text[-1000:]


def test_a_missing_corpus_says_what_to_do(elsewhere):
    with pytest.raises(d2lmini.DataError, match=r"(?s)corpus is missing: .*austen.txt.*make data"):
        C.load_corpus()
    with pytest.raises(d2lmini.DataError, match="make data"):
        C.obtain_corpus(download=False)


def test_a_corrupt_corpus_is_detected(corpus, elsewhere):
    i = corpus.text.index("Elizabeth")
    elsewhere.write_text(corpus.text[:i] + "E1izabeth" + corpus.text[i + 9:], encoding="utf-8")
    with pytest.raises(d2lmini.DataError, match=r"(?s)austen.txt is corrupt: the SHA-256.*make data"):
        C.load_corpus()
    elsewhere.write_bytes(b"\xff\xfe" + corpus.text.encode()[:100])
    with pytest.raises(d2lmini.DataError, match="corrupt: not UTF-8"):
        C.load_text()


# --- the R data decoder, on a package made here ---------------------------------------------

def _serialize(obj) -> bytes:
    """R's XDR serialisation (version 3) of a character vector or a named list of them."""
    def item(o):
        if isinstance(o, str):
            b = o.encode()
            return struct.pack(">ii", 9 | (1 << 3 << 12), len(b)) + b       # CHARSXP, UTF-8
        if isinstance(o, list) and all(isinstance(s, str) for s in o):
            return struct.pack(">ii", 16, len(o)) + b"".join(item(s) for s in o)
        if isinstance(o, list):                                            # integer vector
            return struct.pack(">ii", 13, len(o)) + struct.pack(f">{len(o)}i", *o)
        names = list(o)                                                    # named VECSXP
        attr = (struct.pack(">i", 2 | 1024) + struct.pack(">i", 1) + item("names")
                + item(names) + struct.pack(">i", 254))
        return (struct.pack(">ii", 19 | 512, len(o)) + b"".join(item(o[k]) for k in names)
                + attr)
    return b"X\n" + struct.pack(">iiii", 3, 0x40201, 0x30500, 5) + b"UTF-8" + item(obj)


def _package(novels: dict) -> bytes:
    """A .deb (ar archive, data.tar.gz) holding novels as janeaustenr stores them."""
    rdb, index = b"", {}
    for name, lines in novels.items():
        raw = _serialize(lines)
        blob = struct.pack(">I", len(raw)) + zlib.compress(raw)
        index[name] = [len(rdb), len(blob)]
        rdb += blob
    rdx = gzip.compress(_serialize({"variables": index, "references": {}, "compressed": [1]}))
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w:gz") as t:
        for fname, data in (("Rdata.rdx", rdx), ("Rdata.rdb", rdb)):
            info = tarfile.TarInfo("./" + rdata.RDATA_DIR + fname)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    members = [("debian-binary", b"2.0\n"), ("data.tar.gz", tar.getvalue())]
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


def test_the_r_data_decoder_reads_the_packages_vectors():
    novels = {name: [f"{title} line {i} \u00a3" for i in range(3)] + [""]
              for name, title in C.NOVELS}
    deb = _package(novels)
    got = rdata.read_novels(rdata.deb_member(deb, rdata.RDATA_DIR + "Rdata.rdx"),
                            rdata.deb_member(deb, rdata.RDATA_DIR + "Rdata.rdb"))
    assert got == novels
    # decoded, but not Jane Austen's text: refused, with the checksum and what to do
    with pytest.raises(d2lmini.DataError, match=r"(?s)is corrupt: the SHA-256.*make data"):
        C.text_from_deb(deb)
    with pytest.raises(d2lmini.DataError, match="could not be decoded .*not a Debian package"):
        C.text_from_deb(b"<html>404</html>")


def test_obtain_from_a_package_file_that_is_wrong_keeps_nothing(elsewhere, tmp_path):
    deb = tmp_path / "r-cran-janeaustenr_9_all.deb"
    deb.write_bytes(_package({name: ["x"] for name, _ in C.NOVELS}))
    with pytest.raises(d2lmini.DataError, match="is corrupt"):
        C.obtain_corpus(download=False, deb=deb)
    assert not elsewhere.exists()
    with pytest.raises(d2lmini.DataError, match="cannot read the package .*no.deb"):
        C.obtain_corpus(download=False, deb=tmp_path / "no.deb")


# --- tokens and windows ---------------------------------------------------------------------

def test_character_tokens_round_trip_and_refuse_strangers(corpus):
    tok = corpus.tokenizer
    sample = corpus.text[100_000:101_000]
    ids = tok.encode(sample)
    assert ids.dtype == np.int64 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == sample
    with pytest.raises(ValueError, match="'\u20ac' is not in the vocabulary of 81"):
        tok.encode("a \u20ac")
    with pytest.raises(ValueError, match="ids must lie in 0..80"):
        tok.decode([81])


def test_windows_are_reproducible_shifted_and_inside(corpus):
    ids = corpus.train_ids
    x, y = C.sample_windows(ids, 5, 64, seed=0, step=3)
    x2, y2 = C.WindowSampler(ids, 5, 64, seed=0)(3)
    assert x.shape == y.shape == (5, 64) and x.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert np.array_equal(x[:, 1:], y[:, :-1])                 # y is the next character
    assert not np.array_equal(x, C.sample_windows(ids, 5, 64, seed=0, step=4)[0])
    assert not np.array_equal(x, C.sample_windows(ids, 5, 64, seed=1, step=3)[0])
    steps = iter(C.WindowSampler(ids, 5, 64, seed=0))
    assert all(np.array_equal(next(steps)[0], C.sample_windows(ids, 5, 64, 0, s)[0])
               for s in range(3))
    vx, vy = C.eval_windows(corpus.val_ids, 64, 7)
    assert vx.shape == (7, 64) and np.array_equal(vx[0], corpus.val_ids[:64])
    assert np.array_equal(vy[-1], corpus.val_ids[-64:])
    with pytest.raises(ValueError, match="hold no window of 64"):
        C.sample_windows(ids[:64], 2, 64)
    with pytest.raises(ValueError, match="batch and context must be >= 1"):
        C.WindowSampler(ids, 0, 64)


# --- n-gram entropies -----------------------------------------------------------------------

def test_ngram_entropy_is_the_plug_in_conditional_entropy():
    seq = np.random.default_rng(0).integers(0, 4, 500) % 3       # a skewed 3-letter source
    for n in (1, 2, 3):
        grams = Counter(tuple(seq[i:i + n]) for i in range(len(seq) - n + 1))
        ctx = Counter()
        for g, c in grams.items():
            ctx[g[:-1]] += c
        total = sum(grams.values())
        expected = -sum(c / total * math.log(c / ctx[g[:-1]]) for g, c in grams.items())
        assert ngram.ngram_entropy(seq, n) == pytest.approx(expected, rel=1e-12)


def test_the_heldout_model_is_a_distribution():
    rng = np.random.default_rng(1)
    train = rng.integers(0, 5, 300)
    for h in ([], [2], [4, 0]):                   # seen and unseen contexts
        n = len(h) + 1
        p = [math.exp(-ngram.ngram_cross_entropy(train, np.array(h + [x]), n, vocab=5))
             for x in range(5)]
        assert sum(p) == pytest.approx(1.0, abs=1e-12) and min(p) > 0


def test_the_reference_entropies_of_the_validation_novel(corpus):
    """The numbers the chapter reads the model's validation loss against: they fall with the
    order, and the held-out model is never better than the in-sample table."""
    rows = ngram.entropy_table(corpus.train_ids, corpus.val_ids, vocab=81)
    val = [r["val_entropy"] for r in rows]
    held = [r["heldout_cross_entropy"] for r in rows]
    assert val[0] > val[1] > val[2] > 1.0 and held[0] > held[1] > held[2]
    assert all(h >= v for h, v in zip(held, val))
    assert val[0] < math.log(81)
