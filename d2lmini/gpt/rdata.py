"""Read Jane Austen's novels out of Debian's ``r-cran-janeaustenr`` package with the standard
library only: no R, no ``dpkg``.

A ``.deb`` is an ``ar`` archive whose ``data.tar.*`` holds the files.  The package's novels
are R's lazy-load data: ``data/Rdata.rdx`` (gzip) is an index, ``{name: (offset, length)}``,
into ``data/Rdata.rdb``, where each object is a 4-byte big-endian length and a zlib stream
of R's XDR serialisation (format versions 2 and 3): here six character vectors, one element
per line of a novel.  :func:`read_novels` decodes exactly the types that index and those
vectors use and refuses anything else with ``ValueError``.
"""
from __future__ import annotations

import gzip
import io
import struct
import tarfile
import zlib

__all__ = ["deb_member", "read_novels", "RDATA_DIR"]

RDATA_DIR = "usr/lib/R/site-library/janeaustenr/data/"

# R's SEXP type codes (R Internals, "Serialization formats")
_NILVALUE, _REF, _SYM, _LIST, _CHAR, _LGL, _INT, _REAL, _STR, _VEC = (
    254, 255, 1, 2, 9, 10, 13, 14, 16, 19)
_SPECIAL = {253, 252, 251, 250, 242, 241}          # global/empty/base env, missing arg, ...
_LATIN1, _HAS_ATTR, _HAS_TAG = 1 << 2, 1 << 9, 1 << 10


def deb_member(deb: bytes, path: str) -> bytes:
    """The bytes of ``path`` (e.g. ``RDATA_DIR + "Rdata.rdb"``) inside a ``.deb``'s data
    archive.  ``ValueError`` if the file is not a Debian package or lacks ``path``."""
    if deb[:8] != b"!<arch>\n":
        raise ValueError("not a Debian package (no ar archive header)")
    pos = 8
    while pos + 60 <= len(deb):
        header = deb[pos:pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = deb[pos + 60: pos + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for m in tar.getmembers():
                    if m.name.lstrip("./") == path:
                        return tar.extractfile(m).read()
            raise ValueError(f"the package holds no {path}")
        pos += 60 + size + (size & 1)
    raise ValueError("the package has no data.tar member")


class _Reader:
    def __init__(self, raw: bytes):
        if raw[:2] != b"X\n":
            raise ValueError("not R's XDR serialisation")
        self.b, self.p, self.refs = raw, 2, []
        version = self.int()
        self.p += 8                                            # R version, minimal version
        if version == 3:
            n = self.int()                                     # native encoding name
            self.p += n
        elif version != 2:
            raise ValueError(f"R serialisation version {version} is not supported")

    def int(self) -> int:
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        if t == _NILVALUE:
            return None
        if t in _SPECIAL:
            return ("special", t)
        if t == _REF:
            i = flags >> 8 or self.int()
            return self.refs[i - 1]
        if t == _SYM:
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if t == _CHAR:
            n = self.int()
            if n == -1:
                return None                                    # NA_character_
            s = self.b[self.p:self.p + n]
            self.p += n
            return s.decode("latin-1" if (flags >> 12) & _LATIN1 else "utf-8")
        if t == _LIST:                                         # pairlist: attributes
            if flags & _HAS_ATTR:
                self.item()
            tag = self.item() if flags & _HAS_TAG else None
            head = [(tag, self.item())]
            rest = self.item()
            return head + (rest or [])
        if t in (_STR, _VEC, _INT, _LGL, _REAL):
            n = self.int()
            if t in (_STR, _VEC):
                value = [self.item() for _ in range(n)]
            else:
                fmt, size = (">%dd", 8) if t == _REAL else (">%di", 4)
                value = list(struct.unpack_from(fmt % n, self.b, self.p))
                self.p += size * n
            attrs = dict((k[1], v) for k, v in self.item()) if flags & _HAS_ATTR else {}
            if "names" in attrs:
                return dict(zip(attrs["names"], value))
            return value
        raise ValueError(f"R object of type {t} at byte {self.p}: not expected in this package")


def _unserialize(raw: bytes):
    return _Reader(raw).item()


def read_novels(rdx: bytes, rdb: bytes) -> dict[str, list[str]]:
    """``{name: [line, ...]}`` of every object in the lazy-load database (``Rdata.rdx`` and
    ``Rdata.rdb`` bytes); each must be a character vector.  ``ValueError`` otherwise."""
    try:
        index = _unserialize(gzip.decompress(rdx))
    except (OSError, EOFError, zlib.error, struct.error) as e:
        raise ValueError(f"unreadable Rdata.rdx ({e})") from e
    if not isinstance(index, dict) or not isinstance(index.get("variables"), dict):
        raise ValueError("Rdata.rdx is not a lazy-load index")
    if index.get("compressed", [1]) != [1]:
        raise ValueError(f"Rdata.rdb compression {index['compressed']} is not zlib")
    novels = {}
    for name, (offset, length) in index["variables"].items():
        blob = rdb[offset:offset + length]
        try:
            raw = zlib.decompress(blob[4:])
            value = _unserialize(raw)
        except (zlib.error, struct.error, IndexError) as e:
            raise ValueError(f"object {name} of Rdata.rdb is unreadable ({e})") from e
        if len(raw) != struct.unpack(">I", blob[:4])[0]:
            raise ValueError(f"object {name} of Rdata.rdb has the wrong length")
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise ValueError(f"object {name} of Rdata.rdb is not a character vector")
        novels[name] = value
    return novels
