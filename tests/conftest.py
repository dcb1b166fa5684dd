"""Shared fixtures: small random problems with fixed seeds."""

from __future__ import annotations

import os

import numpy as np
import pytest

# Without a GPU the Triton kernels' tests run in Triton's interpreter, which Triton selects by
# TRITON_INTERPRET when triton is first imported: set here, before any test module loads it.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


def random_matrix(rng: np.random.Generator, d: int) -> np.ndarray:
    """A Gaussian (d, d) matrix with entries of variance 1/d."""
    return rng.standard_normal((d, d)) / np.sqrt(d)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture(scope="session", autouse=True)
def weight_cache(tmp_path_factory):
    """Dequantised weights go to a cache of the test session's own, not the user's
    (~/.cache/attnflow); subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFLOW_CACHE", str(tmp_path_factory.mktemp("weight-cache")))
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch's intra-op threads on tiny tensors: on a loaded 2-core machine, each call
    waits milliseconds at the OpenMP barrier for a descheduled thread (8 us -> 35 ms). The
    torch test modules use it (`pytestmark`)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
