"""Feedback without hidden tests: students see their visible checks and a pass/fail line for the rest.

nbgrader's feedback shows each autograded test cell as it ran, hidden tests and their tracebacks
included; its ``ClearHiddenTests`` removes the source but not the tracebacks, whose context lines and
assertion messages still print hidden inputs. :class:`HideHiddenTests` (in
``GenerateFeedback.preprocessors``) rewrites each test cell from the parts
:class:`~course_lib.grading.execute.GuardedExecute` ran separately:

* the source shows the visible checks only;
* the outputs are those of the visible part (their tracebacks only quote visible lines), then one
  line: ``Hidden checks: passed``, ``failed`` or ``not run``.

The instructor's full version is the autograded notebook itself (``autograded/<student>/<ps>``), or
feedback generated with ``--HideHiddenTests.enabled=False`` into another folder
(``python -m course_lib.grading feedback <ps> --full``).
"""

from __future__ import annotations

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from course_lib.grading.execute import RESULT_KEY, _is_test_cell, split_hidden_tests

__all__ = ["HideHiddenTests"]

_NOTES = {
    "passed": "Hidden checks: passed.\n",
    "failed": "Hidden checks: failed (they call your functions with other inputs; details are not shown).\n",
    "not run": "Hidden checks: not run (a visible check failed first).\n",
}


class HideHiddenTests(NbGraderPreprocessor):
    """Feedback preprocessor: visible checks and their outputs, hidden checks as pass/fail only."""

    def preprocess_cell(self, cell, resources, index):
        if not _is_test_cell(cell):
            return cell, resources
        visible, hidden = split_hidden_tests(cell.source)
        result = cell.metadata.pop(RESULT_KEY, None)
        cell.source = visible
        if result is None:
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text="Not run.\n")]
            return cell, resources
        outputs = list(cell.get("outputs", []))[: int(result.get("n_visible_outputs", 0))]
        if hidden.strip():
            note = _NOTES.get(result.get("hidden"), _NOTES["not run"])
            outputs.append(NotebookNode(output_type="stream", name="stdout", text=note))
        cell.outputs = outputs
        return cell, resources
