"""``weed mini`` is started again on other ports when one of its ports was taken between
their choice and its bind (``s3servers._start_weed``): the collision that failed two
SeaweedFS-backed tests of one run ("bind: address already in use")."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from enroute_testing import s3servers
from enroute_testing.ports import free_port


def test_a_taken_port_makes_it_start_again_on_others(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        chosen: list[int] = []

        def ports() -> Iterator[int]:
            index = list(s3servers._SEAWEED_PORTS).index("volume.port")
            for i in range(len(s3servers._SEAWEED_PORTS)):  # the first start: one taken
                yield port if i == index else free_port()
            while True:
                yield free_port()

        source = ports()

        def next_port(host: str = "127.0.0.1") -> int:
            chosen.append(next(source))
            return chosen[-1]

        monkeypatch.setattr(s3servers, "free_port", next_port)
        with s3servers.seaweedfs_server(buckets=("retry",)) as endpoint:
            assert endpoint.port != port
        assert len(chosen) == 2 * len(s3servers._SEAWEED_PORTS)  # started twice
