"""C git's ``git http-backend`` behind a small threaded HTTP-to-CGI bridge: the benchmark reference.

Every bare repository under ``--root`` is served at ``/<name>.git``; the first
receive-pack request for a missing repository creates it (``git init --bare``),
as Enroute's implicit create does. It prints ``reference ready: URL`` once
serving and, on SIGTERM, ``cgi peak rss kib: N``: the largest VmHWM, summed over
one CGI process tree (http-backend, upload-pack, pack-objects), seen by sampling
every 20 ms.

Usage: ``python -m bench.http_backend --root DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, cast
from urllib.parse import unquote

from bench.report import children_of, hwm_kib

CHUNK_BYTES = 64 * 1024
SAMPLE_S = 0.02
CONFIG = {"http.receivepack": "true", "uploadpack.allowFilter": "true", "safe.directory": "*"}


class Bridge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root: Path
    lock = threading.Lock()
    peak_kib = 0

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small replies

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._cgi()

    def do_POST(self) -> None:
        self._cgi()

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        path = unquote(path)
        env = _env()
        if path.endswith("/git-receive-pack") or "service=git-receive-pack" in query:
            repo = self.root / path.lstrip("/").split(".git/", 1)[0]
            with self.lock:
                if not Path(f"{repo}.git").exists():
                    init = ["git", "init", "-q", "--bare", "-b", "main", f"{repo}.git"]
                    subprocess.run(init, check=True, env=env)
        env |= {"GATEWAY_INTERFACE": "CGI/1.1", "REQUEST_METHOD": self.command}
        env |= {"PATH_INFO": path, "QUERY_STRING": query, "REMOTE_ADDR": "127.0.0.1"}
        env |= {"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1"}
        for key, header in (("CONTENT_TYPE", "Content-Type"), ("GIT_PROTOCOL", "Git-Protocol")):
            if header in self.headers:
                env[key] = self.headers[header]
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
        length = int(self.headers.get("Content-Length", "0"))
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if not chunked and self.command == "POST":
            env["CONTENT_LENGTH"] = str(length)
        cgi = subprocess.Popen(["git", "http-backend"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=env)  # fmt: skip
        assert cgi.stdin is not None and cgi.stdout is not None
        out = cast(io.BufferedReader, cgi.stdout)  # a BufferedReader: read1 returns what is there
        feeder = threading.Thread(target=self._feed, args=(cgi.stdin, chunked, length))
        feeder.start()
        head = b""
        while b"\r\n\r\n" not in head and (data := out.read1(CHUNK_BYTES)):
            head += data
        head, _, rest = head.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while rest or (rest := out.read1(CHUNK_BYTES)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(rest), rest))
            rest = b""
        self.wfile.write(b"0\r\n\r\n")
        feeder.join()
        cgi.wait()

    def _feed(self, sink: IO[bytes], chunked: bool, length: int) -> None:
        try:
            for data in request_body(self.rfile, chunked, length):
                sink.write(data)
        except OSError:
            self.close_connection = True
        finally:
            sink.close()


def request_body(rfile: io.BufferedIOBase, chunked: bool, length: int) -> Iterator[bytes]:
    """A request body's pieces as they arrive: chunked (extensions ignored), or ``length``
    bytes."""
    while chunked and (size := int(rfile.readline().split(b";")[0], 16)):
        yield rfile.read(size)
        rfile.readline()
    if chunked:
        rfile.readline()
    while length > 0 and (data := rfile.read(min(length, CHUNK_BYTES))):
        yield data
        length -= len(data)


def _env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.devnull}
    env |= {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    env["GIT_CONFIG_COUNT"] = str(len(CONFIG))
    for i, (key, value) in enumerate(CONFIG.items()):
        env |= {f"GIT_CONFIG_KEY_{i}": key, f"GIT_CONFIG_VALUE_{i}": value}
    return env


def _tree_kib(pid: int) -> int:
    """VmHWM summed over ``pid`` and its descendants (0 for processes already gone)."""
    try:
        kib, kids = hwm_kib(pid), children_of(pid)
    except (OSError, ValueError):
        return 0
    return kib + sum(_tree_kib(k) for k in kids)


def _sample_cgi_peaks() -> None:
    me = os.getpid()
    while True:
        with contextlib.suppress(OSError):  # each handler thread lists its own children
            for kid in children_of(me):
                Bridge.peak_kib = max(Bridge.peak_kib, _tree_kib(kid))
        time.sleep(SAMPLE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    Bridge.root = args.root.resolve()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Bridge)
    server.daemon_threads = True
    threading.Thread(target=_sample_cgi_peaks, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"reference ready: http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.1)
    print(f"cgi peak rss kib: {Bridge.peak_kib}", flush=True)


if __name__ == "__main__":
    main()
