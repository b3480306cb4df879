"""Writing result files atomically: a temporary file beside the target, renamed over it, so a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from vime.errors import OutputError


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` in one rename (the temporary file is removed if writing fails).

    An OS error (a full disk, a file-size limit, a directory made read-only meanwhile) becomes an
    OutputError naming the file and the cause.
    """
    target = Path(path)
    try:
        _write(target, text)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc} — nothing was written there (the "
                          f"results above are complete); free space or give another path") from None


def _write(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 is not what the user's umask asks for
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

