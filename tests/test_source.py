"""show_source renders the package's own code, without its docstring, and refuses what a lesson cannot import."""

import inspect

import pytest

from course_lib.core.checks import InvalidArgumentError
from course_lib.core.percentiles import nearest_rank
from course_lib.core.source import SourceView, show_source


def test_the_code_shown_is_the_code_that_runs_less_its_docstring():
    view = show_source(nearest_rank)
    full = inspect.getsource(nearest_rank)
    assert view.code.splitlines()[0] == full.splitlines()[0]
    assert nearest_rank.__doc__ is not None and nearest_rank.__doc__.strip().splitlines()[0] not in view.code
    body = [line for line in view.code.splitlines()[1:] if line.strip()]
    assert body and all(line in full for line in body)
    with_doc = show_source(nearest_rank, docstring=True)
    assert with_doc.code == full.rstrip("\n") and with_doc.lines > view.lines


def test_the_caption_names_the_module_the_file_and_the_lines():
    view = show_source(nearest_rank)
    lines, first = inspect.getsourcelines(nearest_rank)
    assert view.path == "course_lib/core/percentiles.py"
    assert (view.first_line, view.last_line) == (first, first + len(lines) - 1)
    assert view.caption().startswith(
        "course_lib.core.percentiles.nearest_rank: course_lib/core/percentiles.py"
    )
    markdown = view._repr_markdown_()
    assert "```python\n" + view.code + "\n```" in markdown
    assert str(view).splitlines()[1:] == view.code.splitlines()


def test_a_class_is_shown_whole():
    view = show_source(SourceView)
    assert view.code.startswith("@dataclass(frozen=True)\nclass SourceView:")
    assert "def caption(self)" in view.code


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        (3, "obj must be a function or class, got int"),
        (inspect.getsource, "defined in course_lib, got inspect.getsource"),
        (
            __import__("course_lib.core.source", fromlist=["_without_docstring"])._without_docstring,
            "_without_docstring",
        ),
    ],
)
def test_what_a_lesson_cannot_import_is_refused_by_name(obj, said):
    with pytest.raises(InvalidArgumentError, match=said):
        show_source(obj)


def test_the_plain_text_view_is_the_code_not_the_fields():
    view = show_source(nearest_rank)
    assert repr(view) == str(view) and "code=" not in repr(view)
