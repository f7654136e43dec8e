"""Fixtures the GPU test files share."""

import pytest

from lowbit.kernels import tiled


@pytest.fixture(params=["streamk", "local", "split", "bulk"])
def dense_path(request, monkeypatch):
    """Run a dense test through each GEMV kernel (auto picks one per shape: tiled.bulk_ctas, tiled.dense_path; "bulk"
    runs the bulk-copy kernel on the calls it takes, up to 8 tokens, and the CTA-local one on the others)."""
    monkeypatch.setattr(tiled, "DENSE_PATH", request.param)
    return request.param
