import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("default", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Under pytest-xdist each worker would run torch's CPU ops (quantizing test inputs, references)
    # on every core: N workers x all cores oversubscribe the machine. Share the cores instead.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine (run `pytest -m gpu` on a GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        # Other workers share the GPU: a bandwidth or a time measured now says nothing.
        skip = pytest.mark.skip(reason="times the GPU: run `pytest -m timing` without -n")
        for item in items:
            if "timing" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def gen(request):
    """A fresh random generator per test; the seed is printed so a failure can be replayed."""
    seed = int(os.environ.get("LOWBIT_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[{request.node.name}] seed={seed}  (replay: LOWBIT_TEST_SEED={seed})")
    g = torch.Generator().manual_seed(seed)
    return g
