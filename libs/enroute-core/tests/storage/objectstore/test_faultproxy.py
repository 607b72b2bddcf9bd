"""The fault proxy itself: each fault does what it says, bounded by its rule."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from enroute_testing.faultproxy import FaultKind, FaultProxy, FaultRule
from enroute_testing.s3servers import S3Endpoint, s3_client
from enroute_testing.waiting import wait_until

BUCKET = "enroute-test"  # created by conftest.py
KEY = "proxy-selftest/object"
DATA = bytes(range(256)) * 64


@pytest.fixture
def proxy(moto_endpoint: S3Endpoint, moto_proxy: FaultProxy) -> Iterator[FaultProxy]:
    moto_proxy.reset()
    client = s3_client(moto_endpoint)
    try:
        client.put_object(Bucket=BUCKET, Key=KEY, Body=DATA)
    finally:
        client.close()
    yield moto_proxy
    moto_proxy.reset()


def via(proxy: FaultProxy) -> Any:
    return s3_client(S3Endpoint("moto", "127.0.0.1", proxy.port))


def signed_path(proxy: FaultProxy, method: str, key: str) -> str:
    """A presigned path for the proxy's address (moto refuses anonymous requests)."""
    client = via(proxy)
    try:
        url = str(
            client.generate_presigned_url(
                method, Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=300
            )
        )
    finally:
        client.close()
    return url.removeprefix(proxy.url)


def raw_get(proxy: FaultProxy, timeout_s: float = 5.0) -> http.client.HTTPResponse:
    path = signed_path(proxy, "get_object", KEY)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout_s)
    conn.request("GET", path)
    return conn.getresponse()


def test_rules_are_bounded() -> None:
    with pytest.raises(AssertionError):
        FaultRule(FaultKind.STATUS, times=0)
    with pytest.raises(AssertionError):
        FaultRule(FaultKind.STATUS, times=10**6)
    with pytest.raises(AssertionError):
        FaultRule(FaultKind.DELAY, delay_s=3600)
    with pytest.raises(AssertionError):
        FaultRule(FaultKind.FLIP, flip_mask=0)


def test_skip_and_times_schedule(proxy: FaultProxy) -> None:
    statuses = []
    with proxy.rules(FaultRule(FaultKind.STATUS, method="GET", skip=1, times=2)):
        client = via(proxy)
        try:
            for _ in range(4):
                try:
                    client.list_buckets()
                    statuses.append(200)
                except ClientError as e:
                    statuses.append(int(e.response["ResponseMetadata"]["HTTPStatusCode"]))
        finally:
            client.close()
    assert statuses == [200, 503, 503, 200]
    assert proxy.faults(FaultKind.STATUS) == 2


def test_status_carries_an_s3_error(proxy: FaultProxy) -> None:
    proxy.add(FaultRule(FaultKind.STATUS, status=500, code="InternalError"))
    reply = raw_get(proxy)
    assert reply.status == 500
    assert b"<Code>InternalError</Code>" in reply.read()


def test_truncate_keeps_the_length_and_closes(proxy: FaultProxy) -> None:
    proxy.add(FaultRule(FaultKind.TRUNCATE, keep_bytes=100))
    reply = raw_get(proxy)
    assert reply.status == 200
    assert int(reply.getheader("Content-Length") or 0) == len(DATA)
    with pytest.raises(http.client.IncompleteRead) as caught:
        reply.read()
    assert caught.value.partial == DATA[:100]


def test_flip_changes_exactly_one_byte(proxy: FaultProxy) -> None:
    proxy.add(FaultRule(FaultKind.FLIP, flip_offset=1000, flip_mask=0x10))
    body = raw_get(proxy).read()
    assert len(body) == len(DATA)
    assert [i for i in range(len(DATA)) if body[i] != DATA[i]] == [1000]
    assert body[1000] == DATA[1000] ^ 0x10
    assert raw_get(proxy).read() == DATA  # the rule was used up


def test_reset_answers_nothing(proxy: FaultProxy) -> None:
    proxy.add(FaultRule(FaultKind.RESET))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        raw_get(proxy)
    assert proxy.exchanges()[-1].status is None


def test_delay_drops_a_request_whose_client_left(
    proxy: FaultProxy, moto_endpoint: S3Endpoint
) -> None:
    proxy.add(FaultRule(FaultKind.DELAY, method="PUT", delay_s=1.0))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.2)
    conn.request("PUT", signed_path(proxy, "put_object", "proxy-selftest/dropped"), body=b"x")
    with pytest.raises((socket.timeout, TimeoutError)):
        conn.getresponse()
    conn.close()
    wait_until(lambda: proxy.faults(FaultKind.DELAY) > 0, 3.0, "the proxy counts the delay")
    assert proxy.exchanges()[-1].fault is FaultKind.DELAY
    client = s3_client(moto_endpoint)
    try:
        with pytest.raises(ClientError):
            client.head_object(Bucket=BUCKET, Key="proxy-selftest/dropped")
    finally:
        client.close()


def test_stop_is_bounded(moto_endpoint: S3Endpoint) -> None:
    started = time.monotonic()
    with FaultProxy(moto_endpoint.host, moto_endpoint.port) as proxy:
        proxy.add(FaultRule(FaultKind.DELAY, delay_s=30.0))
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        conn.request("GET", signed_path(proxy, "get_object", KEY))
        time.sleep(0.1)
    conn.close()
    assert time.monotonic() - started < 5.0
