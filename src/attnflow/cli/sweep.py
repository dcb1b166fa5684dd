"""`attnflow sweep`: run a parameter sweep from a TOML spec into a resumable Zarr store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from attnflow._checks import fail
from attnflow.cli._app import app, fail_line
from attnflow.cli._options import output_path, renamed


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="The sweep spec (TOML; see `attnflow.sweeps`)."),
    scheduler: str = typer.Option(
        None, help="Address of a running Dask scheduler, e.g. tcp://10.0.0.5:8786, or 'serial' "
        "for this process without Dask (default: a local cluster on 127.0.0.1)."),
    workers: int = typer.Option(None, min=1, help="Worker processes of the local cluster "
                                "(default: one per CPU)."),
    out: Path = typer.Option(None, "--out", "-o", help="The Zarr store, created or resumed "
                             "(default: the spec's name with .zarr)."),
    dashboard: str = typer.Option(None, help="Serve the local cluster's dashboard at this "
                                  "address, e.g. 127.0.0.1:8787 (default: no dashboard)."),
    tls_ca_file: Path = typer.Option(None, help="With --scheduler tls://...: the CA "
                                     "certificate that signed the scheduler's (PEM)."),
    tls_cert: Path = typer.Option(None, help="With --scheduler tls://...: this client's "
                                  "certificate (PEM; it may hold the key too)."),
    tls_key: Path = typer.Option(None, help="With --scheduler tls://...: this client's "
                                 "private key (PEM), when not in --tls-cert."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Run every (grid point, seed) of SPEC and store the per-run metrics (and states).

    Rerunning the same command resumes: finished runs are skipped, the rest computed.
    The local cluster talks TLS with temporary credentials of its own; a running scheduler
    that requires TLS takes --tls-ca-file, --tls-cert, --tls-key (or Dask's configuration,
    distributed.comm.tls.*).
    """
    from attnflow.sweeps import SweepIncompleteError, load_spec, nested_note, sweep_status
    from attnflow.sweeps import sweep as run

    out = out if out is not None else spec.with_suffix(".zarr")
    parsed = load_spec(spec)
    with renamed(out="--out", scheduler="--scheduler", workers="--workers",
                 dashboard="--dashboard", security="--tls-ca-file/--tls-cert/--tls-key",
                 **{"workers/dashboard": "--workers/--dashboard"}):
        output_path("--out", out, [".zarr"])
        security = _security(tls_ca_file, tls_cert, tls_key)
        before = sweep_status(out)["pending"] if out.exists() else parsed.n_runs
        start = time.perf_counter()
        try:
            run(parsed, out=out, scheduler=scheduler, workers=workers, dashboard=dashboard,
                security=security, progress=progress)
        except SweepIncompleteError as err:
            fail_line(f"incomplete: {err}", 1)
    wall = time.perf_counter() - start
    counts = sweep_status(out)
    print(f"runs              {parsed.n_runs} ({parsed.n_runs - before} finished before, "
          f"{before} computed now)")
    print(f"done / failed     {counts['done']} / {counts['failed']}")
    note = nested_note(parsed)
    if note is not None:
        print(f"note              {note}")
    print(f"wall time         {wall:.2f} s")
    print(f"written           {out}")


def _security(ca_file: Path | None, cert: Path | None, key: Path | None) -> Any:
    """The `distributed.security.Security` of the --tls-* files (each an existing file),
    encryption required; None when none is given."""
    if ca_file is None and cert is None and key is None:
        return None
    from distributed.security import Security

    for option, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not path.is_file():
            raise fail(option, "an existing PEM file", repr(str(path)))
    if ca_file is None or cert is None:
        raise fail("--tls-ca-file/--tls-cert", "both (the CA and this client's certificate)",
                   f"ca file {ca_file}, certificate {cert}")
    return Security(tls_ca_file=str(ca_file), tls_client_cert=str(cert),
                    tls_client_key=None if key is None else str(key), require_encryption=True)
