"""What the batch job's fork server imports once: the chunk pipeline and XGBoost's ``Booster``.

A worker scores with ``xgboost.Booster.inplace_predict`` (or ONNX Runtime, or compiled trees) and never
uses XGBoost's scikit-learn wrappers, but ``import xgboost`` imports scikit-learn whenever it is
installed (``xgboost.compat``): about 0.8 s of the fork server's 1.6 s start on a 2-core laptop, during
which the job's first chunks run in its own process alone. So XGBoost is imported here with scikit-learn
hidden (a ``None`` entry in ``sys.modules`` makes ``import sklearn`` raise ``ImportError``, which
``xgboost.compat`` handles as "not installed"), and the entry is removed at once: a worker that needs
scikit-learn later (the ONNX runtime's converter) imports it as usual. In the fork server and its
workers only, XGBoost's ``XGBClassifier`` is then built without scikit-learn's base classes; nothing
there uses it.

References
----------
Python documentation, "The import system", ``sys.modules`` ("if the value is None, the import raises
ModuleNotFoundError"); XGBoost source, ``python-package/xgboost/compat.py`` (the guarded import).
"""

from __future__ import annotations

import sys

import course_lib.offline.chunk  # noqa: F401 (imported for the workers)

_HIDE = "xgboost" not in sys.modules and "sklearn" not in sys.modules  # else too late, or nothing to hide
if _HIDE:
    sys.modules["sklearn"] = None  # type: ignore[assignment]
try:
    import xgboost  # noqa: F401 (imported for the workers)
finally:
    if _HIDE:
        del sys.modules["sklearn"]
