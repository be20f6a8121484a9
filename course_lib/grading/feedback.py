"""Feedback and formgrader pages that are safe to open, and say when a submission is held for review.

* :class:`SafeHTML` is nbconvert's ``SanitizeHTML`` with the tags a pandas table or a plain display
  needs (no ``script``, ``iframe``, ``style``, event-handler attributes or ``javascript:`` links);
  it runs in autograde (so the autograded notebook formgrader shows is clean) and again in
  feedback. It also drops output types that could run code (``text/javascript``,
  ``application/javascript``, widget views) and sanitizes the markdown of written answers.
* :class:`HeldForReviewNote` puts a line at the top of the feedback of a submission that is held for
  review (:mod:`course_lib.grading.screen`): its scores are kept but may change.

There are no hidden tests in the notebooks any more (the grader's checks live in
``exercises/checks/`` and run in the grader's process), so feedback shows each test cell as it ran
for the student plus the grader's verdict, which names what was checked and never the hidden inputs
or answers.

References
----------
nbconvert 7 ``nbconvert.preprocessors.SanitizeHTML`` (bleach ``clean``); bleach 6
``ALLOWED_TAGS``/``ALLOWED_ATTRIBUTES``.
"""

from __future__ import annotations

from bleach import ALLOWED_ATTRIBUTES, ALLOWED_TAGS
from nbconvert.preprocessors.sanitize import SanitizeHTML
from nbformat import v4
from nbgrader.preprocessors import NbGraderPreprocessor

from course_lib.grading.execute import SCREEN_KEY

__all__ = ["HELD_NOTE", "SAFE_TAGS", "HeldForReviewNote", "SafeHTML"]

#: Tags kept in student HTML and markdown: bleach's, plus what tables and plain text displays use.
SAFE_TAGS = sorted(
    set(ALLOWED_TAGS)
    | {"p", "div", "span", "br", "pre", "hr", "sub", "sup", "table", "thead", "tbody", "tfoot", "tr", "th"}
    | {"td", "caption", "h1", "h2", "h3", "h4", "h5", "h6", "dl", "dt", "dd", "del", "ins", "kbd", "samp"}
)
_SAFE_ATTRIBUTES = {
    **ALLOWED_ATTRIBUTES,
    "table": ["class", "border"],
    "th": ["colspan", "rowspan", "halign", "valign"],
    "td": ["colspan", "rowspan"],
    "div": ["class"],
    "span": ["class"],
    "tr": ["class"],
}
HELD_NOTE = (
    "**Held for review.** An instructor will look at this submission before its grade is final; "
    "the scores below are the autograder's and may still change."
)


class SafeHTML(SanitizeHTML):
    """``SanitizeHTML`` that keeps tables and plain displays readable (see the module)."""

    def __init__(self, **kw):
        kw.setdefault("tags", SAFE_TAGS)
        kw.setdefault("attributes", _SAFE_ATTRIBUTES)
        super().__init__(**kw)
        self.enabled = True

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "markdown" and cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
            return cell, resources  # the instructor's own text: autograde restores locked cells' source
        return super().preprocess_cell(cell, resources, cell_index)


class HeldForReviewNote(NbGraderPreprocessor):
    """Feedback preprocessor: a first cell saying the submission is held for review, when it is."""

    def preprocess(self, nb, resources):
        if nb.metadata.get(SCREEN_KEY, {}).get("held_for_review"):
            nb.cells.insert(0, v4.new_markdown_cell(HELD_NOTE))
        return nb, resources
