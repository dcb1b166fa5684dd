"""Pictures of token dynamics: the circle, the sphere, time series, attention maps, movies.

Every function takes a `Trajectory` and returns a matplotlib Figure (drawn without pyplot,
so it works headless, in scripts and in notebooks); pass ``ax=`` to draw into your own axes
and compose panels. Conventions of the paper's figures (docs/science.md §5):

* tokens are coloured by their index k (the arrival order; dark = early, light = late) with
  a colour map whose lightness increases monotonically, so it survives greyscale printing;
* final positions are red (Fig. 1); strong Rényi centers are red and Rényi centers black
  (Fig. 2), with delta = 4 beta^{-1/2} (at most pi) by default (docs/science.md §3, §4);
  being defined by the arrival order, centers are marked (and the index called the arrival
  order) by default for causal runs only, not for full attention;
* for d larger than the picture (d > 2 on the circle, d > 3 on the sphere) tokens are
  projected orthogonally onto two or three orthonormal directions: the top principal
  directions of the plotted states (default), eigenvectors of V, or any given directions;
  projected points lie inside the unit disk or ball, and the axes say which directions.

Times are the saved times of the trajectory (one unit = one layer); a requested time selects
the nearest saved time and the picture is labelled with the time actually shown.

Any model is drawn, a `Stack` of different layers included: what is drawn are the token
directions x / |x| (`Trajectory.directions`: the states themselves on the sphere); an
attention map is that of the layer acting at the time shown (layer L acts on [L, L + 1)) or
of a chosen ``layer``; the default radii (delta, tol) take beta from the layer acting at the
first time shown; eigenvectors of V come from one chosen layer (`frame`, default the first).

The pictures live in one module each: `projection` (`frame`, `Frame`), `circle`, `sphere`,
`series` (counts and angles against time; any registered quantity, `plot_metric`),
`attention`, `movies` (`animate`) and `meanfield` (a mean-field density against time and
angle with the particles' histogram beside it; the particles' Fourier moments in their
1/sqrt(n) band).
"""

# The style's constants stay reachable as attnflow.plot.STYLE etc., as before the split.
from attnflow.plot._style import COLUMN as COLUMN
from attnflow.plot._style import DEFAULT_VIEW as DEFAULT_VIEW
from attnflow.plot._style import RED as RED
from attnflow.plot._style import STYLE as STYLE
from attnflow.plot._style import TOKEN_CMAP as TOKEN_CMAP
from attnflow.plot.attention import plot_attention
from attnflow.plot.circle import plot_circle
from attnflow.plot.meanfield import plot_meanfield, plot_moments
from attnflow.plot.movies import animate
from attnflow.plot.projection import Frame, frame
from attnflow.plot.series import plot_angles, plot_metric, plot_timeseries
from attnflow.plot.sphere import plot_sphere

__all__ = [
    "Frame",
    "animate",
    "frame",
    "plot_angles",
    "plot_attention",
    "plot_circle",
    "plot_meanfield",
    "plot_metric",
    "plot_moments",
    "plot_sphere",
    "plot_timeseries",
]
