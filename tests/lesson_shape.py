"""Measures of a lesson's shape (COURSE_DESIGN.md, "The shape of a lesson: idea first").

``python tests/lesson_shape.py notebooks/*.ipynb`` prints each lesson's numbers; ``tests/test_notebooks.py``
holds every lesson to the limits below.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nbformat

#: At most this share of a lesson's code lines may sit inside ``print()`` calls with string literals.
PRINT_PROSE_LIMIT = 0.10
#: The main path (markdown before "How sure are we?") is at most this many words.
MAIN_PATH_WORDS_LIMIT = 2500
#: The closing section's heading.
HOW_SURE_HEADING = re.compile(r"^#+\s+(\d+\.\s*)?How sure are we\?", re.MULTILINE)


def _code(cell_source: str) -> str:
    """The cell as Python: IPython magics and shell lines blanked (kept as lines so numbers hold)."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines()
    )


def _has_text(node: ast.Call) -> bool:
    return any(
        isinstance(sub, ast.JoinedStr) or (isinstance(sub, ast.Constant) and isinstance(sub.value, str))
        for arg in node.args
        for sub in ast.walk(arg)
    )


def print_prose_lines(cell_source: str) -> tuple[int, int]:
    """(lines inside ``print()`` calls with a string literal, non-blank code lines) of one code cell."""
    code = _code(cell_source)
    lines = {
        i + 1
        for i, line in enumerate(code.splitlines())
        if line.strip() and not line.lstrip().startswith("#")
    }
    prose: set[int] = set()
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "print" and _has_text(node):
            assert node.end_lineno is not None
            prose.update(range(node.lineno, node.end_lineno + 1))
    return len(prose & lines), len(lines)


def shape(path: Path) -> dict[str, object]:
    """The lesson's print-prose share, main-path words and whether it closes with "How sure are we?"."""
    nb = nbformat.read(path, as_version=4)
    prose = total = words = 0
    how_sure_at = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            p, t = print_prose_lines(cell.source)
            prose, total = prose + p, total + t
        elif cell.cell_type == "markdown":
            if how_sure_at is None and HOW_SURE_HEADING.search(cell.source):
                how_sure_at = index
            if how_sure_at is None:
                words += len(re.findall(r"[A-Za-z0-9][\w'.,%/-]*", cell.source))
    return {
        "print_prose_share": round(prose / max(total, 1), 3),
        "print_prose_lines": prose,
        "code_lines": total,
        "main_path_words": words,
        "how_sure_cell": how_sure_at,
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(Path(arg).name, json.dumps(shape(Path(arg))))
