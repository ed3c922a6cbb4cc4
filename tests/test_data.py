"""Fashion-MNIST loading: verified contents, the search order, and clear errors on bad data."""
import gzip
import shutil

import numpy as np
import pytest

import d2lmini
from d2lmini import data as D


@pytest.fixture(scope="session")
def real_dir():
    """Where the real files are (session-scoped: resolved before any test isolates itself)."""
    return D.find_data_dir(download=False)


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No cache, no Debian directory, no downloads: only what a test puts in D2LMINI_DATA."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "DEBIAN_DIR", tmp_path / "no-debian")
    D._load_full.cache_clear()
    yield tmp_path
    D._load_full.cache_clear()


def copy_data(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for f in D.FILENAMES:
        shutil.copy(src / f, dst / f)
    return dst


def test_full_dataset_verifies(real_dir):
    d = d2lmini.load_fashion_mnist()
    assert d.X_train.shape == (60000, 1, 28, 28) and d.X_test.shape == (10000, 1, 28, 28)
    assert d.X_train.dtype == np.float32 and 0.0 <= d.X_train.min() and d.X_train.max() <= 1.0
    assert np.bincount(d.y_train).tolist() == [6000] * 10
    assert np.bincount(d.y_test).tolist() == [1000] * 10


def test_subsets_are_fixed_and_sized(real_dir):
    a = d2lmini.load_fashion_mnist(1000, 300)
    b = d2lmini.load_fashion_mnist(1000, 300)
    assert len(a.y_train) == 1000 and len(a.y_test) == 300
    assert np.array_equal(a.y_train, b.y_train) and np.array_equal(a.X_test, b.X_test)
    assert len(set(a.y_train.tolist())) == 10


def test_explicit_directory_missing_files_are_named(isolated, real_dir, monkeypatch):
    d = copy_data(real_dir, isolated / "partial")
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setenv("D2LMINI_DATA", str(d))
    with pytest.raises(D.DataError, match="not there: t10k-labels-idx1-ubyte.gz"):
        d2lmini.load_fashion_mnist()


def test_nothing_anywhere_and_no_download(isolated, monkeypatch):
    monkeypatch.delenv("D2LMINI_DATA", raising=False)
    with pytest.raises(D.DataError, match="apt-get install dataset-fashion-mnist"):
        D.find_data_dir(download=False)


def test_failed_download_says_how_to_fix(isolated, monkeypatch):
    monkeypatch.delenv("D2LMINI_DATA", raising=False)
    monkeypatch.setattr(D, "UPSTREAM_URL", "http://127.0.0.1:9/")  # nothing listens there
    with pytest.raises(D.DataError, match="downloading it from .* failed"):
        d2lmini.load_fashion_mnist()


def test_corrupt_contents_are_detected(isolated, real_dir, monkeypatch):
    d = copy_data(real_dir, isolated / "corrupt")
    f = d / "train-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(f.read_bytes()))
    raw[100] = (raw[100] + 1) % 10          # one label changed: still a valid-looking file
    f.write_bytes(gzip.compress(bytes(raw)))
    monkeypatch.setenv("D2LMINI_DATA", str(d))
    with pytest.raises(D.DataError, match="train-labels-idx1-ubyte.gz is corrupt: the SHA-256"):
        d2lmini.load_fashion_mnist()


def test_truncated_gzip_is_detected(isolated, real_dir, monkeypatch):
    d = copy_data(real_dir, isolated / "truncated")
    f = d / "t10k-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:5000])
    monkeypatch.setenv("D2LMINI_DATA", str(d))
    with pytest.raises(D.DataError, match="t10k-images-idx3-ubyte.gz is not a readable gzip"):
        d2lmini.load_fashion_mnist()


def test_recompressed_files_are_accepted(isolated, real_dir, monkeypatch):
    """Only the decompressed bytes matter (Debian re-compresses upstream's archives)."""
    d = isolated / "recompressed"
    d.mkdir()
    for name in D.FILENAMES:
        (d / name).write_bytes(gzip.compress(gzip.decompress((real_dir / name).read_bytes()),
                                             compresslevel=1))
    monkeypatch.setenv("D2LMINI_DATA", str(d))
    assert len(d2lmini.load_fashion_mnist().y_test) == 10000


def test_cache_comes_before_debian(isolated, real_dir, monkeypatch):
    monkeypatch.delenv("D2LMINI_DATA", raising=False)
    copy_data(real_dir, D.cache_dir())
    assert D.find_data_dir(download=False) == D.cache_dir()


def test_command_line_reports_where(real_dir):
    import subprocess, sys
    r = subprocess.run([sys.executable, "-m", "d2lmini", "data", "--no-download"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Fashion-MNIST verified in" in r.stdout


def test_decompressed_bytes_are_kept_verified_and_do_not_hide_a_changed_file(
        isolated, real_dir, monkeypatch):
    d = copy_data(real_dir, isolated / "kept")
    monkeypatch.setenv("D2LMINI_DATA", str(d))
    first = d2lmini.load_fashion_mnist(500, 100)
    kept = sorted((D.cache_dir().parent / "unpacked").iterdir())
    assert len(kept) == 4
    # the next load reads the kept bytes: no gzip at all
    D._load_full.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(D.gzip, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("not used")))
        again = d2lmini.load_fashion_mnist(500, 100)
    assert np.array_equal(first.X_train, again.X_train)
    assert np.array_equal(first.y_test, again.y_test)
    # a damaged kept copy is not used: the file is decompressed, verified and kept again
    biggest = max(kept, key=lambda p: p.stat().st_size)
    raw = bytearray(biggest.read_bytes())
    raw[5000] ^= 0xFF
    biggest.write_bytes(bytes(raw))
    D._load_full.cache_clear()
    assert np.array_equal(d2lmini.load_fashion_mnist(500, 100).X_train, first.X_train)
    assert biggest.read_bytes() != bytes(raw)
    # a data file that changes after its bytes were kept is checked again, and caught
    f = d / "train-labels-idx1-ubyte.gz"
    labels = bytearray(gzip.decompress(f.read_bytes()))
    labels[100] = (labels[100] + 1) % 10
    f.write_bytes(gzip.compress(bytes(labels)))
    D._load_full.cache_clear()
    with pytest.raises(D.DataError, match="train-labels-idx1-ubyte.gz is corrupt"):
        d2lmini.load_fashion_mnist()
