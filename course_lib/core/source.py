"""Show a mechanism's core in a lesson: the package's own code, rendered, never copied.

A lesson teaches an idea by reading its short core (the shape of a lesson, step 2, in
``COURSE_DESIGN.md``), so the code the student reads is the code the package runs. :func:`show_source`
renders one public function or class from ``course_lib`` as a highlighted code block, without its
docstring (the lesson's markdown explains it), and says where it lives and how long it is.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

from course_lib.core.checks import InvalidArgumentError

__all__ = ["SourceView", "show_source"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SourceView:
    """The code of one function or class, ready to display in a notebook.

    Attributes
    ----------
    name : its dotted import name, e.g. ``course_lib.serving.batching.core.run_batcher``.
    path : the file, relative to the folder that holds ``course_lib`` (``course_lib/...py``).
    first_line, last_line : 1-based line numbers of the code in that file (docstring included).
    code : the code as shown: decorators, signature and body, the docstring left out.
    """

    name: str
    path: str
    first_line: int
    last_line: int
    code: str

    @property
    def lines(self) -> int:
        """Number of lines shown (the docstring not counted)."""
        return len(self.code.splitlines())

    def caption(self) -> str:
        """One line: where the code lives and how many lines it is."""
        return (
            f"{self.name}: {self.path}, lines {self.first_line}-{self.last_line} ({self.lines} lines shown)"
        )

    def __str__(self) -> str:
        return f"# {self.caption()}\n{self.code}"

    def __repr__(self) -> str:  # a notebook's plain-text view: the code itself, not the fields
        return str(self)

    def _repr_markdown_(self) -> str:
        return f"`{self.caption()}`\n\n```python\n{self.code}\n```"


def _without_docstring(source: str) -> str:
    tree = ast.parse(source)
    node = tree.body[0]
    body = getattr(node, "body", [])
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
        return source
    if not isinstance(body[0].value.value, str):
        return source
    lines = source.splitlines()
    doc = body[0]
    assert doc.end_lineno is not None  # set by ast.parse
    kept = lines[: doc.lineno - 1] + lines[doc.end_lineno :]
    return "\n".join(kept)


def show_source(obj: object, *, docstring: bool = False) -> SourceView:
    """The code of a public ``course_lib`` function or class, for a lesson to display.

    Parameters
    ----------
    obj : a function or class defined in ``course_lib`` whose name does not start with ``_``.
    docstring : bool, default False
        Keep the docstring in the code shown (off: the lesson's markdown explains the idea).

    Returns
    -------
    SourceView
        Displays as a highlighted code block under a caption naming the module, the file and its
        lines; ``str()`` gives plain text; ``.lines`` counts the lines shown.

    Raises
    ------
    InvalidArgumentError
        (a ``ValueError`` and a ``TypeError``) if ``obj`` is not a function or class, or if it is
        defined outside ``course_lib`` or its name is private (a lesson shows what it can import, and a
        private name may change without notice).

    Examples
    --------
    >>> from course_lib.core.percentiles import nearest_rank
    >>> view = show_source(nearest_rank)
    >>> view.code.splitlines()[0]
    'def nearest_rank(n: int, q: float) -> int:'
    >>> '\"\"\"' in view.code
    False
    """
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        raise InvalidArgumentError(f"obj must be a function or class, got {type(obj).__name__}")
    name = f"{obj.__module__}.{obj.__qualname__}"
    private = any(part.startswith("_") for part in name.split("."))
    if not obj.__module__.startswith("course_lib.") or private:
        raise InvalidArgumentError(
            f"obj must be a public function or class defined in course_lib, got {name}"
        )
    lines, first = inspect.getsourcelines(obj)
    code = textwrap.dedent("".join(lines)).rstrip("\n")
    if not docstring:
        code = _without_docstring(code)
    path = Path(inspect.getfile(obj)).resolve().relative_to(_PACKAGE_ROOT.parent).as_posix()
    return SourceView(name, path, first, first + len(lines) - 1, code)
