"""Files: where the checkout's folders are, and writing a file so that no reader ever sees half of it.

``REPO_ROOT`` is the checkout that holds this ``course_lib`` (``data/``, ``prometheus/``,
``loadtests/``, ``requirements.lock`` and ``exercises/`` live there).

An atomic write puts the new content in a temporary file beside the target, in the same folder (so
on the same file system), and renames it over the target with :func:`os.replace`. POSIX ``rename``
replaces the name in one step: a reader that opens the path sees the old file or the complete new
one, never a partial one, and two writers at once each write their own temporary file (named after
their process and a random token), the last rename winning. A writer that fails removes its
temporary file and leaves the old file as it was.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` for content already in memory (flushed to
  disk with ``fsync`` before the rename, so a crash right after leaves the old or the new content);
* :func:`atomic_path` for a writer that needs a file name (``pickle.dump`` to a file, ``onnx.save``,
  ``DataFrame.to_parquet``, ``sqlite3.connect``): it yields the temporary path and renames it on
  success;
* :func:`leftover_temporaries` finds the temporary files of writers that were killed before they
  could clean up (``SIGKILL``, a restarted kernel), with the process id that wrote each.

References
----------
POSIX.1-2017, ``rename()`` ("If the link named by the new argument exists, it shall be removed and
old renamed to new ... there shall be no point at which new does not exist"); Python documentation,
:func:`os.replace`.
"""

from __future__ import annotations

import glob
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from course_lib.core.checks import instance_of

__all__ = ["REPO_ROOT", "atomic_path", "atomic_write_bytes", "atomic_write_text", "leftover_temporaries"]

#: The checkout holding this course_lib: ``course_lib/core/files.py`` -> two folders up.
REPO_ROOT = Path(__file__).resolve().parents[2]

_SUFFIX = ".tmp"


def _temporary_beside(target: Path) -> Path:
    """``.<name>.<pid>.<token>.tmp`` in the target's folder: hidden, unique per process and call."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{_SUFFIX}")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a unique temporary path beside ``path``; on success rename it over ``path``.

    The caller writes the whole file to the yielded path (and closes it) inside the ``with`` block.
    If the block raises, the temporary file is removed and ``path`` keeps its old content (or stays
    absent); the exception propagates. The folder must exist.

    Parameters
    ----------
    path : str or path-like
        The file to create or replace.

    Yields
    ------
    pathlib.Path
        ``.<name>.<pid>.<token>.tmp`` in the same folder; nothing exists there yet.

    Raises
    ------
    FileNotFoundError
        If the block wrote nothing to the yielded path (there is nothing to rename), or the folder
        does not exist.

    Examples
    --------
    >>> import pickle, tempfile
    >>> target = Path(tempfile.mkdtemp()) / "model.pkl"
    >>> with atomic_path(target) as tmp, open(tmp, "wb") as fh:
    ...     pickle.dump({"trees": 400}, fh)
    >>> pickle.loads(target.read_bytes())
    {'trees': 400}
    """
    target = Path(path)
    tmp = _temporary_beside(target)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns the path.

    The bytes are flushed to disk (``os.fsync``) before the rename.

    Raises
    ------
    TypeError
        If ``data`` is not bytes-like.
    FileNotFoundError
        If the folder does not exist.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "record.bin"
    >>> atomic_write_bytes(target, b"abc").read_bytes()
    b'abc'
    """
    view = memoryview(data)  # TypeError for str and other non-bytes, before any file exists
    with atomic_path(path) as tmp, open(tmp, "xb") as fh:
        fh.write(view)
        fh.flush()
        os.fsync(fh.fileno())
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically in ``encoding`` (UTF-8 by default); returns the path.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        (a TypeError) If ``text`` is not a str.
    FileNotFoundError
        If the folder does not exist.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "record.json"
    >>> atomic_write_text(target, '{"p99_ms": 12.5}\\n').read_text()
    '{"p99_ms": 12.5}\\n'
    """
    return atomic_write_bytes(path, instance_of("text", text, str).encode(encoding))


def leftover_temporaries(path: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Temporary files that atomic writes to ``path`` left behind, with the id of the writing process.

    A writer killed before it could remove its temporary file leaves it; delete those whose process
    is gone (a live process may still be writing its own).

    Returns
    -------
    list of (temporary path, pid), sorted by path.
    """
    target = Path(path)
    prefix = f".{target.name}."
    found = []
    for tmp in sorted(target.parent.glob(f"{glob.escape(prefix)}*{_SUFFIX}")):
        pid_text = tmp.name[len(prefix) :].split(".", 1)[0]
        if pid_text.isdigit():
            found.append((tmp, int(pid_text)))
    return found
