"""The mean-field equation on the circle: the n -> infinity limit of attnflow's particles
(docs/science.md §9, guide: docs/guide/meanfield.md).

The state is the density of tokens on the circle (for the causal mask, one density per
label cell of token positions s in (0, 1]), evolved by the continuity equation
d_t rho + d_theta(rho v[rho]) = (sigma^2 / 2) d_theta^2 rho, pseudo-spectrally in theta.

    >>> import attnflow as af
    >>> import numpy as np
    >>> rho0 = af.meanfield.from_function(lambda t: np.exp(2 * np.cos(t)), modes=64)
    >>> res = af.meanfield.solve(af.Attention(beta=9, mask="full"), rho0, t_end=10)

Modules: `model` (the options read from an attnflow block), `labels` (the causal mask's
label schemes, cells or Chebyshev-Lobatto, and ALiBi per unit label), `spectral` (the
transport term), `sphere` (the same on S^2 in spherical harmonics, either mask), `initial`
(densities from functions, coefficients, tokens), `density` (`Density`: coefficients that
carry their label scheme, which `solve` reads), `solver` (`solve`: time stepping and the
resolution monitor), `result` (`MeanFieldResult`, save / `load`), `sampling` (`sample`: tokens
drawn from a density, i.i.d. or at quantiles, in label order).
"""

from attnflow.meanfield.density import Density
from attnflow.meanfield.initial import from_coefficients, from_function, from_tokens, tail
from attnflow.meanfield.model import MeanFieldModel
from attnflow.meanfield.result import MeanFieldResult, load
from attnflow.meanfield.sampling import density_at, sample, token_labels
from attnflow.meanfield.solver import solve

__all__ = ["Density", "MeanFieldModel", "MeanFieldResult", "density_at", "from_coefficients",
           "from_function", "from_tokens", "load", "sample", "solve", "tail", "token_labels"]
