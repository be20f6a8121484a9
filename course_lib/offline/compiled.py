"""Compiled trees: the churn booster turned into C by treelite + tl2cgen and built with the machine's compiler.

One concept: a third way to run the same 400 trees. treelite reads the XGBoost model; tl2cgen writes
each tree as nested ``if``/``else`` C code and compiles it into a shared library with the C compiler
on this machine (``gcc``, ``cc`` or ``clang``; ``$CC`` first). The library is built once per model
and kept under ``build/offline_compiled/`` (:func:`compile_trees`); every worker process loads it
(:func:`trees_predictor`). Where no C compiler exists, :func:`compiled_trees_unavailable` says so and
the batch job's runtime choice leaves this candidate out instead of failing.

The library's messages (tl2cgen's compile notes; its bundled treelite 4.1 reader warns that the model
was written by treelite 4.8, whose format it reads) are written by native code to the process's
file descriptors; :func:`compile_trees` captures them and returns them with the path instead of
printing them.

References
----------
treelite documentation, ``treelite.frontend.from_xgboost``; tl2cgen documentation, ``export_lib``
(``params={"parallel_comp": ...}``, ``toolchain``) and ``Predictor``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import numpy as np

from course_lib.churn.data import DATA_DIR
from course_lib.core.bench import usable_cores

__all__ = ["COMPILED_DIR", "c_compiler", "compile_trees", "compiled_trees_unavailable", "trees_predictor"]

#: Where compiled libraries are kept, one folder per model and compiler settings.
COMPILED_DIR = DATA_DIR.parent / "build" / "offline_compiled"
_PARALLEL_UNITS = 8  # tl2cgen splits the 400 trees over this many C files, compiled side by side


def c_compiler() -> str | None:
    """The C compiler tl2cgen will call: ``$CC`` if set and found, else ``gcc``, ``cc`` or ``clang`` on PATH."""
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def compiled_trees_unavailable() -> str | None:
    """Why compiled trees cannot run here (no C compiler, or treelite/tl2cgen not installed), or None."""
    for package in ("treelite", "tl2cgen"):
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            return f"{package} is not installed (pip install {package})"
    if c_compiler() is None:
        return "no C compiler (gcc, cc or clang) on PATH, so tl2cgen cannot build the trees"
    return None


@contextlib.contextmanager
def _captured_native_output() -> Iterator[io.StringIO]:
    """Send file descriptors 1 and 2 (native code's stdout/stderr) and ``sys.stdout`` to a buffer."""
    text = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(text):
                yield text
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            text.write(sink.read().decode("utf-8", "replace"))


def compile_trees(
    booster_raw: bytes, model_version: str, *, folder: str | Path | None = None
) -> tuple[Path, str]:
    """Compile an XGBoost booster (``Booster.save_raw("ubj")`` bytes) into a shared library, once.

    Parameters
    ----------
    booster_raw : bytes
        The trees to compile (the served iteration range only).
    model_version : str
        Names the cache folder, with a hash of the bytes and the treelite/tl2cgen versions.
    folder : path, optional
        Cache root (default :data:`COMPILED_DIR`).

    Returns
    -------
    (path, log)
        The library (reused if already built) and the compiler's captured messages ("" when reused).

    Raises
    ------
    RuntimeError
        If :func:`compiled_trees_unavailable` gives a reason.
    """
    reason = compiled_trees_unavailable()
    if reason is not None:
        raise RuntimeError(f"compiled trees are unavailable: {reason}")
    # treelite and tl2cgen are optional (compiled_trees_unavailable says when they are missing)
    import tl2cgen  # noqa: PLC0415 (heavy optional dependency)
    import treelite  # noqa: PLC0415 (heavy optional dependency)
    import xgboost as xgb  # noqa: PLC0415 (heavy optional dependency)

    versions = f"treelite {metadata.version('treelite')} tl2cgen {metadata.version('tl2cgen')} {c_compiler()}"
    key = hashlib.sha256(booster_raw + versions.encode()).hexdigest()[:12]
    target = Path(folder if folder is not None else COMPILED_DIR) / f"{model_version}-{key}"
    library = target / "churn_trees.so"
    if library.is_file():
        return library, ""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        booster = xgb.Booster()
        booster.load_model(bytearray(booster_raw))
        compiler = c_compiler()
        assert compiler is not None  # compiled_trees_unavailable() found one
        try:
            with _captured_native_output() as log:
                tl2cgen.export_lib(
                    treelite.frontend.from_xgboost(booster),
                    toolchain=compiler,
                    libpath=str(work / library.name),
                    params={"parallel_comp": _PARALLEL_UNITS},
                    nthread=usable_cores(),
                )
        except Exception as error:
            raise RuntimeError(f"tl2cgen could not build the trees: {error}\n{log.getvalue()}") from error
        try:
            work.rename(target)  # a whole folder appears at once; another process may have won the race
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return library, log.getvalue()


def trees_predictor(library: str | Path, *, threads: int = 1) -> Callable[[np.ndarray], np.ndarray]:
    """Load a compiled library; the function maps float32 rows ``(n, n_features)`` to probabilities ``(n,)``.

    The library applies XGBoost's sigmoid itself; results agree with XGBoost to about 1e-6 (float32
    sums in another order), not bit for bit.
    """
    # optional, and loaded only by the worker that scores with compiled trees
    import tl2cgen  # noqa: PLC0415 (heavy optional dependency)

    predictor = tl2cgen.Predictor(str(library), nthread=threads)

    def predict(X: np.ndarray) -> np.ndarray:
        out = predictor.predict(tl2cgen.DMatrix(X, dtype="float32"))
        return np.asarray(out, dtype=np.float64).reshape(len(X), -1)[:, -1]

    return predict
