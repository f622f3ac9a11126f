"""The README quotes no benchmark number that no results file holds: its tables are what
scripts/readme_tables.py makes from benchmarks/results now (``make bench`` rewrites them)."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from tests.doc_blocks import ROOT

spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
assert spec is not None and spec.loader is not None
readme_tables = importlib.util.module_from_spec(spec)
sys.modules["readme_tables"] = readme_tables
spec.loader.exec_module(readme_tables)


def test_the_readme_tables_are_those_the_results_files_give() -> None:
    readme = (ROOT / "README.md").read_text()
    expected = readme_tables.updated(readme, readme_tables.tables())
    assert readme == expected, "README.md's benchmark tables are stale: run scripts/readme_tables.py"


def test_every_area_links_its_results_and_the_first_four_have_a_table() -> None:
    body = readme_tables.tables()
    for name, _ in readme_tables.AREAS:
        area = name.removesuffix(".json")
        assert f"(benchmarks/bench_{area}.py)" in body or f"(benchmarks/{area}.py)" in body
        assert f"(benchmarks/results/{area}." in body
    assert body.count("\n|---") == 4  # runtime, allreduce, overlap, across nodes; scheduler, channels: a sentence


def test_numbers_outside_the_tables_are_not_benchmark_results() -> None:
    """Measured times (µs, ms, GB/s) appear in the README only between the markers."""
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(readme_tables.BEGIN), readme.index(readme_tables.END)
    outside = readme[:start] + readme[end:]
    assert not re.findall(r"\d[\d.,]*\s*(?:µs|us|ms|GB/s)\b", outside)


def test_the_markers_are_required() -> None:
    with pytest.raises(ValueError, match="needs the lines"):
        readme_tables.updated("# no markers\n", "body")


def test_numbers_are_formatted_as_the_tables_print_them() -> None:
    assert readme_tables.num(10.54) == "10.5"
    assert readme_tables.num(1115.43) == "1,115"
    assert readme_tables.num(305.35, 0) == "305"
    assert readme_tables.pct(0.548) == "55%"
