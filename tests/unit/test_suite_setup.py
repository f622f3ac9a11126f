"""The test suite's own set-up: ``make test`` runs tests/unit, tests/ray and tests/gpu in
one pytest process, and Ray starts once per process, so every test that needs Ray uses
the session's ``ray_session`` (tests/conftest.py) instead of calling ``ray.init``.

Scripts that tests start as their own processes (``*_script.py``) start their own Ray.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
RAY_INIT = re.compile(r"\bray\.init\(")


def test_only_the_session_fixture_starts_ray_in_the_pytest_process() -> None:
    callers = sorted(
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if RAY_INIT.search(path.read_text()) and not path.name.endswith("_script.py")
    )
    assert callers == ["conftest.py"], f"start Ray through the ray_session fixture instead: {callers}"


def test_the_session_fixture_gives_ray_the_machines_gpus_or_logical_ones() -> None:
    text = (TESTS / "conftest.py").read_text()
    assert "num_gpus=_cuda_devices() or LOGICAL_GPUS" in text  # tests/gpu places actors on real GPUs
