"""Fixtures the GPU test files share."""

import pytest

from lowbit.kernels import tiled


@pytest.fixture(params=["streamk", "local", "split"])
def dense_path(request, monkeypatch):
    """Run a dense test through each GEMV kernel (auto picks one per shape: tiled.dense_path)."""
    monkeypatch.setattr(tiled, "DENSE_PATH", request.param)
    return request.param
