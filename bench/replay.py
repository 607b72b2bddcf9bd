"""Record one server's answers to a clone, then serve them again byte for byte.

A question ``bench.git`` cannot answer: does a clone cost the git client more
because of the bytes a server sends (the pack's order and offsets, the side-band
and HTTP framing) or because of how the live server sends them (its pacing, its
threads waking beside the client's)? Recorded from each server and replayed by this
one small server, the bytes are the only difference left (docs/benchmarks.md,
"Issue 25 acceptance").

``record``: a proxy to ``--upstream`` that keeps each answer's body, by kind (the
``info/refs`` advertisement, ``ls-refs``, the fetch). ``replay``: answers each
request with the recorded body of its kind, with a Content-Length, in 64 KiB writes.
Clone through ``record`` once, then time clones against ``replay``.

Usage: ``python -m bench.replay record --port P --store DIR --upstream URL`` and
``python -m bench.replay replay --port P --store DIR``.
"""

from __future__ import annotations

import argparse
import http.client
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.http_backend import request_body

WRITE_BYTES = 64 * 1024


def _kind(method: str, body: bytes) -> str:
    """A clone's three requests (a large fetch body is gzipped: told apart by elimination)."""
    if method == "GET":
        return "adv"
    return "ls-refs" if b"command=ls-refs" in body else "fetch"


def handler_for(store: Path, upstream: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def _answer(self, method: str) -> None:
            chunked = "chunked" in self.headers.get("transfer-encoding", "")
            length = int(self.headers.get("content-length") or 0)
            body = b"".join(request_body(self.rfile, chunked, length))
            path = store / _kind(method, body)
            if upstream is not None:
                data, ctype = self._forward(method, body, upstream)
                path.write_bytes(data)
                path.with_suffix(".type").write_text(ctype)
            else:
                data, ctype = path.read_bytes(), path.with_suffix(".type").read_text()
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.send_header("cache-control", "no-cache")
            self.end_headers()
            view = memoryview(data)
            for at in range(0, len(data), WRITE_BYTES):
                self.wfile.write(view[at : at + WRITE_BYTES])

        def _forward(self, method: str, body: bytes, upstream: str) -> tuple[bytes, str]:
            url = urllib.parse.urlparse(upstream)
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
            skip = {"host", "transfer-encoding", "content-length"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            conn.request(method, self.path, body=body if method == "POST" else None,
                         headers=headers)  # fmt: skip
            answer = conn.getresponse()
            return answer.read(), answer.getheader("content-type") or ""

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay")
    parser.add_argument("mode", choices=["record", "replay"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--upstream", help="the server to record (record only)")
    args = parser.parse_args()
    if (args.mode == "record") != (args.upstream is not None):
        parser.error("--upstream is for record, and record needs it")
    args.store.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(args.store, args.upstream))
    print(f"{args.mode} ready: http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
