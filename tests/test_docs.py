"""The prose that describes the code stays true: the README's module table is the generated one, every
``course_lib`` path the docs name exists, and every concept module has a one-line summary a table can show."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from test_layers import LAYERS

from course_lib.lesson_map import (
    MODULE_TABLE_END,
    MODULE_TABLE_START,
    _known_modules,
    layer_order,
    module_table,
    summary_line,
    write_module_table,
)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: Prose that names course_lib's modules and must name only ones that exist. CHANGELOG.md is left out on
#: purpose: its 0.1.0 -> 0.2.0 table names the old modules.
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
REGENERATE = "make module-table (python -m course_lib.lesson_map --module-table --write README.md)"


def _readme_table(text: str) -> str:
    start, end = text.index(MODULE_TABLE_START), text.index(MODULE_TABLE_END)
    return text[start + len(MODULE_TABLE_START) : end].lstrip("\n")


def test_the_readme_module_table_is_the_generated_one():
    assert _readme_table(README.read_text(encoding="utf-8")) == module_table(), (
        f"README.md's module table is out of date: run {REGENERATE}"
    )


def test_the_table_lists_every_concept_module_once_in_layer_order():
    table = module_table()
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    listed = [re.search(r"`(course_lib[\w.]*)`", row).group(1) for row in rows]
    assert sorted(listed) == sorted(_known_modules(ROOT / "course_lib"))
    layer_labels = [row.split("|")[1].strip() for row in rows if row.split("|")[1].strip()]
    assert layer_labels == [" + ".join(layer) for layer in layer_order()]
    batcher = next(row for row in rows if "`course_lib.serving.batching.batcher`" in row)
    assert batcher.rstrip(" |").endswith("| 3"), batcher  # Lesson 3 imports the batcher, no other notebook


def test_the_layer_order_the_table_reads_is_the_one_the_layer_test_enforces():
    order = layer_order()
    assert order[-1] == ["tools"]
    ranks = {package: i for i, layer in enumerate(order) for package in layer}
    # grading, lesson_map and course_runner are the tools
    assert {name: ranks.get(name, ranks["tools"]) for name in LAYERS} == LAYERS, order


def test_write_module_table_rewrites_only_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{MODULE_TABLE_START}\n| stale |\n{MODULE_TABLE_END}\n\nafter\n")
    assert write_module_table(readme) is True
    text = readme.read_text()
    assert text.startswith("# title\n\n") and text.endswith(f"{MODULE_TABLE_END}\n\nafter\n")
    assert _readme_table(text) == module_table() and "| stale |" not in text
    assert write_module_table(readme) is False


def test_write_module_table_refuses_a_file_without_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no table here\n")
    with pytest.raises(ValueError, match="module-table:start"):
        write_module_table(readme)


@pytest.mark.parametrize(
    "module", sorted(_known_modules(ROOT / "course_lib")), ids=lambda m: m.removeprefix("course_lib.")
)
def test_every_concept_module_has_a_one_line_summary(module):
    """PEP 257: a summary line that fits on one line, ends with a period and is followed by a blank line."""
    files = _known_modules(ROOT / "course_lib")[module]
    path = next((f for f in files if f.name == "__init__.py"), files[0])
    first = summary_line(path)
    assert first.endswith("."), f"{path}: the docstring's first line is not a whole sentence: {first!r}"
    text = path.read_text(encoding="utf-8")
    after = text.split(first, 1)[1].split("\n", 2)
    assert after[0] == '"""' or (after[0] == "" and after[1].strip() == ""), (
        f"{path}: the summary runs onto a second line; make the first line the whole summary"
    )


def _resolves(dotted: str) -> bool:
    """True if ``dotted`` is an importable module, or an attribute reached from one."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj = importlib.import_module(name)
            for attr in parts[k:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_the_resolver_tells_real_names_from_moved_ones():
    assert _resolves("course_lib.serving.batching.rule.next_batch_size")
    assert _resolves("course_lib.cost")
    assert not _resolves("course_lib.batching_rule")
    assert not _resolves("course_lib.serving.batching.rule.poisson_arrivals_ms")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_course_lib_name_and_path_in_the_docs_exists(doc):
    text = doc.read_text(encoding="utf-8")
    dotted = sorted(set(re.findall(r"\bcourse_lib(?:\.[A-Za-z_]\w*)+", text)))
    paths = sorted(set(re.findall(r"\bcourse_lib/[\w/.]*\w/?", text)))
    assert dotted or doc.name != "README.md"
    assert not [name for name in dotted if not _resolves(name)]
    assert not [path for path in paths if not (ROOT / path).exists()]
