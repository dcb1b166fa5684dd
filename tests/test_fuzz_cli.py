"""Fuzz of the command line: bad inputs to every command (wrong types, NaN and inf, empty,
bad files, out-of-range and conflicting options) each end in exit status 2 and one line on
stderr, ``error: ...``, naming the option or file; never a traceback, and no file is
written (or left half-written).

In process through typer's CliRunner (a subprocess per case would take seconds each); one
subprocess checks the installed entry point itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli import app
from attnflow.sphere import uniform

SPEC = """\
[grid]
beta = [1.0, 4.0]
n = 4
d = 2
t_end = 0.1
seeds = 2
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Good and bad input files, shared by the cases (which must leave them untouched)."""
    import xarray as xr

    tmp = tmp_path_factory.mktemp("inputs")
    af.simulate(af.Attention(beta=4.0), uniform(5, 2, 0), 1.0).save(tmp / "run.nc")
    (tmp / "corrupt.nc").write_bytes(b"\x89HDF\r\n\x1a\n" + b"not a file" * 50)
    xr.Dataset({"a": ("x", np.arange(3))}).to_netcdf(tmp / "foreign.nc", engine="h5netcdf")
    (tmp / "empty.zarr").mkdir()
    (tmp / "folder.nc").mkdir()
    (tmp / "run.csv").write_text("t,x\n0,1\n")
    (tmp / "spec.toml").write_text(SPEC)
    af.sweep(af.sweeps.load_spec(tmp / "spec.toml"), out=tmp / "sweep.zarr",
             scheduler="serial")
    (tmp / "unknown.toml").write_text(SPEC + "sedes = 3\n")
    (tmp / "broken.toml").write_text("[grid\nbeta = 1\n")
    (tmp / "binary.toml").write_bytes(b"\xff\xfe\x00\x01")
    np.save(tmp / "wide.npy", np.ones((2, 3)))
    np.save(tmp / "nan.npy", np.array([[np.nan, 0.0], [0.0, 1.0]]))
    (tmp / "fake.npy").write_text("not numpy")
    (tmp / "model").mkdir()
    from attnflow.pretrained.trace import save_trace, trace_dataset

    resid = np.random.default_rng(0).normal(size=(2, 4, 8))
    save_trace(trace_dataset(resid, resid + 1.0, np.arange(4)), tmp / "bare_trace.zarr")
    return tmp


SIM = ["simulate", "--n", "4", "--t-end", "0.1", "--no-progress"]
RUN = "{in}/run.nc"

# (id, arguments, text the error line must contain). {in}: the inputs folder; {out}: an empty
# folder of the case's own, where nothing may appear.
CASES: list[tuple[str, list[str], str]] = [
    # ---- simulate: each option out of range, of the wrong type, non-finite
    ("out suffix", [*SIM, "--out", "{out}/run.txt"], "--out"),
    ("out in a file", [*SIM, "--out", "{in}/run.nc/x.nc"], "--out"),
    ("out an existing folder", [*SIM, "--out", "{in}/folder.nc"], "--out"),
    ("d 1", [*SIM, "--d", "1", "--out", "{out}/r.nc"], "--d"),
    ("n 0", [*SIM, "--n", "0", "--out", "{out}/r.nc"], "--n"),
    ("n text", [*SIM, "--n", "many", "--out", "{out}/r.nc"], "--n"),
    ("n empty", [*SIM, "--n", "", "--out", "{out}/r.nc"], "--n"),
    ("batch 0", [*SIM, "--batch", "0", "--out", "{out}/r.nc"], "--batch"),
    ("cluster-tol 4", [*SIM, "--cluster-tol", "4", "--out", "{out}/r.nc"], "--cluster-tol"),
    ("cluster-tol -1", [*SIM, "--cluster-tol", "-1", "--out", "{out}/r.nc"], "--cluster-tol"),
    ("cluster-tol nan", [*SIM, "--cluster-tol", "nan", "--out", "{out}/r.nc"], "--cluster-tol"),
    ("beta nan", [*SIM, "--beta", "nan", "--out", "{out}/r.nc"], "--beta"),
    ("beta inf with bdf", [*SIM, "--beta", "inf", "--method", "bdf", "--out", "{out}/r.nc"],
     "--method"),
    ("t-end -1", [*SIM, "--t-end", "-1", "--out", "{out}/r.nc"], "--t-end"),
    ("t-end inf", [*SIM, "--t-end", "inf", "--out", "{out}/r.nc"], "--t-end"),
    ("dt 0", [*SIM, "--dt", "0", "--out", "{out}/r.nc"], "--dt"),
    ("dt nan", [*SIM, "--dt", "nan", "--out", "{out}/r.nc"], "--dt"),
    ("bdf dt beyond the span", [*SIM, "--method", "bdf", "--dt", "5", "--out", "{out}/r.nc"],
     "--dt"),
    ("method unknown", [*SIM, "--method", "rk5", "--out", "{out}/r.nc"], "--method"),
    ("rtol with rk4", [*SIM, "--rtol", "1e-6", "--out", "{out}/r.nc"], "--rtol"),
    ("atol negative", [*SIM, "--method", "dopri5", "--atol", "-1", "--out", "{out}/r.nc"],
     "--atol"),
    ("save-at decreasing", [*SIM, "--save-at", "0,0.08,0.05", "--out", "{out}/r.nc"],
     "--save-at"),
    ("save-at beyond t-end", [*SIM, "--save-at", "0,5", "--out", "{out}/r.nc"], "--save-at"),
    ("save-at text", [*SIM, "--save-at", "a,b", "--out", "{out}/r.nc"], "--save-at"),
    ("save-at empty", [*SIM, "--save-at", "", "--out", "{out}/r.nc"], "--save-at"),
    ("save-at short linspace", [*SIM, "--save-at", "linspace:0:1", "--out", "{out}/r.nc"],
     "--save-at"),
    ("save-at nan", [*SIM, "--save-at", "0,nan", "--out", "{out}/r.nc"], "--save-at"),
    ("seed -1", [*SIM, "--seed", "-1", "--out", "{out}/r.nc"], "--seed"),
    ("seed float", [*SIM, "--seed", "1.5", "--out", "{out}/r.nc"], "--seed"),
    ("dtype float16", [*SIM, "--dtype", "float16", "--out", "{out}/r.nc"], "--dtype"),
    ("mask unknown", [*SIM, "--mask", "diagonal", "--out", "{out}/r.nc"], "--mask"),
    ("mask window 0", [*SIM, "--mask", "window:0", "--out", "{out}/r.nc"], "--mask"),
    ("mask missing file", [*SIM, "--mask", "{in}/missing.npy", "--out", "{out}/r.nc"],
     "--mask"),
    ("V eigenvalue count", [*SIM, "--V", "diag:1,2,3", "--out", "{out}/r.nc"], "--V"),
    ("V nan eigenvalue", [*SIM, "--V", "diag:nan,1", "--out", "{out}/r.nc"], "--V"),
    ("V overflows", [*SIM, "--V", "diag:1e308,1e308", "--out", "{out}/r.nc"], "--V"),
    ("V wide npy", [*SIM, "--V", "{in}/wide.npy", "--out", "{out}/r.nc"], "--V"),
    ("V nan npy", [*SIM, "--V", "{in}/nan.npy", "--out", "{out}/r.nc"], "--V"),
    ("V not npy", [*SIM, "--V", "{in}/fake.npy", "--out", "{out}/r.nc"], "--V"),
    ("Q bad seed", [*SIM, "--Q", "gaussian:x", "--out", "{out}/r.nc"], "--Q"),
    ("K preset unknown", [*SIM, "--K", "spiral", "--out", "{out}/r.nc"], "--K"),
    ("unknown option", [*SIM, "--bogus", "1"], "--bogus"),
    # ---- simulate: conflicting options
    ("text without from-model", [*SIM, "--text", "hi", "--out", "{out}/r.nc"], "--text"),
    ("head without from-model", [*SIM, "--head", "0", "--out", "{out}/r.nc"], "--head"),
    ("n with from-model", ["simulate", "--from-model", "{in}/model", "--n", "5", "--out",
                           "{out}/r.nc"], "--n"),
    ("from-model out suffix", ["simulate", "--from-model", "{in}/model", "--text", "hi",
                               "--out", "{out}/r.txt"], "--out"),
    ("from-model cluster-tol", ["simulate", "--from-model", "{in}/model", "--text", "hi",
                                "--cluster-tol", "4", "--out", "{out}/r.nc"], "--cluster-tol"),
    # ---- plot and animate: bad files, bad options
    ("plot missing file", ["plot", "{in}/missing.nc", "--out", "{out}/p.png"], "missing.nc"),
    ("plot corrupt file", ["plot", "{in}/corrupt.nc", "--out", "{out}/p.png"], "corrupt.nc"),
    ("plot foreign netcdf", ["plot", "{in}/foreign.nc", "--out", "{out}/p.png"],
     "foreign.nc"),
    ("plot sweep store", ["plot", "{in}/sweep.zarr", "--out", "{out}/p.png"], "sweep store"),
    ("plot empty zarr", ["plot", "{in}/empty.zarr", "--out", "{out}/p.png"], "empty.zarr"),
    ("plot csv", ["plot", "{in}/run.csv", "--out", "{out}/p.png"], "run.csv"),
    ("plot out suffix", ["plot", RUN, "--out", "{out}/p.txt"], "--out"),
    ("plot run out of range", ["plot", RUN, "--run", "5", "--out", "{out}/p.png"], "--run"),
    ("plot run negative", ["plot", RUN, "--run", "-1", "--out", "{out}/p.png"], "--run"),
    ("plot t nan", ["plot", RUN, "--t", "nan", "--out", "{out}/p.png"], "--t"),
    ("plot two times", ["plot", RUN, "--kind", "angles", "--t", "0", "--t", "1", "--out",
                        "{out}/p.png"], "--t"),
    ("plot sphere of d 2", ["plot", RUN, "--kind", "sphere", "--out", "{out}/p.png"],
     "RUN_FILE"),
    ("plot kind unknown", ["plot", RUN, "--kind", "cube", "--out", "{out}/p.png"], "--kind"),
    ("plot dpi 0", ["plot", RUN, "--dpi", "0", "--out", "{out}/p.png"], "--dpi"),
    ("plot no out", ["plot", RUN], "--out"),
    ("animate out suffix", ["animate", RUN, "--out", "{out}/m.avi"], "--out"),
    ("animate frames 0", ["animate", RUN, "--frames", "0", "--out", "{out}/m.gif"],
     "--frames"),
    ("animate frames too many", ["animate", RUN, "--frames", "1000", "--out", "{out}/m.gif"],
     "--frames"),
    ("animate fps 0", ["animate", RUN, "--fps", "0", "--out", "{out}/m.gif"], "--fps"),
    ("animate size 10", ["animate", RUN, "--size", "10", "--out", "{out}/m.gif"], "--size"),
    ("animate corrupt file", ["animate", "{in}/corrupt.nc", "--out", "{out}/m.gif"],
     "corrupt.nc"),
    # ---- sweep
    ("sweep missing spec", ["sweep", "{in}/missing.toml", "--out", "{out}/s.zarr"], "spec"),
    ("sweep spec a folder", ["sweep", "{in}/model", "--out", "{out}/s.zarr"], "spec"),
    ("sweep broken toml", ["sweep", "{in}/broken.toml", "--out", "{out}/s.zarr"], "spec"),
    ("sweep binary spec", ["sweep", "{in}/binary.toml", "--out", "{out}/s.zarr"], "spec"),
    ("sweep unknown field", ["sweep", "{in}/unknown.toml", "--out", "{out}/s.zarr"],
     "grid.sedes"),
    ("sweep out suffix", ["sweep", "{in}/spec.toml", "--out", "{out}/s.nc"], "--out"),
    ("sweep out not a store", ["sweep", "{in}/spec.toml", "--scheduler", "serial", "--out",
                               "{in}/empty.zarr"], "--out"),
    ("sweep scheduler unknown", ["sweep", "{in}/spec.toml", "--scheduler", "localhost",
                                 "--out", "{out}/s.zarr"], "--scheduler"),
    ("sweep workers with serial", ["sweep", "{in}/spec.toml", "--scheduler", "serial",
                                   "--workers", "2", "--out", "{out}/s.zarr"], "--workers"),
    ("sweep workers 0", ["sweep", "{in}/spec.toml", "--workers", "0", "--out",
                         "{out}/s.zarr"], "--workers"),
    # ---- spectra and reproduce
    ("spectra missing folder", ["spectra", "{in}/missing-checkpoint-folder", "--out",
                                "{out}/spectra"], "missing-checkpoint-folder"),
    ("spectra not a checkpoint", ["spectra", "{in}/run.nc", "--out", "{out}/spectra"],
     "run.nc"),
    ("spectra layers text", ["spectra", "{in}/model", "--layers", "a,b", "--out",
                             "{out}/spectra"], "--layers"),
    ("reproduce unknown recipe", ["reproduce", "no-such-recipe", "--out", "{out}/r"],
     "no-such-recipe"),
    ("reproduce set without key", ["reproduce", "fig2", "--set", "fig2=3", "--out", "{out}/r"],
     "--set"),
    ("reproduce set unknown key", ["reproduce", "fig2", "--set", "fig2.nn=3", "--out",
                                   "{out}/r"], "nn"),
    # ---- trace
    ("trace unknown model", ["trace", "qwen2", "--text", "hi", "--out", "{out}/t.zarr"],
     "qwen2"),
    ("trace missing file", ["trace", "{in}/missing.gguf", "--text", "hi", "--out",
                            "{out}/t.zarr"], "missing.gguf"),
    ("trace no text", ["trace", "{in}/missing.gguf", "--out", "{out}/t.zarr"],
     "--text/--token-ids"),
    ("trace ids text", ["trace", "{in}/missing.gguf", "--token-ids", "1,a", "--out",
                        "{out}/t.zarr"], "--token-ids"),
    ("trace out suffix", ["trace", "{in}/missing.gguf", "--text", "hi", "--out",
                          "{out}/t.nc"], "--out"),
    # ---- explore
    ("explore out suffix", ["explore", RUN, "--out", "{out}/p.txt"], "--out"),
    ("explore corrupt run", ["explore", "{in}/corrupt.nc", "--out", "{out}/p.html"],
     "corrupt.nc"),
    ("explore view misfit", ["explore", RUN, "--out", "{out}/p.html", "--view", "sphere"],
     "--view"),
    ("explore onto for a run", ["explore", RUN, "--out", "{out}/p.html", "--onto", "sphere"],
     "--onto"),
    ("explore trace no patterns", ["explore", "{in}/bare_trace.zarr", "--out", "{out}/p.html",
                                   "--attention"], "attn.hook_pattern"),
    ("explore trace run", ["explore", "{in}/bare_trace.zarr", "--out", "{out}/p.html", "--run",
                           "1"], "--run"),
    # ---- simulate: the family's parts
    ("simulate mlp text", ["simulate", "--mlp", "swish:4", "--out", "{out}/r.nc"], "--mlp"),
    ("simulate qk-norm text", ["simulate", "--qk-norm", "l2", "--out", "{out}/r.nc"],
     "--qk-norm"),
    ("simulate layers missing run", ["simulate", "--layers", "{in}/missing.nc",
                                     "--out", "{out}/r.nc"], "--layers"),
    # ---- the command group
    ("unknown command", ["simulat"], "simulat"),
]

# Issue 44's fuzz findings (hangs, OverflowError, bad_alloc before): each also answered within
# 10 s (test_former_hangs_are_answered_within_10_s).
BOUNDED: list[tuple[str, list[str], str]] = [
    ("t-end 1e308", [*SIM, "--t-end", "1e308", "--out", "{out}/r.nc"], "--t-end"),
    ("t-end 1e308 dopri5", [*SIM, "--method", "dopri5", "--t-end", "1e308", "--out",
                            "{out}/r.nc"], "--t-end"),
    ("t-end 2^70", [*SIM, "--t-end", str(2**70), "--out", "{out}/r.nc"], "--t-end"),
    ("dt 1e-320", [*SIM, "--dt", "1e-320", "--out", "{out}/r.nc"], "--dt"),
    ("mask window 1e20", [*SIM, "--mask", "window:99999999999999999999", "--out", "{out}/r.nc"],
     "--mask"),
    ("plot dpi 100000", ["plot", RUN, "--dpi", "100000", "--out", "{out}/p.png"], "--dpi"),
    ("animate size 100000", ["animate", RUN, "--size", "100000", "--out", "{out}/m.gif"],
     "--size"),
    ("animate frames of size 8000", ["animate", RUN, "--size", "8000", "--out", "{out}/m.gif"],
     "--frames"),
]
CASES += BOUNDED


def _fill(args: list[str], inputs: Path, out: Path) -> list[str]:
    return [a.replace("{in}", str(inputs)).replace("{out}", str(out)) for a in args]


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def _check(args: list[str], named: str, inputs: Path, out: Path) -> None:
    before = _tree(inputs)
    result = CliRunner().invoke(app, _fill(args, inputs, out))
    assert isinstance(result.exception, SystemExit), result.exception  # no other exception
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert named in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout.strip() == ""  # (reproduce's progress display may end its line)
    assert not any(out.iterdir()), sorted(out.iterdir())  # nothing written, nothing partial
    assert _tree(inputs) == before  # the inputs are untouched


@pytest.mark.parametrize("args, named", [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_bad_input_ends_in_one_line_and_status_2(args, named, inputs, tmp_path):
    _check(args, named, inputs, tmp_path)


@pytest.mark.timeout(10, func_only=True)
@pytest.mark.parametrize("args, named", [pytest.param(a, n, id=i) for i, a, n in BOUNDED])
def test_former_hangs_are_answered_within_10_s(args, named, inputs, tmp_path):
    _check(args, named, inputs, tmp_path)


def test_a_legal_beta_beyond_the_harmonic_truncation_runs(tmp_path):
    """beta = 1e308 is legal: auto leaves the harmonic kernel (whose truncation it would
    overflow) for one that takes it, and the run ends on the circle."""
    out = tmp_path / "r.nc"
    result = CliRunner().invoke(app, [*SIM, "--beta", "1e308", "--out", str(out)])
    assert result.exit_code == 0, result.output
    states = af.load(out).states
    np.testing.assert_allclose(np.linalg.norm(states, axis=-1), 1.0, atol=1e-12)


def test_there_are_enough_cases_and_every_command_is_covered():
    assert len(CASES) >= 60 and len({i for i, _, _ in CASES}) == len(CASES)
    covered = {args[0] for _, args, _ in CASES}
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert commands <= covered, commands - covered


def test_float32_runs_end_to_end(tmp_path):
    out = tmp_path / "run.nc"
    result = CliRunner().invoke(app, [*SIM, "--dtype", "float32", "--d", "3", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    traj = af.load(out)
    assert traj.states.dtype == np.float32
    assert np.array_equal(traj.states[0], uniform(4, 3, 0).astype(np.float32))
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-6)


def test_the_entry_point_prints_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnflow", *SIM, "--cluster-tol", "4",
                           "--out", str(tmp_path / "r.nc")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "error: --cluster-tol: expected a geodesic radius in [0, pi], " \
        "received 4.0\n"
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------- generated
# Every integer and float option of every command (read from the commands typer builds), each
# given values of the wrong kind, out of range or beyond any size: exit 2 and one line naming
# the option. A base command line per command reaches the option's check.
BASES = {"simulate": [*SIM, "--out", "{out}/r.nc"], "plot": ["plot", RUN, "--out", "{out}/p.png"],
         "animate": ["animate", RUN, "--out", "{out}/m.gif"],
         "explore": ["explore", RUN, "--out", "{out}/p.html"],
         "sweep": ["sweep", "{in}/spec.toml", "--out", "{out}/s.zarr"],
         "reproduce": ["reproduce", "fig2", "--out", "{out}/r"],
         "spectra": ["spectra", "{in}/model", "--out", "{out}/spectra"]}
HUGE = [str(2**63), "9" * 30]
# Values that are legal for an option (beta = +-inf is hardmax; an infinite budget is none;
# any non-negative seed is numpy's).
LEGAL = {"--beta": {"inf", "-inf", "1e400"}, "--memory-budget": {"inf", "1e400"}}


def _number_options() -> list[tuple[str, str, type]]:
    import typer

    command = typer.main.get_command(app)
    found = []
    for name, cmd in command.commands.items():
        for param in cmd.params:
            kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if kind in (int, float) and param.opts[0].startswith("--"):
                found.append((name, param.opts[0], kind))
    return found


def _generated() -> list[tuple[str, list[str], str]]:
    cases = []
    for command, option, kind in _number_options():
        values = ["abc", ""]
        if kind is int:
            values += ["1.5", "-1", *([] if "seed" in option else HUGE)]
        else:
            values += ["nan", "inf", "-inf", "1e400"]
        for value in values:
            if value not in LEGAL.get(option, ()):
                cases.append((f"{command} {option} {value!r}", [*BASES[command], option, value],
                              option))
    # integers inside text options: counts and widths (sizes), seeds (any size is legal)
    for option, form, size in (("--save-at", "log:{}", True),
                               ("--save-at", "linspace:0:0.1:{}", True),
                               ("--mlp", "gelu:{}", True), ("--mask", "window:{}", True),
                               ("--mlp", "swiglu:4:{}", False), ("--Q", "gaussian:{}", False),
                               ("--V", "orth:1,2:{}", False)):
        for value in ("-1", "abc", *(HUGE if size else [])):
            cases.append((f"simulate {option} {form.format(value)}",
                          [*BASES["simulate"], option, form.format(value)], option))
    return cases


GENERATED = _generated()


def test_the_generator_covers_every_number_option():
    options = {(c, o) for c, o, _ in _number_options()}
    assert len(options) >= 20
    assert all(any(args[:1] == [c] and o in args for _, args, _ in GENERATED)
               for c, o in options)


@pytest.mark.parametrize("args, named", [pytest.param(a, n, id=i) for i, a, n in GENERATED])
def test_generated_bad_numbers_end_in_one_line_naming_the_option(args, named, inputs,
                                                                 tmp_path):
    _check(args, named, inputs, tmp_path)
