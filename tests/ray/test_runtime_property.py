"""Random DAGs over 2-4 actors: cgraph's results equal the same DAG run by plain Ray."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cgraph
from tests.ray.random_dags import build, dag_specs, plain_ray, positional_count


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
