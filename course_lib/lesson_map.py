"""Which lessons use which ``course_lib`` module, read from the notebooks' own imports.

Change a module, and every lesson that imports it (directly, or through another course module that
imports it) may print something else: those are the lessons to re-execute. The map is computed, never
written by hand: the import statements of each lesson's code cells (``notebooks/*.ipynb``) and of each
exercise's source notebook (``exercises/source/*/*.ipynb``) give the modules a notebook uses directly;
the import statements of every ``course_lib`` source file (function-level ones included) give what
those modules pull in. A concept module is a public module (``course_lib/core/percentiles.py``) or a
package with its private modules (``course_lib/serving/service/``, ``_app.py`` included).

Command line::

    python -m course_lib.lesson_map                     # module -> lessons, for every module
    python -m course_lib.lesson_map --changed course_lib/serving/batching/rule.py \
        notebooks/03_dynamic_batching.ipynb
                                                        # the notebooks to re-execute, one per line
    python -m course_lib.lesson_map --module-table      # the README's module table (Markdown)
    python -m course_lib.lesson_map --module-table --write README.md   # ... rewritten in place

``--changed`` accepts any paths (for example ``git diff --name-only main``): a course module names the
notebooks that use it, a notebook names itself, anything else is listed on stderr as not mapped.

The module table lists every concept module by layer, in the order of ``course_lib/__init__.py``'s
docstring, with the first line of its docstring (a package: its ``__init__``'s) and the lessons and
problem sets that import it; the README holds it between ``<!-- module-table:start -->`` and
``<!-- module-table:end -->``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MODULE_TABLE_END",
    "MODULE_TABLE_START",
    "LessonMap",
    "build_lesson_map",
    "course_imports",
    "layer_order",
    "main",
    "module_of",
    "module_table",
    "notebook_imports",
    "summary_line",
    "write_module_table",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "course_lib"
MODULE_TABLE_START = "<!-- module-table:start -->"
MODULE_TABLE_END = "<!-- module-table:end -->"
#: The layer that holds the commands and the top-level modules (``lesson_map``, ``course_runner``,
#: ``grading``).
TOOLS = "tools"


def _imported_modules(source: str, known: set[str]) -> set[str]:
    """``course_lib`` concept modules named by the import statements in ``source`` (any depth in the tree).

    ``from course_lib.serving import service`` names ``course_lib.serving.service`` when that is a
    module or package, else the package it was imported from (``from course_lib import env_report``
    names ``course_lib``); an import of a private module (``course_lib.serving.service._app``) names
    the concept package it belongs to.
    """
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if _canonical(name) in known else node.module)
    return {_canonical(m) for m in found} & known


def _canonical(dotted: str) -> str:
    """The concept a dotted module name belongs to: a private module (``_x``) belongs to its package."""
    parts = dotted.split(".")
    while len(parts) > 1 and parts[-1].startswith("_"):
        parts.pop()
    return ".".join(parts)


def _known_modules(package_dir: Path) -> dict[str, list[Path]]:
    """Concept module -> its files: a public module is one file; a package is its ``__init__`` and
    its private modules (``_x.py``, ``__main__.py``). A ``.py`` file in a folder that is no package (no
    ``__init__.py``: package data such as the locustfile Locust runs) is a script, not a module."""
    modules: dict[str, list[Path]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts or not (path.parent / "__init__.py").exists():
            continue
        rel = path.relative_to(package_dir.parent).with_suffix("")
        modules.setdefault(_canonical(".".join(rel.parts)), []).append(path)
    return modules


def module_of(path: str | Path, root: Path = ROOT) -> str | None:
    """The concept module a ``course_lib`` source file belongs to, or None for other files.

    >>> module_of("course_lib/serving/service/_app.py")
    'course_lib.serving.service'
    >>> module_of("course_lib/core/percentiles.py")
    'course_lib.core.percentiles'
    """
    rel = Path(path)
    if rel.is_absolute():
        try:
            rel = rel.resolve().relative_to(root)
        except ValueError:
            return None
    if rel.suffix != ".py" or not rel.parts or rel.parts[0] != PACKAGE:
        return None
    return _canonical(".".join(rel.with_suffix("").parts))


def course_imports(package_dir: Path = ROOT / PACKAGE) -> dict[str, set[str]]:
    """Concept module -> the other ``course_lib`` concept modules it imports (module level or in functions).

    Parameters
    ----------
    package_dir : Path
        The ``course_lib`` folder.

    Returns
    -------
    dict of dotted module name -> set of dotted module names.
    """
    modules = _known_modules(package_dir)
    known = set(modules)
    return {
        name: set().union(*(_imported_modules(p.read_text(encoding="utf-8"), known) for p in paths)) - {name}
        for name, paths in modules.items()
    }


def notebook_imports(path: Path, known: Iterable[str]) -> set[str]:
    """The ``course_lib`` modules imported by the code cells of the notebook at ``path``.

    Raises
    ------
    ValueError
        If ``path`` is not a readable notebook (JSON with a ``cells`` list); the message names it.
    """
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a readable notebook: {exc}") from exc
    names = set(known)
    found: set[str] = set()
    for cell in cells:
        if cell.get("cell_type") == "code":
            found |= _imported_modules("".join(cell.get("source", "")), names)
    return found


def _closure(start: set[str], graph: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


@dataclass(frozen=True)
class LessonMap:
    """Notebooks by the course modules they use.

    Attributes
    ----------
    direct : dict of notebook path (relative to the root) -> modules its cells import.
    uses : dict of notebook path -> every module it runs: its imports and theirs, transitively.
    """

    direct: dict[str, set[str]]
    uses: dict[str, set[str]]

    def lessons_using(self, module: str) -> list[str]:
        """Notebooks whose code runs ``module`` (directly or through another course module), sorted."""
        return sorted(nb for nb, mods in self.uses.items() if module in mods)

    def to_re_execute(self, changed: Iterable[str | Path]) -> tuple[list[str], list[str]]:
        """Notebooks to re-execute after the ``changed`` files changed, and the files the map cannot place.

        A ``course_lib`` source file names every notebook that runs its concept module
        (``course_lib/serving/service/_app.py`` -> ``course_lib.serving.service``); a notebook names
        itself. Paths may be relative to the root or absolute.
        """
        notebooks: set[str] = set()
        unmapped: list[str] = []
        for raw in changed:
            path = Path(raw)
            rel = path.resolve().relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
            if rel in self.uses:
                notebooks.add(rel)
            elif (module := module_of(rel)) is not None:
                notebooks.update(self.lessons_using(module))
            else:
                unmapped.append(rel)
        return sorted(notebooks), unmapped

    def table(self) -> str:
        """Module -> notebooks, one module per line (``*`` marks notebooks that import it themselves)."""
        modules = sorted(set().union(*self.uses.values())) if self.uses else []
        lines = []
        for module in modules:
            users = [nb + ("*" if module in self.direct[nb] else "") for nb in self.lessons_using(module)]
            lines.append(f"{module:<40} {', '.join(users)}")
        return "\n".join(lines)


def build_lesson_map(root: Path = ROOT) -> LessonMap:
    """Read every lesson and exercise source notebook under ``root`` and build the map.

    Returns
    -------
    LessonMap

    Raises
    ------
    ValueError
        If a notebook cannot be read (the message names it).
    """
    graph = course_imports(root / PACKAGE)
    notebooks = sorted((root / "notebooks").glob("*.ipynb")) + sorted(
        (root / "exercises" / "source").glob("*/*.ipynb")
    )
    direct = {nb.relative_to(root).as_posix(): notebook_imports(nb, graph) for nb in notebooks}
    uses = {nb: _closure(mods, graph) for nb, mods in direct.items()}
    return LessonMap(direct=direct, uses=uses)


def layer_order(package_dir: Path = ROOT / PACKAGE) -> list[list[str]]:
    """The layers, left to right, as ``course_lib/__init__.py``'s docstring states them.

    >>> layer_order()[:3]
    [['core'], ['churn'], ['serving', 'optimize']]

    Raises
    ------
    ValueError
        If the docstring has no line of the form ``core < churn < ...``.
    """
    doc = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))) or ""
    for line in doc.splitlines():
        if line.strip().startswith("core <"):
            return [[name.strip() for name in layer.split(",")] for layer in line.split("<")]
    raise ValueError(
        f"{package_dir / '__init__.py'}: no layer order line (core < churn < ...) in the docstring"
    )


def summary_line(path: Path) -> str:
    """The first line of the module docstring in ``path`` (empty if none), read without importing it."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return doc.splitlines()[0].strip() if doc else ""


def _markdown(text: str) -> str:
    """A docstring line as a Markdown table cell: RST roles and double backticks become code spans."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _short(notebook: str) -> tuple[int, str]:
    """Sort key and label of a notebook: lessons first, by number, then problem sets.

    ``notebooks/03_dynamic_batching.ipynb`` -> ``3``, ``exercises/source/ps1/ps1.ipynb`` -> ``ps1``.
    """
    stem = Path(notebook).stem
    head = stem.split("_", 1)[0]
    return (int(head), head.lstrip("0")) if head.isdigit() else (1_000, stem)


def module_table(root: Path = ROOT, lesson_map: LessonMap | None = None) -> str:
    """The README's module table: every concept module by layer, what it is, the notebooks importing it.

    Parameters
    ----------
    root : Path
        The checkout (``course_lib/``, ``notebooks/``, ``exercises/source/``).
    lesson_map : LessonMap, optional
        A map built already (default: :func:`build_lesson_map` of ``root``).

    Returns
    -------
    str
        A Markdown table, one row per concept module (a public module, or a package: its ``__init__``),
        each top-level package first in its group; the last column lists the lessons (by number) and
        problem sets whose own cells import the module.
    """
    lesson_map = lesson_map or build_lesson_map(root)
    modules = _known_modules(root / PACKAGE)
    layers = layer_order(root / PACKAGE)
    rank = {package: (i, j) for i, layer in enumerate(layers) for j, package in enumerate(layer)}

    def group(module: str) -> tuple[int, int]:
        """(layer, position in the layer); ``course_lib`` itself first, the tools last."""
        if module == PACKAGE:
            return (-1, 0)
        return rank.get(module.split(".")[1], rank.get(TOOLS, (len(layers), 0)))

    def summary(module: str) -> str:
        files = modules[module]
        init = [f for f in files if f.name == "__init__.py"]
        return _markdown(summary_line(init[0] if init else files[0]))

    def importers(module: str) -> str:
        users = [nb for nb in lesson_map.lessons_using(module) if module in lesson_map.direct[nb]]
        return ", ".join(label for _, label in sorted(map(_short, users))) or "—"

    rows = ["| layer | module | what it is | imported by (lesson, problem set) |", "|---|---|---|---|"]
    shown_layer = None
    for module in sorted(modules, key=lambda m: (group(m), m)):
        index = group(module)[0]
        label = ""
        if index != shown_layer:
            shown_layer = index
            label = "" if index < 0 else " + ".join(layers[index]) if index < len(layers) else TOOLS
        rows.append(f"| {label} | `{module}` | {summary(module)} | {importers(module)} |")
    return "\n".join(rows) + "\n"


def write_module_table(readme: Path, root: Path = ROOT) -> bool:
    """Rewrite the table between the module-table markers in ``readme``; True if the file changed.

    Raises
    ------
    ValueError
        If ``readme`` lacks the start or end marker (the message names both).
    """
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(MODULE_TABLE_START), text.find(MODULE_TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"{readme} has no {MODULE_TABLE_START} ... {MODULE_TABLE_END} section")
    head = text[: start + len(MODULE_TABLE_START)]
    new = f"{head}\n{module_table(root)}{text[end:]}"
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv: Sequence[str] | None = None) -> int:
    """Print the module -> lesson map, or with ``--changed`` the notebooks to re-execute."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.lesson_map", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--changed", nargs="*", metavar="FILE", help="changed files (e.g. from git diff --name-only)"
    )
    parser.add_argument(
        "--module-table", action="store_true", help="print the README's module table (Markdown)"
    )
    parser.add_argument(
        "--write", metavar="README", type=Path, help="with --module-table: rewrite the table in this file"
    )
    args = parser.parse_args(argv)
    if args.write is not None and not args.module_table:
        parser.error("--write needs --module-table")
    if args.module_table:
        if args.write is None:
            print(module_table(), end="")
        else:
            changed = write_module_table(args.write)
            print(f"{args.write}: module table {'rewritten' if changed else 'already current'}")
        return 0
    lesson_map = build_lesson_map()
    if args.changed is not None:
        if not args.changed:
            print("no changed files: nothing to re-execute")
            return 0
        notebooks, unmapped = lesson_map.to_re_execute(args.changed)
        for nb in notebooks:
            print(nb)
        for rel in unmapped:
            print(f"not mapped (no notebook imports it): {rel}", file=sys.stderr)
        return 0
    print("course_lib module -> notebooks that run it (* = imported by the notebook itself)")
    print(lesson_map.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
