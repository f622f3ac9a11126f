"""Random DAGs over 2-4 actors: cgraph's results equal the same DAG run by plain Ray."""

from __future__ import annotations

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cgraph
from tests.ray.random_dags import Calc, build, dag_specs, plain_ray, positional_count


@pytest.fixture(scope="module")
def calcs(ray_session):
    actors = [Calc.remote(k) for k in (2, 3, 5, 7)]
    yield actors
    for a in actors:
        ray.kill(a)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=dag_specs(), inputs=st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), min_size=1, max_size=4))
def test_random_dags_match_plain_ray(calcs, spec, inputs):
    dag = build(spec, calcs)
    compiled = cgraph.compile(dag)
    try:
        need = positional_count(spec)  # as with Ray, exactly the positional arguments the DAG reads
        got = [compiled.execute(*(x, y)[:need], k=x - y).get(timeout=60) for x, y in inputs]
    finally:
        compiled.teardown()
    want = [plain_ray(spec, calcs, (x, y), {"k": x - y}) for x, y in inputs]
    assert got == want
