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
    expected = readme_tables.generated(readme)
    assert readme == expected, "README.md's tables or GPU status are stale: run scripts/readme_tables.py"


def test_the_gpu_status_comes_from_the_runs_recorded() -> None:
    readme = (ROOT / "README.md").read_text()
    status = readme_tables.gpu_status(readme_tables.load("gpu.json"))
    assert status in readme and readme.count("GPU run") == 1, "one statement of the GPU status"
    assert readme_tables.gpu_status({"runs": []}) == "**No GPU has run these checks yet.**"
    run = {"date": "2027-01-02", "gpus": ["A", "A"], "torch": "t", "cuda": "c", "nccl": "n",
           "checks": {"PASS": 5, "FAIL": 1, "NOT RUN": 0}, "not_run": [],
           "sanitizer": {"PASS": 1, "FAIL": 0, "NOT RUN": 0}, "overlap_example": "PASS"}
    text = readme_tables.gpu_status({"runs": [{}, run]})
    assert text.startswith("**Last GPU run: 2027-01-02, 2 GPU (A, A)") and "1 checks failed" in text
    assert text.endswith("Runs recorded: 2.")


def test_every_area_links_its_results_and_the_first_four_have_a_table() -> None:
    body = readme_tables.tables()
    for name, _ in readme_tables.AREAS:
        area = name.removesuffix(".json")
        script = readme_tables.SCRIPTS.get(area, area)
        assert f"(benchmarks/bench_{script}.py)" in body or f"(benchmarks/{script}.py)" in body
        assert f"(benchmarks/results/{area}." in body
    assert body.count("\n|---") == 4  # runtime, allreduce, overlap, across nodes; scheduler, channels: a sentence


def test_numbers_outside_the_tables_are_not_benchmark_results() -> None:
    """Measured times (µs, ms, GB/s) appear in the README only between the markers of its two
    generated parts (the benchmark tables, the GPU status)."""
    readme = (ROOT / "README.md").read_text()
    for begin, end_marker in ((readme_tables.BEGIN, readme_tables.END),
                              (readme_tables.GPU_BEGIN, readme_tables.GPU_END)):
        start, end = readme.index(begin), readme.index(end_marker)
        readme = readme[:start] + readme[end:]
    assert not re.findall(r"\d[\d.,]*\s*(?:µs|us|ms|GB/s)\b", readme)


def test_the_gpu_status_quotes_the_overlap_benchmark_of_its_last_run() -> None:
    run = {"date": "d", "gpus": ["G"], "torch": "t", "cuda": "c", "nccl": "n", "not_run": [],
           "checks": {"PASS": 1, "FAIL": 0, "NOT RUN": 0}, "sanitizer": {"PASS": 1, "FAIL": 0},
           "overlap_example": "PASS"}
    assert "overlap benchmark" not in readme_tables.gpu_status({"runs": [run]})
    run["overlap_bench"] = {"cgraph_ms": {"no_overlap": 2.0, "overlap": 1.5, "compute_alone": 1.0, "comm_alone": 1.0},
                            "ray_cg_ms": {"no_overlap": 9.0}, "ray_cg_transport": "shm",
                            "derived": {"cgraph_time_cut_by_overlap": "25%"}}
    text = readme_tables.gpu_status({"runs": [run]})
    assert "cgraph 2.0 ms without overlap, 1.5 ms with it" in text and "Ray CG 9.0 ms over shm" in text


def test_the_markers_are_required() -> None:
    with pytest.raises(ValueError, match="needs the lines"):
        readme_tables.updated("# no markers\n", "body")


def test_numbers_are_formatted_as_the_tables_print_them() -> None:
    assert readme_tables.num(10.54) == "10.5"
    assert readme_tables.num(1115.43) == "1,115"
    assert readme_tables.num(305.35, 0) == "305"
    assert readme_tables.pct(0.548) == "55%"


def test_a_gpu_run_is_appended_to_the_record(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    rows = [("a", "PASS", ""), ("b", "NOT RUN", "needs two GPUs"), ("c", "PASS", "")]
    assert gpu_check.counts(rows) == {"PASS": 2, "FAIL": 0, "NOT RUN": 1}
    path = tmp_path / "gpu.json"
    gpu_check.record({"date": "d1"}, path)
    gpu_check.record({"date": "d2"}, path)
    assert [r["date"] for r in readme_tables.json.loads(path.read_text())["runs"]] == ["d1", "d2"]
