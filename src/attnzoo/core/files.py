"""Files every layer writes: `atomic_write` (a run's configs, results and checkpoints, the
explorer page, the figures) leaves the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _file_mode() -> int:
    """The mode a plain `open()` gives a new file here: 0o666 less the process's umask (read
    by setting it and putting it back, once, when this module is imported)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()  # mkstemp makes 0o600 files: another user could not read a run


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`. A failed
    write (a full disk, a read-only folder) leaves `path` as it was and no temporary file, and
    raises an OSError naming `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        raise _naming(err, path) from err
    try:
        if hasattr(os, "fchmod"):  # (not on Windows, whose files have no such modes)
            os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _naming(err, path) from err
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _naming(err: OSError, path: Path) -> OSError:
    """`err` as the same kind of OSError whose message names `path`."""
    if err.errno is None:
        return err
    return type(err)(err.errno, f"{err.strerror} (writing {path})")


def atomic_write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
