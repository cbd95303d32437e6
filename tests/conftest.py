import mlx.core as mx
import pytest
from hypothesis import HealthCheck, settings

# "ci" by default; `pytest --hypothesis-profile=long` for thousands of examples.
for name, examples in (("ci", 300), ("long", 5000)):
    settings.register_profile(
        name, max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
settings.load_profile("ci")

mx.set_default_device(mx.cpu)


@pytest.fixture(autouse=True)
def _seed():
    mx.random.seed(0)
