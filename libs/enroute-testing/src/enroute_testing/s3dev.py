"""`enroute dev` on a real S3 server (SeaweedFS ``weed mini``) under a disk budget.

For ``make conformance-s3`` (issue 18): the conformance suite starts the command
it is given with ``--data DIR --listen ADDR`` appended, and stops its process
group with SIGTERM. This starts ``weed mini`` under ``DIR/weed``, writes a
configuration with ``store.url: s3://enroute/dev`` and ``node.disk_cache``, runs
``enroute dev`` with it (its stdout is ours, so the ready line reaches the
suite), and stops the S3 server once ``enroute dev`` has ended::

    python -m enroute_testing.s3dev [--disk-cache 2MiB] --data DIR --listen ADDR
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

import yaml

from enroute_testing.devserver import ENROUTE_BIN
from enroute_testing.env import service_env
from enroute_testing.s3servers import s3_client, seaweedfs_server

BUCKET = "enroute"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enroute_testing.s3dev")
    parser.add_argument("--disk-cache", default="2MiB", help="node.disk_cache (default 2MiB)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--listen", required=True)
    args = parser.parse_args(argv)
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)  # the context managers below stop both servers

    signal.signal(signal.SIGTERM, stop)
    with seaweedfs_server(data / "weed", buckets=(BUCKET,)) as s3:
        config = {
            "node": {"disk_cache": args.disk_cache},
            "store": {
                "url": f"s3://{BUCKET}/dev",
                "options": {
                    "endpoint_url": s3.url,
                    "access_key_id": s3.access_key_id,
                    "secret_access_key": s3.secret_access_key,
                    "region": s3.region,
                },
            },
        }
        path = data / "s3dev.yaml"
        path.write_text(yaml.safe_dump(config))
        dev = subprocess.Popen(
            [str(ENROUTE_BIN), "dev", "--data", str(data / "enroute"), "--listen", args.listen,
             "--config", str(path)],
            stdin=subprocess.DEVNULL,
            env=service_env(),
        )  # fmt: skip
        try:
            return dev.wait()
        finally:
            if dev.poll() is None:
                dev.send_signal(signal.SIGTERM)
                dev.wait(timeout=30)
            # what the run stored: the budget is meant as a fraction of it
            client = s3_client(s3)
            stored = sum(
                obj["Size"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
                for obj in page.get("Contents", ())
            )
            print(f"s3dev: {stored} bytes stored, disk budget {args.disk_cache}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
