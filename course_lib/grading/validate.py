"""Student-side validation that agrees with the course's autograder: only errors fail a check.

nbgrader's Validate (``nbgrader validate``, the Validate button of its JupyterLab extension) runs the
notebook, then scores each test cell with ``nbgrader.utils.determine_grade``: any output on stderr
fails the cell, and a displayed value counts as partial credit. The course's autograder judges a
question by the values the student's functions return to the grader's own calls
(:mod:`course_lib.grading.checks`); printed values, warnings and log messages count for nothing, so a
correct answer that calls ``warnings.warn`` or ``logging.warning`` would validate as failed and then
earn its full points. :class:`ErrorsOnly`, run after nbgrader's ``Execute`` in
``Validator.preprocessors``, removes stderr streams and displayed values from the test cells before
Validate reads them, so a visible check fails exactly when it raises:

* ``nbgrader validate`` and the Validate button: call :func:`configure_validate` from the students'
  ``nbgrader_config.py`` (the workbook's student JupyterLab configuration,
  ``config/student-jupyter/nbgrader_config.py``, does). nbgrader 0.9 does not mark
  ``Validator.preprocessors`` as configurable, so the function does, then sets it; nbclient's hooks do
  not help (nbgrader's ``Execute`` uses ``on_cell_executed`` itself, and ``on_notebook_complete`` runs
  only in nbclient's async path);
* ``python -m course_lib.grading validate my-work/ps1/ps1.ipynb``: the same check without any
  configuration; it exits 1 when a check fails (``nbgrader validate`` always exits 0).

Validation runs the student's notebook as it is (no sandbox, none of the grader's checks, which only
instructors have): passing it means the visible checks pass, not that the grader's other inputs will.

References
----------
nbgrader 0.9 ``nbgrader.validator.Validator`` (``validate``, ``validate_and_print``; it runs nbgrader's
``Execute``, an nbclient ``NotebookClient``, with itself as config parent), nbclient 0.11
``NotebookClient`` hooks and ``nbgrader.server_extensions.validate_assignment`` (the Validate button loads
``nbgrader_config.py`` from the Jupyter configuration path and the server's working folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, Execute
from traitlets.config import Config

from course_lib.grading.execute import is_test_cell

__all__ = ["VALIDATOR_PREPROCESSORS", "ErrorsOnly", "configure_validate", "validate_notebook"]


class ErrorsOnly(Preprocessor):
    """Drop stderr streams and displayed values (``execute_result``) from test cells after execution.

    What remains of a test cell is its stdout, displays and errors, so nbgrader's ``determine_grade``
    fails the cell exactly when it raised, as the course's autograder does. Other cells are left alone.
    """

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell):
            cell.outputs = [
                out
                for out in cell.get("outputs", [])
                if out.output_type != "execute_result"
                and not (out.output_type == "stream" and out.get("name") == "stderr")
            ]
        return cell, resources


#: ``Validator.preprocessors`` that validate as the course grades: nbgrader's three, then :class:`ErrorsOnly`.
VALIDATOR_PREPROCESSORS = [CheckCellMetadata, ClearOutput, Execute, ErrorsOnly]


def configure_validate(config: Config) -> Config:
    """Make Validate (``nbgrader validate``, the Validate button) judge as the course's autograder.

    Call it in an ``nbgrader_config.py`` with the ``c`` that file gets from ``get_config()``.
    It marks ``Validator.preprocessors`` configurable (nbgrader 0.9 leaves it out) and sets it to
    :data:`VALIDATOR_PREPROCESSORS`; returns ``config``.
    """
    from nbgrader.validator import Validator  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    Validator.preprocessors.tag(config=True)
    config.Validator.preprocessors = VALIDATOR_PREPROCESSORS
    return config


def validate_notebook(path: str | os.PathLike, *, print_results: bool = False) -> dict:
    """Validate one notebook as the course grades it.

    Parameters
    ----------
    path : str or path-like
        The student's ``.ipynb``.
    print_results : bool
        Also print nbgrader's human-readable report (what the Validate button shows).

    Returns
    -------
    dict
        nbgrader's ``Validator.validate`` result: empty when every check passes, else ``failed``,
        ``changed`` (a locked cell was edited) or ``type_changed`` entries.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    """
    from nbgrader.validator import Validator  # noqa: PLC0415 (heavy optional dependency: nbgrader)

    notebook = Path(path)
    if not notebook.is_file():
        raise FileNotFoundError(f"path must be a notebook file, got {str(path)!r}")
    validator = Validator(config=configure_validate(Config()))
    results = validator.validate(str(notebook))
    if print_results:  # nbgrader's report of these results, without running the notebook again
        validator.validate = lambda _filename: results
        validator.stream = sys.stdout  # nbgrader binds it when its module is imported
        validator.validate_and_print(str(notebook))
    return results
