"""Which lessons use which ``course_lib`` module, read from the notebooks' own imports.

Change a module, and every lesson that imports it (directly, or through another course module that
imports it) may print something else: those are the lessons to re-execute. The map is computed, never
written by hand: the import statements of each lesson's code cells (``notebooks/*.ipynb``) and of each
exercise's source notebook (``exercises/source/*/*.ipynb``) give the modules a notebook uses directly;
the import statements of ``course_lib/*.py`` (function-level ones included) give what those modules
pull in.

Command line::

    python -m course_lib.lesson_map                     # module -> lessons, for every module
    python -m course_lib.lesson_map --changed course_lib/batching_rule.py notebooks/03_dynamic_batching.ipynb
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

__all__ = ["LessonMap", "build_lesson_map", "course_imports", "main", "notebook_imports"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "course_lib"


def _imported_modules(source: str, known: set[str]) -> set[str]:
    """``course_lib`` modules named by the import statements in ``source`` (any depth in the tree).

    ``from course_lib import cost`` names ``course_lib.cost`` when ``cost`` is a module, else the
    package itself (``from course_lib import env_report``).
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
            if node.module == PACKAGE:
                for alias in node.names:
                    name = f"{PACKAGE}.{alias.name}"
                    found.add(name if name in known else PACKAGE)
            elif node.module.split(".")[0] == PACKAGE:
                found.add(node.module)
    return {m for m in found if m in known}


def _known_modules(package_dir: Path) -> dict[str, Path]:
    modules = {PACKAGE: package_dir / "__init__.py"}
    for path in sorted(package_dir.glob("*.py")):
        if path.name != "__init__.py":
            modules[f"{PACKAGE}.{path.stem}"] = path
    return modules


def course_imports(package_dir: Path = ROOT / PACKAGE) -> dict[str, set[str]]:
    """Module -> the other ``course_lib`` modules it imports (at module level or inside functions).

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
        name: _imported_modules(path.read_text(encoding="utf-8"), known) - {name}
        for name, path in modules.items()
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

        A ``course_lib/<name>.py`` names every notebook that runs ``course_lib.<name>``; a notebook
        names itself. Paths may be relative to the root or absolute.
        """
        notebooks: set[str] = set()
        unmapped: list[str] = []
        for raw in changed:
            path = Path(raw)
            rel = path.resolve().relative_to(ROOT).as_posix() if path.is_absolute() else path.as_posix()
            if rel in self.uses:
                notebooks.add(rel)
            elif rel.startswith(f"{PACKAGE}/") and rel.endswith(".py") and rel.count("/") == 1:
                stem = Path(rel).stem
                module = PACKAGE if stem == "__init__" else f"{PACKAGE}.{stem}"
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
            lines.append(f"{module:<32} {', '.join(users)}")
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
