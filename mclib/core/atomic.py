"""Writing a file or a folder whole: a reader sees the old one or the new one, never a part,
and once `write_atomic` returns the new one survives a power cut.

The new content goes to `.tmp-NAME` beside the target, is flushed to the disk (fsync of the
file, or of every file and folder of a folder), renamed over NAME (`os.replace`; a folder
that exists is first set aside as `.old-NAME`, since a folder cannot be renamed over a full
one), and the parent folder is flushed so that the rename itself is on the disk (where the
OS lets a folder be opened: not on Windows, whose rename is durable as it returns).

The one place in mclib (and its scripts) that writes a file atomically; nothing here
imports the rest of mclib.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str | Callable[[Path], None]) -> None:
    """Write `path` whole: `data` as its bytes (a str as UTF-8), or, where `data` is a
    function, whatever `data(tmp)` writes at the temporary path it is given (a file, or a
    folder for a folder's target: a checkpoint, an export)."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    _remove(tmp)  # left by a write that was cut
    if callable(data):
        data(tmp)
        if not tmp.exists():
            raise FileNotFoundError(f"the writer for {str(path)!r} wrote nothing at {str(tmp)!r}")
        _sync_tree(tmp)
    else:
        if not isinstance(data, (bytes, str)):
            raise TypeError(
                f"write_atomic writes bytes, a str or a writer function, not {type(data).__name__}"
            )
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    if path.is_dir():  # set the old folder aside only now that the new one is complete
        old = path.with_name(f".old-{path.name}")
        _remove(old)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)
    _sync_folder(path.parent)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def _sync_file(p: Path) -> None:
    with open(p, "r+b") as f:  # writable: Windows flushes only a handle open for writing
        os.fsync(f.fileno())


def _sync_folder(p: Path) -> None:
    """fsync a folder's entries (names created or renamed in it), where the OS allows it."""
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:  # Windows opens no folder this way
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot flush a folder
        pass
    finally:
        os.close(fd)


def _sync_tree(p: Path) -> None:
    """fsync a file, or every file and folder under a folder (the folder last)."""
    if not p.is_dir():
        _sync_file(p)
        return
    for root, dirs, files in os.walk(p, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                _sync_file(Path(root, name))
        _sync_folder(Path(root))
