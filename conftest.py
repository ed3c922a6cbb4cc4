"""Repository-wide pytest hooks (loaded for the unit tests and the notebooks alike)."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


PENDING = ROOT / "tests" / "notebooks_pending.txt"


def pending_notebooks() -> dict[str, str]:
    """Notebooks whose nbval run is not yet verified: ``path  reason`` per line."""
    if not PENDING.is_file():
        return {}
    out = {}
    for line in PENDING.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            path, _, reason = line.partition(" ")
            out[path] = reason.strip() or "pending verification"
    return out


def pytest_collection_modifyitems(config, items):
    """Skip -- visibly, with the reason -- the cells of notebooks listed as pending."""
    pending = pending_notebooks()
    if not pending:
        return
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix() \
            if str(item.fspath).startswith(str(ROOT)) else None
        if rel in pending:
            item.add_marker(pytest.mark.skip(reason=f"{rel}: {pending[rel]}"))
