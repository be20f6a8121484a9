"""The house plan is a test: each layer imports only from the layers to its left, and nothing imports in a cycle.

``core < churn < serving, optimize < simulate < measure, cost < operate, offline < tools``: a module may
import from a layer further left or from its own top-level package, never from a sibling in the same
layer or from one to its right. The imports are read by ``course_lib.lesson_map`` (function-level ones
included), the same reader that maps modules to lessons.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_lib.lesson_map import ROOT, course_imports

#: Top-level package -> layer rank. Packages of one rank may not import each other.
LAYERS: dict[str, int] = {
    "core": 0,
    "churn": 1,
    "serving": 2,
    "optimize": 2,
    "simulate": 3,
    "measure": 4,
    "cost": 4,
    "operate": 5,
    "offline": 5,
    "grading": 6,
    "lesson_map": 6,
    "course_runner": 6,
}
#: Most top-level entries ``ls course_lib`` may show (issue 22: "at most 15").
MAX_TOP_LEVEL = 15
#: Most modules (files and subpackages) in one package ("about 15"); private modules count too.
MAX_PACKAGE_MODULES = 18
#: A module longer than this many lines says in its docstring why it is one concept (issue 51: modules are
#: cut by concept, not by a line count; the cap is a smell detector, so a long module must explain itself).
MAX_MODULE_LINES = 410
#: The sentence that starts that explanation in a long module's docstring.
LONG_MODULE_MARK = "One concept, one module:"
#: Longest function or method, lines from ``def`` to its last line, docstring included (issue 51).
MAX_FUNCTION_LINES = 80


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go to a sibling in the same layer or to a layer to the right, as readable lines."""
    bad = []
    for module, imported in sorted(graph.items()):
        src = _top(module)
        if src not in LAYERS:  # the course_lib package itself (its lazy env_report) sits above all layers
            continue
        for target in sorted(imported):
            dst = _top(target)
            if dst == src:
                continue
            if dst == "":
                bad.append(f"{module} imports the top-level package course_lib (import the concept module)")
            elif dst not in LAYERS:
                bad.append(f"{module} imports {target}, which is in no layer")
            elif LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{module} (layer {LAYERS[src]}) imports {target} (layer {LAYERS[dst]})")
    return bad


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_import_goes_to_a_layer_on_the_left():
    assert layer_violations(course_imports()) == []


def test_no_module_imports_in_a_cycle():
    assert import_cycles(course_imports()) == []


def test_every_top_level_package_is_in_a_layer():
    packages = {p.name for p in (ROOT / "course_lib").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_the_package_tree_is_readable_from_ls():
    top = [p for p in (ROOT / "course_lib").iterdir() if p.name != "__pycache__"]
    assert len(top) <= MAX_TOP_LEVEL, sorted(p.name for p in top)
    for package in (ROOT / "course_lib").rglob("__init__.py"):
        entries = [
            p
            for p in package.parent.iterdir()
            if p.name not in {"__init__.py", "__main__.py", "__pycache__"}
            and (p.suffix == ".py" or p.is_dir())
        ]
        assert len(entries) <= MAX_PACKAGE_MODULES, (package.parent.name, sorted(p.name for p in entries))


def long_modules_without_a_reason(package_root: Path) -> dict[str, int]:
    """Modules over :data:`MAX_MODULE_LINES` lines whose docstring does not say why (:data:`LONG_MODULE_MARK`)."""
    long = {}
    for path in sorted(package_root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES and LONG_MODULE_MARK not in (ast.get_docstring(ast.parse(text)) or ""):
            long[path.relative_to(package_root.parent).as_posix()] = lines
    return long


def test_a_long_module_says_why_it_is_one_concept():
    assert long_modules_without_a_reason(ROOT / "course_lib") == {}, (
        f"split the module by concept, or say why it is one in its docstring ({LONG_MODULE_MARK} ...)"
    )


def long_functions(package_root: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``path:name`` -> lines of every function or method longer than ``limit`` lines (docstring included)."""
    long = {}
    for path in sorted(package_root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
                continue
            if (lines := node.end_lineno - node.lineno + 1) > limit:
                long[f"{path.relative_to(package_root.parent).as_posix()}:{node.name}"] = lines
    return long


#: Functions still over the limit while issue 51 splits them: the list only shrinks (a new long function fails,
#: and a function split below the limit must leave the list).
NOT_YET_SPLIT: frozenset[str] = frozenset({
    "course_lib/measure/generators/_null.py:generator_limit",
    "course_lib/measure/loadgen.py:run_open_loop",
    "course_lib/measure/rate_sweep.py:sweep_rates",
    "course_lib/measure/waterfall/_bench.py:run_waterfall",
    "course_lib/measure/waterfall/_climb.py:interleaved_climb",
    "course_lib/measure/waterfall/_k6.py:run_k6",
    "course_lib/measure/waterfall/_tools.py:tool_agreement",
    "course_lib/measure/waterfall/_tools.py:tool_comparison",
    "course_lib/offline/job.py:score_store",
    "course_lib/offline/workers.py:run_chunks",
    "course_lib/operate/prometheus_server/_server.py:prometheus_server",
    "course_lib/operate/promtool.py:promtool_test_file",
    "course_lib/serving/batching/predict.py:create_batched_app",
    "course_lib/serving/production/_app.py:create_production_app",
    "course_lib/serving/server/_runners.py:run_processes",
    "course_lib/serving/service/_app.py:create_app",
})  # fmt: skip


def test_no_function_is_longer_than_the_limit():
    assert set(long_functions(ROOT / "course_lib")) == NOT_YET_SPLIT, (
        f"split each function over {MAX_FUNCTION_LINES} lines by meaning (named helpers, one idea each); "
        "remove a split function from NOT_YET_SPLIT"
    )


def test_a_long_module_and_a_long_function_are_caught(planted_tree: Path):
    target = planted_tree / "core" / "waiting.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    target.write_text(target.read_text() + f"\n\ndef _long():\n{body}" + "#\n" * MAX_MODULE_LINES)
    assert long_functions(planted_tree)["course_lib/core/waiting.py:_long"] == MAX_FUNCTION_LINES + 1
    assert "course_lib/core/waiting.py:wait_until" not in long_functions(planted_tree)
    assert "course_lib/core/waiting.py" in long_modules_without_a_reason(planted_tree)
    docstring = ast.get_docstring(ast.parse(target.read_text())) or ""
    target.write_text(target.read_text().replace(docstring, f"{docstring}\n\n{LONG_MODULE_MARK} a test.", 1))
    assert "course_lib/core/waiting.py" not in long_modules_without_a_reason(planted_tree)


#: Packages whose private modules keep their own ``__all__``, with the reason (none: a module that other
#: packages import by name is public, like ``course_lib.core.process``).
OWN_API_LISTS: dict[str, str] = {}


def _defines_all(path: Path) -> bool:
    """Whether the module assigns ``__all__`` at its top level."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def private_modules_with_their_own_list(package_root: Path) -> list[str]:
    """Private modules (``_x.py``) that define ``__all__`` although their package's API is listed once,
    by the package ``__init__`` (or the public module that re-exports them)."""
    return sorted(
        path.relative_to(package_root.parent).as_posix()
        for path in package_root.rglob("_*.py")
        if not path.name.startswith("__")
        and path.parent != package_root  # course_lib/_version.py: the version, no API
        and path.parent.relative_to(package_root.parent).as_posix() not in OWN_API_LISTS
        and _defines_all(path)
    )


def test_a_concept_package_lists_its_public_api_once():
    assert private_modules_with_their_own_list(ROOT / "course_lib") == [], (
        "list the names in the package __init__'s __all__ only, not again in the private module"
    )


def test_every_name_a_package_exports_is_bound():
    for init in sorted((ROOT / "course_lib").rglob("__init__.py")):
        name = ".".join(init.parent.relative_to(ROOT).parts)
        package = importlib.import_module(name)
        missing = [
            n
            for n in getattr(package, "__all__", ())
            if not hasattr(package, n) and importlib.util.find_spec(f"{name}.{n}") is None
        ]
        assert not missing, (name, missing)


def test_the_allowlist_of_own_api_lists_holds_only_packages_that_need_it():
    for folder in OWN_API_LISTS:
        assert any(_defines_all(p) for p in (ROOT / folder).glob("_*.py") if not p.name.startswith("__")), (
            f"{folder} no longer needs its OWN_API_LISTS entry"
        )


def test_a_planted_second_api_list_is_caught(planted_tree: Path):
    target = planted_tree / "serving" / "service" / "_pipeline.py"
    target.write_text(target.read_text() + '\n__all__ = ["ChurnService"]\n')
    assert private_modules_with_their_own_list(planted_tree) == ["course_lib/serving/service/_pipeline.py"]


#: The three reasons a function-level import may have (CONTRIBUTING.md, "Imports at the top of the module").
IMPORT_REASONS = ("cycle", "heavy optional dependency", "subprocess entry point")
_NOQA = re.compile(r"#\s*noqa:[^#\n]*\bPLC0415\b(?P<rest>[^#\n]*)")
_REASON = re.compile(r"^(?:,\s*[A-Z]+[0-9]+)*\s+\((?P<reason>[^:)]+)(?::[^)]+)?\)")


def unexplained_function_level_imports(package_root: Path) -> list[str]:
    """``# noqa: PLC0415`` comments that do not name one of :data:`IMPORT_REASONS` in brackets."""
    bad = []
    for path in sorted(package_root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if (found := _NOQA.search(line)) is None:
                continue
            reason = _REASON.match(found["rest"])
            if reason is None or reason["reason"] not in IMPORT_REASONS:
                bad.append(f"{path.relative_to(package_root.parent).as_posix()}:{number}: {line.strip()}")
    return bad


def test_ruff_checks_function_level_imports_in_course_lib():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert "PLC0415" in config["select"]
    ignored = [path for path, codes in config.get("per-file-ignores", {}).items() if "PLC0415" in codes]
    assert not [path for path in ignored if path.startswith("course_lib")], ignored


def test_every_function_level_import_says_why():
    assert unexplained_function_level_imports(ROOT / "course_lib") == [], (
        f"a function-level import says one of {IMPORT_REASONS}: # noqa: PLC0415 (<reason>[: detail])"
    )


@pytest.mark.parametrize(
    ("comment", "caught"),
    [
        ("# noqa: PLC0415", True),
        ("# noqa: PLC0415 - lazy", True),
        ("# noqa: PLC0415 (faster)", True),
        ("# noqa: PLC0415 (cycle)", False),
        ("# noqa: PLC0415, F401 (subprocess entry point)", False),
        ("# noqa: PLC0415 (heavy optional dependency: skl2onnx)", False),
    ],
)
def test_a_function_level_import_without_a_reason_is_caught(planted_tree: Path, comment: str, caught: bool):
    target = planted_tree / "core" / "waiting.py"
    target.write_text(target.read_text() + f"\n\ndef _late():\n    import json  {comment}\n    return json\n")
    assert bool(unexplained_function_level_imports(planted_tree)) is caught


@pytest.fixture
def planted_tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "course_lib", tmp_path / "course_lib", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path / "course_lib"


def test_a_planted_upward_import_is_caught(planted_tree: Path):
    target = planted_tree / "core" / "checks.py"
    target.write_text(
        target.read_text() + "\n\ndef _late():\n    from course_lib.measure.loadgen import run_open_loop\n"
    )
    bad = layer_violations(course_imports(planted_tree))
    assert bad == ["course_lib.core.checks (layer 0) imports course_lib.measure.loadgen (layer 4)"]


def test_a_planted_sibling_import_is_caught(planted_tree: Path):
    target = planted_tree / "optimize" / "variants.py"
    target.write_text(target.read_text() + "\nfrom course_lib.serving.service import ChurnService\n")
    bad = layer_violations(course_imports(planted_tree))
    assert bad == ["course_lib.optimize.variants (layer 2) imports course_lib.serving.service (layer 2)"]


def test_a_planted_cycle_is_caught(planted_tree: Path):
    target = planted_tree / "core" / "percentiles.py"
    target.write_text(target.read_text() + "\nfrom course_lib.core.bench import interleaved_rounds_ns\n")
    cycles = import_cycles(course_imports(planted_tree))
    # bench -> intervals -> percentiles -> bench: the cycle found holds both ends of the planted import
    assert any({"course_lib.core.bench", "course_lib.core.percentiles"} <= set(c) for c in cycles)


def test_import_course_lib_needs_no_pandas_or_numpy():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pandas', 'numpy'}:\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import course_lib, course_lib.lesson_map\n"
        "print(course_lib.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == __import__("course_lib").__version__
