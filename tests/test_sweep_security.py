"""The sweep's own Dask cluster admits only its own client (issue 44): its scheduler talks TLS
with temporary credentials, so a process without them (no TLS, plain TCP, or TLS with
another certificate) is refused within seconds, and one with them is accepted; a running
scheduler that requires TLS is reached with `security=` or the CLI's --tls-* files."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

pytest.importorskip("distributed")
pytest.importorskip("cryptography")

from distributed import Client  # noqa: E402
from distributed.comm import connect  # noqa: E402
from distributed.security import Security  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attnflow.cli import app  # noqa: E402
from attnflow.sweeps import local_cluster, sweep  # noqa: E402

GRID = {"beta": [1.0, 4.0], "n": 6, "d": 2, "t_end": 1.0, "dt": 0.1, "seeds": 2}
SPEC = """[grid]\nbeta = [1.0, 4.0]\nn = 6\nd = 2\nt_end = 1.0\ndt = 0.1\nseeds = 2\n"""


PROBE = """
import sys
from distributed import Client
from distributed.security import Security
security = Security.temporary() if sys.argv[2] == "other" else None
try:
    Client(sys.argv[1], security=security, timeout="5s", set_as_default=False)
except (OSError, TimeoutError, TypeError) as err:
    print(f"{type(err).__name__}: {err}")
    sys.exit(3)
print("connected")
"""


def refused(address: str, credentials: str) -> str:
    """The error of a client connecting to `address` from another process (as another user's
    process would; each probe in a fresh interpreter, so no event loop of a failed client is
    shared; the client gives up after 5 s). credentials: "none" or "other" (a certificate
    of its own, `Security.temporary()`)."""
    out = subprocess.run([sys.executable, "-c", PROBE, address, credentials],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr[-2000:])
    return out.stdout.strip()


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=1) as c:
        yield c


def test_a_client_without_the_credentials_is_refused(cluster):
    address = cluster.scheduler_address
    assert address.startswith("tls://127.0.0.1:")
    assert "TLS" in refused(address, "none")  # no credentials at all
    refused(address.replace("tls://", "tcp://"), "none")  # plain TCP to the TLS port
    refused(address, "other")  # TLS, another certificate
    with Client(address, security=cluster.security, timeout="10s",
                set_as_default=False) as client:
        assert client.submit(sum, [1, 2], pure=False).result() == 3
        workers = list(client.scheduler_info()["workers"])
    # the workers listen with the same credentials: a TLS connection (below Dask's protocol)
    # is refused without them, completed with them
    assert workers and all(w.startswith("tls://127.0.0.1:") for w in workers)
    for address in (cluster.scheduler_address, *workers):
        assert handshake(address, cluster.security)
        assert not handshake(address, Security.temporary())
        assert not handshake(address.replace("tls://", "tcp://"), None)


def handshake(address: str, security: Security | None) -> bool:
    """Whether a connection to `address` with these credentials completes Dask's handshake
    (within 10 s)."""
    async def attempt() -> bool:
        args = {} if security is None else security.get_connection_args("client")
        try:
            comm = await connect(address, timeout=5, **args)
        except (OSError, TimeoutError):
            return False
        await comm.close()
        return True

    start = time.monotonic()
    done = asyncio.run(attempt())
    assert time.monotonic() - start < 10
    return done


def test_the_cli_reaches_a_tls_scheduler_with_its_files(cluster, tmp_path):
    security = cluster.security  # PEM text: written to files as a user would hold them
    (tmp_path / "ca.pem").write_text(security.tls_ca_file)
    (tmp_path / "me.pem").write_text(security.tls_client_cert)
    (tmp_path / "me.key").write_text(security.tls_client_key)
    (tmp_path / "s.toml").write_text(SPEC)
    args = ["sweep", str(tmp_path / "s.toml"), "--scheduler", cluster.scheduler_address,
            "--no-progress", "--out", str(tmp_path / "s.zarr")]
    run = CliRunner().invoke(app, args + [
        "--tls-ca-file", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "me.pem"),
        "--tls-key", str(tmp_path / "me.key")])
    assert run.exit_code == 0, run.output
    assert "done / failed     4 / 0" in run.stdout
    bad = CliRunner().invoke(app, args + ["--tls-cert", str(tmp_path / "me.pem")])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines()[-1].endswith(
        "--tls-ca-file/--tls-cert: expected both (the CA and this client's certificate), "
        f"received ca file None, certificate {tmp_path / 'me.pem'}")

def test_security_only_with_an_address():
    with pytest.raises(ValueError, match=r"^security: expected None unless scheduler is an "):
        sweep(GRID, scheduler="serial", security=Security.temporary())
    with pytest.raises(ValueError, match=r"^security: expected a distributed.security.Sec"):
        sweep(GRID, scheduler="tls://127.0.0.1:1", security="ca.pem")


# Routes of Dask's default HTTP servers beyond /health: the logs, the workers' page, the
# identity, the call stacks, the event stream, the metrics and the static files.
NOT_SERVED = ("/info/main/logs.html", "/info/main/workers.html", "/json/identity.json",
              "/info/call-stacks/x", "/eventstream", "/metrics", "/statics/")


def _status(port: int, path: str) -> int:
    """The HTTP status of GET http://127.0.0.1:port/path (over loopback only)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_without_a_dashboard_the_http_ports_serve_health_only(cluster):
    with Client(cluster.scheduler_address, security=cluster.security, timeout="10s",
                set_as_default=False) as client:
        workers = client.run(lambda dask_worker: dask_worker.http_server.port)
    ports = [cluster.scheduler.http_server.port, *workers.values()]
    assert len(ports) == 2
    for port in ports:
        assert _status(port, "/health") == 200
        assert {path: _status(port, path) for path in NOT_SERVED} == dict.fromkeys(
            NOT_SERVED, 404)
