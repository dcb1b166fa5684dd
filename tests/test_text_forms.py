"""One form for options: every text form the command line takes works in Python too, and
builds the same model as the object form."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow.family import MLP, QKNorm
from attnflow.family.schemes import NGPT
from attnflow.sphere import uniform

X = uniform(6, 4, seed=0)


@pytest.mark.parametrize("text,same", [
    ({"mask": "window:3"}, {"mask": ("window", 3)}),
    ({"mask": "full"}, {"mask": "full"}),
    ({"attention": "sinkhorn:5", "mask": "full"}, {"attention": ("sinkhorn", 5), "mask": "full"}),
    ({"attention": "unnormalised"}, {"attention": "unnormalised"}),
    ({"rope": "100:adjacent:2"}, {"rope": af.RoPE(100.0, "adjacent", 2.0)}),
    ({"rope": "none"}, {}),
    ({"alibi": "default"}, {"alibi": af.ALiBi()}),
    ({"alibi": "0.5"}, {"alibi": 0.5}),
    ({"qk_norm": "rms:0.001"}, {"qk_norm": QKNorm(eps=0.001)}),
    ({"norm": "ngpt:0.3"}, {"norm": NGPT(0.3)}),
    ({"mlp": "gelu:8:2", "V": np.eye(4)}, {"mlp": MLP.random(4, 8, "gelu", 2), "V": np.eye(4)}),
])
def test_the_text_form_builds_the_same_model(text, same):
    np.testing.assert_array_equal(af.Attention(**text).field(X), af.Attention(**same).field(X))


def test_a_window_mask_as_text_is_the_window():
    assert af.Attention(mask="window:5").mask == ("window", 5)


def test_mask_text_from_a_file(tmp_path):
    mask = np.tril(np.ones((6, 6), bool))
    np.save(tmp_path / "m.npy", mask)
    np.testing.assert_array_equal(af.Attention(mask=str(tmp_path / "m.npy")).mask, mask)


@pytest.mark.parametrize("kwargs,pattern", [
    ({"mask": "window:0"}, r"mask: expected window:W with an integer 1 <= W <= 2147483647 \(a "
     r"wider window is 'causal'\), received 'window:0'"),
    ({"attention": "sinkhorn:x"}, r"attention: expected softmax, unnormalised, positional, "
     r"sinkhorn or sinkhorn:IT"),
    ({"rope": "ten"}, r"rope: expected none or BASE"),
    ({"alibi": "steep"}, r"alibi: expected none, default, a slope S"),
    ({"qk_norm": "layer"}, r"qk_norm: expected none, rms or rms:EPS"),
    ({"norm": "ngpt:fast"}, r"norm: expected ngpt:ALPHA with a number ALPHA > 0"),
    ({"mlp": "gelu:8"}, r"mlp: expected a model dimension d"),
])
def test_bad_text_names_the_option(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        af.Attention(**kwargs)
