"""What the fork server imports once for every batch worker: the chunk pipeline and XGBoost, without scikit-learn.

One concept: a worker's imports, as lean as its work. A batch worker reads, checks, encodes and scores
chunks (:func:`course_lib.offline.chunk.score_chunk`) with XGBoost's ``Booster``, ONNX Runtime or
compiled trees; it never uses XGBoost's scikit-learn wrappers (``XGBClassifier``). XGBoost imports
scikit-learn only for those wrappers, and falls back to stand-in base classes when it is missing
(``xgboost.compat``: ``SKLEARN_INSTALLED``); on a 2-core laptop that import is about 0.8 s of XGBoost's
0.9 s. So this module imports XGBoost while ``sklearn`` is marked missing, then removes the mark: a
later ``import sklearn`` in a worker works as usual, only XGBoost's wrappers in that process are the
stand-ins. Where scikit-learn is already imported, nothing is hidden.

Only the fork server's own preload hides scikit-learn: imported anywhere else (a test that imports
every module, a notebook), this module imports XGBoost as usual, so that process keeps XGBoost's
scikit-learn wrappers.

References
----------
XGBoost source, ``python-package/xgboost/compat.py`` (the ``try: from sklearn...`` import); Python
documentation, "The import system", ``sys.modules`` (a ``None`` entry makes the import raise
``ImportError``).
"""

from __future__ import annotations

import sys
from types import FrameType

import course_lib.offline.chunk  # noqa: F401 (imported for the workers forked from this process)

__all__: list[str] = []


def _in_fork_server() -> bool:
    """Whether this import runs in multiprocessing's fork server, from its preload loop."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    serve = getattr(getattr(forkserver, "main", None), "__code__", None)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is serve:
            return True
        frame = frame.f_back
    return False


if "sklearn" in sys.modules or not _in_fork_server():
    import xgboost
else:
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # "import sklearn" raises ImportError
    try:
        import xgboost  # noqa: F401
    finally:
        del sys.modules["sklearn"]
