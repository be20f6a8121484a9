"""Static checks of the lessons (strict nbval executes them; these check what execution cannot)."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lesson_shape import MAIN_PATH_WORDS_LIMIT, PRINT_PROSE_LIMIT, print_prose_lines, shape

import course_lib

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _exports() -> set[str]:
    names: set[str] = set(course_lib.__all__)
    for info in pkgutil.walk_packages(course_lib.__path__, prefix="course_lib."):
        if info.name.endswith(".__main__"):  # a command line, not a library: importing it runs it
            continue
        module = importlib.import_module(info.name)
        names.update(getattr(module, "__all__", ()))
    return names - {"__version__"}


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _parse(source: str) -> ast.Module:
    """A code cell as Python: IPython magics and shell lines dropped, top-level await allowed."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines), feature_version=(3, 11), type_comments=False)


def _defined_names(source: str) -> set[str]:
    tree = _parse(source)
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def test_there_are_lessons():
    assert LESSONS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_never_redefines_what_course_lib_exports(path):
    exported = _exports()
    clashes = sorted({name for src in _code_cells(path) for name in _defined_names(src)} & exported)
    assert not clashes, f"{path.name} defines {clashes}; import them from course_lib instead"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_is_committed_with_outputs_from_one_clean_run(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert all(isinstance(n, int) for n in counts), "every code cell must have been executed"
    assert counts == list(range(1, len(counts) + 1)), "restart the kernel and run all before committing"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, "stored outputs contain an error"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_prints_the_environment_first(path):
    first_code = _code_cells(path)[:3]
    assert any("env_report()" in src for src in first_code), "print env_report() in the first code cells"
    # the README promises it: a kernel that is not the course environment is told what to do
    assert "except ModuleNotFoundError" in first_code[0] and "make lab" in first_code[0], (
        "the first code cell imports course_lib inside try / except ModuleNotFoundError "
        "with advice (as Lesson 1)"
    )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_plot_is_labelled_and_shown(path):
    for src in _code_cells(path):
        if "plt." in src or ".plot(" in src:
            if "plt.show()" not in src:
                continue  # helper cells that only prepare data
            assert "xlabel" in src or "set_xlabel" in src, f"unlabelled x axis in {path.name}:\n{src[:200]}"
            assert "ylabel" in src or "set_ylabel" in src, f"unlabelled y axis in {path.name}:\n{src[:200]}"


# --- The house rules for lessons (README "For contributors"; issue 11 item 3) -------------------------------

#: Top-level functions and classes a lesson may define: plotting and widget helpers only.
HELPER_PREFIXES = ("plot_", "panel_")
MAX_CELL_LINES = 30


def _outputs(path: Path) -> list[dict]:
    nb = json.loads(path.read_text())
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_defines_only_plotting_and_widget_helpers(path):
    found = []
    for src in _code_cells(path):
        for node in _parse(src).body:
            is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if is_def and (isinstance(node, ast.ClassDef) or not node.name.startswith(HELPER_PREFIXES)):
                found.append(node.name)
    assert not found, (
        f"{path.name} defines {found} at top level: "
        "move the logic into course_lib (with tests) and import it; "
        "a lesson may define only plotting/widget functions named "
        f"{HELPER_PREFIXES[0]}* or {HELPER_PREFIXES[1]}*"
    )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_code_cells_are_short(path):
    long = [
        (n, src.splitlines()[0]) for src in _code_cells(path) if (n := len(src.splitlines())) > MAX_CELL_LINES
    ]
    assert not long, f"{path.name}: code cells over {MAX_CELL_LINES} lines (lines, first line): {long}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_stderr(path):
    stderr = [
        "".join(o.get("text", ""))[:200]
        for o in _outputs(path)
        if o.get("output_type") == "stream" and o.get("name") == "stderr"
    ]
    assert not stderr, f"{path.name} stores stderr (warnings, server logs): {stderr}"


def _private_getsource(source: str) -> list[str]:
    found = []
    for node in ast.walk(_parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("getsource", "getsourcelines", "getsourcefile"):
            continue
        target = ast.unparse(node.args[0])
        if any(part.startswith("_") for part in re.split(r"[.\[\]()]", target) if part):
            found.append(target)
    return found


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_never_shows_the_source_of_a_private_name(path):
    found = [t for src in _code_cells(path) for t in _private_getsource(src)]
    assert not found, (
        f"{path.name} shows private code with inspect.getsource: {found}; show public names or prose"
    )


def test_the_rule_checks_catch_what_they_are_for():
    assert _private_getsource("import inspect\nprint(inspect.getsource(cost._replicas_exact))") == [
        "cost._replicas_exact"
    ]
    assert _private_getsource("getsource(_helper)") == ["_helper"]
    assert _private_getsource("inspect.getsource(next_batch_size)") == []
    tree = _parse("%matplotlib inline\nx = await f()\ndef plot_a(): pass\nclass B: pass")
    assert [type(n).__name__ for n in tree.body] == ["Assign", "FunctionDef", "ClassDef"]


def test_ruff_is_clean_on_the_lessons():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, LESSONS)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


# --- Hand-typed numbers next to measured quantities (issue 13 item 1) ---------------------------------------

_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_UNIT = (
    r"(?:\s?(?:ms|µs|us|ns|s|seconds?|minutes?|req/s|requests (?:a|per) second|items a second"
    r"|QPS|MB|KB|KiB|GB|bytes)\b"
    r"|\s?%|x\b|\s?times\b)"
)
_QUANTITY = re.compile(
    r"(?:about |~|roughly |nearly |almost |over |under |up to )?"
    rf"{_NUMBER}(?:\s?(?:to|-|–)\s?{_NUMBER})?{_UNIT}"
)
REVIEWED_NUMBERS = json.loads((ROOT / "tests" / "fixtures" / "reviewed_numbers.json").read_text())


def typed_quantities(path: Path) -> set[str]:
    """Numbers with a unit of time, rate, size, ratio or share typed into a lesson's markdown.

    Code spans are skipped.
    """
    nb = json.loads(path.read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return {m.group(0) for m in _QUANTITY.finditer(re.sub(r"`[^`]*`", "", text))}


def test_the_number_scan_finds_typed_measurements():
    text = "transport is 1.18 ms here, about 300-400 req/s, 2x faster, 97 % hits, 150 MB and `0.5 ms` in code"
    found = {m.group(0) for m in _QUANTITY.finditer(re.sub(r"`[^`]*`", "", text))}
    assert found == {"1.18 ms", "about 300-400 req/s", "2x", "97 %", "150 MB"}


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_typed_number_next_to_a_measured_quantity_was_reviewed(path):
    """A number with a unit in prose must be a source's figure, arithmetic on one, a constant of the course
    or a deterministic output; anything measured on the student's machine is printed by code or asserted
    as a bound. New hits are listed for review: check each against the rule, then add it to
    tests/fixtures/reviewed_numbers.json under the reason that applies
    (``python tests/test_notebooks.py notebooks/NN_x.ipynb`` prints them)."""
    reviewed = {n for numbers in REVIEWED_NUMBERS.get(path.name, {}).values() for n in numbers}
    new = sorted(typed_quantities(path) - reviewed)
    assert not new, f"{path.name}: typed numbers next to measured quantities, not yet reviewed: {new}"
    gone = sorted(reviewed - typed_quantities(path))
    assert not gone, (
        f"{path.name}: reviewed numbers no longer in the lesson (remove them from the list): {gone}"
    )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_image_output_has_alt_text(path):
    """A figure's alternative text is the cell metadata key ``alt``.

    ``make html``'s template writes it into the page.
    """
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if not any(k.startswith("image/") for o in cell.get("outputs", []) for k in o.get("data", {})):
            continue
        alt = cell.get("metadata", {}).get("alt")
        assert isinstance(alt, str) and alt.strip(), (
            f"{path.name}, cell {index}: an image output without alt text; add a cell-metadata key 'alt' "
            "that describes the figure (panels, axes with units and scales, series, reference lines)"
        )


if __name__ == "__main__":  # list a lesson's typed quantities for review
    for arg in sys.argv[1:]:
        print(json.dumps({Path(arg).name: sorted(typed_quantities(Path(arg)))}, indent=1, ensure_ascii=False))


# ----------------------------------------------------------------------------- the shape of a lesson
# COURSE_DESIGN.md, "The shape of a lesson: idea first"; the measures live in tests/lesson_shape.py.


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_shows_its_mechanism_from_the_package(path):
    cells = json.loads(path.read_text())["cells"]
    shown = [
        "".join(out.get("data", {}).get("text/plain", ""))
        for cell in cells
        if cell["cell_type"] == "code" and "show_source(" in "".join(cell["source"])
        for out in cell.get("outputs", [])
        if out.get("output_type") in ("execute_result", "display_data")
    ]
    assert shown, f"{path.name}: no cell renders a core with course_lib.core.source.show_source"
    long = [text.splitlines()[0] for text in shown if len(text.splitlines()) - 1 > 60]
    assert not long, f"{path.name}: cores over 60 lines: {long}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_states_conclusions_in_markdown_not_printed_prose(path):
    measured = shape(path)
    assert measured["print_prose_share"] <= PRINT_PROSE_LIMIT, (
        f"{path.name}: {measured['print_prose_lines']} of {measured['code_lines']} code lines sit inside "
        f"print() calls with text (limit {PRINT_PROSE_LIMIT:.0%}); state conclusions in markdown"
    )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_closes_with_how_sure_are_we_and_keeps_its_main_path_short(path):
    measured = shape(path)
    assert measured["how_sure_cell"] is not None, f'{path.name}: no closing "How sure are we?" section'
    assert measured["main_path_words"] <= MAIN_PATH_WORDS_LIMIT, (
        f"{path.name}: {measured['main_path_words']} words before How sure are we? "
        f"(limit {MAIN_PATH_WORDS_LIMIT})"
    )


def test_the_print_prose_measure_counts_only_prints_with_text():
    cell = 'x = 1\nprint(x)\nprint(f"p99 {x} ms",\n      "and more")\n# a comment\n%time x\n'
    assert print_prose_lines(cell) == (2, 4)
