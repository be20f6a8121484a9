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
    python -m course_lib.lesson_map --changed course_lib/serving/batching/rule.py notebooks/03_dynamic_batching.ipynb
                                                        # the notebooks to re-execute, one per line

``--changed`` accepts any paths (for example ``git diff --name-only main``): a course module names the
notebooks that use it, a notebook names itself, anything else is listed on stderr as not mapped.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LessonMap", "build_lesson_map", "course_imports", "main", "module_of", "notebook_imports"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "course_lib"


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
    its private modules (``_x.py``, ``__main__.py``)."""
    modules: dict[str, list[Path]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
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
        """Notebooks to re-execute after ``changed`` files changed, and the changed files the map cannot place.

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


def main(argv: Sequence[str] | None = None) -> int:
    """Print the module -> lesson map, or with ``--changed`` the notebooks to re-execute."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.lesson_map", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--changed", nargs="*", metavar="FILE", help="changed files (e.g. from git diff --name-only)"
    )
    args = parser.parse_args(argv)
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
