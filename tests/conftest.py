import mlx.core as mx
import pytest

mx.set_default_device(mx.cpu)


@pytest.fixture(autouse=True)
def _seed():
    mx.random.seed(0)
