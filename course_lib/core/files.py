"""Files: where the course's files are, and writing a file so that no reader ever sees half of it.

Where files are, without looking for the repository around the package (an installed ``course_lib``
has none):

* :func:`package_file`: a data file shipped inside the package (``importlib.resources``; the wheel
  carries them as package data: the k6 script and the locustfile, the Prometheus rules, the Telco CSV);
* :func:`course_workspace`: the folder the course reads and writes its own files in (``data/``,
  ``build/``, ``exercises/``, ``config/``): the course checkout at or above a given folder, by default
  the current working directory (a lesson's kernel runs in ``notebooks/``, ``make`` and the tests in the
  checkout's root), else that folder itself (an installed package run elsewhere writes there);
* :data:`IMPORT_ROOT`: the ``sys.path`` entry this ``course_lib`` was imported from, for a child
  process that must import the same package (put first on its ``PYTHONPATH``).

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
:func:`os.replace`, :mod:`importlib.resources` ("Using importlib.resources"); setuptools
documentation, "Data Files Support" (``package-data``).
"""

from __future__ import annotations

import glob
import importlib.resources
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from course_lib.core.checks import instance_of

__all__ = [
    "IMPORT_ROOT",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "course_workspace",
    "leftover_temporaries",
    "package_file",
]

#: The ``sys.path`` entry holding this ``course_lib`` (``course_lib/core/files.py`` -> two folders up): a
#: checkout's root when the package runs from one, ``site-packages`` when installed. Only for a child
#: process's ``PYTHONPATH``, so that it imports this same package; never to find data (see above).
IMPORT_ROOT = Path(__file__).resolve().parents[2]

#: What marks a course checkout: its ``pyproject.toml`` names this project.
_PROJECT_LINE = 'name = "course_lib"'


def package_file(package: str, *parts: str) -> Path:
    """The file-system path of a data file shipped inside ``package`` (``importlib.resources``).

    Parameters
    ----------
    package : str
        A dotted package name, e.g. ``"course_lib.measure.load_tools"``.
    *parts : str
        The file's path inside the package, one folder or file name each (``"scripts", "churn.js"``).

    Returns
    -------
    pathlib.Path
        An absolute path to the file (it is not opened or checked for existence: a constant may name a
        file a build step writes).

    Raises
    ------
    ModuleNotFoundError
        If ``package`` cannot be imported.
    TypeError
        If ``package`` is not on a file system (imported from a zip archive), so its files have no path.

    Examples
    --------
    >>> package_file("course_lib.core", "files.py").name
    'files.py'
    """
    resource = importlib.resources.files(package).joinpath(*parts)
    if not isinstance(resource, Path):
        raise TypeError(
            f"package {package!r} is not on a file system ({type(resource).__name__}): "
            "its data files have no path"
        )
    return resource


def course_workspace(start: str | os.PathLike[str] | None = None) -> Path:
    """Where the course reads and writes its own files: the checkout at or above ``start``, else ``start``.

    A course checkout is a folder whose ``pyproject.toml`` names the project ``course_lib``. A lesson's
    kernel runs in ``notebooks/``, the tests and ``make`` in the checkout's root: each finds the checkout.
    An installed package run outside any checkout uses ``start`` itself (``data/``, ``build/`` below it).

    Parameters
    ----------
    start : str, path-like or None
        Where to start looking; ``None`` (the default) is the current working directory.

    Returns
    -------
    pathlib.Path
        An absolute path.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> course_workspace(folder) == folder.resolve()
    True
    """
    here = Path(os.getcwd() if start is None else start).resolve()
    for folder in (here, *here.parents):
        try:
            if _PROJECT_LINE in (folder / "pyproject.toml").read_text(encoding="utf-8"):
                return folder
        except OSError:
            continue
    return here


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
