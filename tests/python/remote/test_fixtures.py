"""Tests of the remote-source test servers themselves, with plain clients (http.client, urllib) and without the
safetensors package."""

from __future__ import annotations

import hashlib
import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from .fault_proxy import FaultProxy
from .range_server import RangeServer, overlaps, parse_range
from .s3sign import sign_headers

DATA = bytes(range(256)) * 4096  # 1 MiB, every byte's value is its offset mod 256
# urllib without any proxy from the environment: nothing may leave loopback.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, headers: Optional[dict[str, str]] = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a GET through urllib (redirects followed), HTTP errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with OPENER.open(request, timeout=timeout) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers.items()), error.read()


def get(port: int, path: str, headers: Optional[dict[str, str]] = None, method: str = "GET", timeout: float = 30.0):
    """One request on a fresh http.client connection; returns the response with its body read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


# --- s3sign ------------------------------------------------------------------------------------------------------

AWS_EXAMPLE_KEYS = {"access_key": "AKIAIOSFODNN7EXAMPLE", "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}


@pytest.mark.parametrize(
    "method, url, headers, payload, signature",
    [
        # The four examples of AWS's "Signature Calculations for the Authorization Header: Transferring Payload
        # in a Single Chunk" (Amazon S3 API Reference), all for examplebucket at 20130524T000000Z, us-east-1.
        ("GET", "/test.txt", {"Range": "bytes=0-9"}, b"",
         "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
        ("PUT", "/test$file.text",
         {"Date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"},
         b"Welcome to Amazon S3.", "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
        ("GET", "/?lifecycle", {}, b"", "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ("GET", "/?max-keys=2&prefix=J", {}, b"", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ],
)  # fmt: skip
def test_sigv4_matches_aws_documented_examples(method, url, headers, payload, signature) -> None:
    signed = sign_headers(
        method,
        "https://examplebucket.s3.amazonaws.com" + url,
        headers,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        amz_date="20130524T000000Z",
        **AWS_EXAMPLE_KEYS,
    )
    assert signed["Authorization"].endswith(f"Signature={signature}")
    assert signed["Authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders="
    )
    assert signed["Host"] == "examplebucket.s3.amazonaws.com"


# --- RangeServer -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, status, content_range, body",
    [
        ("bytes=0-9", 206, "bytes 0-9/1048576", DATA[:10]),
        ("bytes=1048570-", 206, "bytes 1048570-1048575/1048576", DATA[-6:]),
        ("bytes=-3", 206, "bytes 1048573-1048575/1048576", DATA[-3:]),
        ("bytes=1048570-2000000", 206, "bytes 1048570-1048575/1048576", DATA[-6:]),
        ("bytes=1048576-", 416, "bytes */1048576", None),
        ("bytes=0-1,4-5", 200, None, DATA),  # a multi-range is ignored, as RFC 9110 allows
        (None, 200, None, DATA),
    ],
)
def test_range_server_ranges(header, status, content_range, body) -> None:
    with RangeServer() as server:
        etag = server.put("/m.bin", DATA)
        response = get(server.port, "/m.bin", {"Range": header} if header else {})
        assert response.status == status
        assert response.getheader("Content-Range") == content_range
        assert response.getheader("ETag") == etag
        assert response.getheader("Last-Modified") is not None
        if body is not None:
            assert response.body == body
            assert server.log[0].body_bytes == len(body)
        assert server.log[0].range == header


def test_range_server_empty_object_and_head() -> None:
    with RangeServer() as server:
        server.put("/empty", b"")
        server.put("/m.bin", DATA)
        assert get(server.port, "/empty").body == b""
        assert get(server.port, "/empty", {"Range": "bytes=0-"}).status == 416
        head = get(server.port, "/m.bin", {"Range": "bytes=5-9"}, method="HEAD")
        assert (head.status, head.getheader("Content-Length"), head.body) == (206, "5", b"")
        assert get(server.port, "/missing").status == 404
        assert [(r.method, r.status, r.body_bytes) for r in server.log[2:]] == [("HEAD", 206, 0), ("GET", 404, 10)]


def test_parse_range_edge_cases() -> None:
    assert parse_range("bytes=5-2", 10) is None  # last < first: invalid, ignored
    assert parse_range("items=0-1", 10) is None
    assert parse_range("bytes=-0", 10) == "unsatisfiable"
    assert parse_range("bytes=-20", 10) == (0, 10)
    assert parse_range(" bytes = 2 - 3", 10) is None  # whitespace inside the spec is not allowed


def test_range_server_etag_if_match_and_replace() -> None:
    with RangeServer() as server:
        old = server.put("/m.bin", DATA)
        assert get(server.port, "/m.bin", {"If-Match": old, "Range": "bytes=0-0"}).status == 206
        new = server.replace("/m.bin", DATA[::-1])
        assert new != old and new.startswith('"') and not new.startswith("W/")
        stale = get(server.port, "/m.bin", {"If-Match": old, "Range": "bytes=0-0"})
        assert (stale.status, stale.getheader("ETag")) == (412, new)
        assert get(server.port, "/m.bin", {"If-Match": f"{old}, {new}"}).status == 200
        assert get(server.port, "/m.bin", {"If-Match": "*"}).status == 200
        assert get(server.port, "/m.bin", {"If-Match": f"W/{new}"}).status == 412  # weak never matches
        with pytest.raises(KeyError):
            server.replace("/other", b"x")


def test_range_server_if_unmodified_since_and_if_range() -> None:
    with RangeServer() as server:
        server.put("/m.bin", DATA, last_modified=1_700_000_000)
        modified = "Tue, 14 Nov 2023 22:13:20 GMT"  # 1_700_000_000
        assert get(server.port, "/m.bin", {"If-Unmodified-Since": modified}).status == 200
        assert get(server.port, "/m.bin", {"If-Unmodified-Since": "Tue, 14 Nov 2023 22:13:19 GMT"}).status == 412
        etag = server.etag("/m.bin")
        assert get(server.port, "/m.bin", {"Range": "bytes=0-3", "If-Range": etag}).status == 206
        changed = get(server.port, "/m.bin", {"Range": "bytes=0-3", "If-Range": '"other"'})
        assert (changed.status, len(changed.body)) == (200, len(DATA))
        assert get(server.port, "/m.bin", {"Range": "bytes=0-3", "If-Range": modified}).status == 206
        server.put("/m.bin", DATA)  # one second later at least
        assert get(server.port, "/m.bin", {"If-Unmodified-Since": modified}).status == 412


def test_range_server_bearer_token() -> None:
    with RangeServer() as server:
        server.put("/private", b"secret bytes", token="tok-123")
        missing = get(server.port, "/private")
        assert (missing.status, missing.getheader("WWW-Authenticate")) == (401, 'Bearer realm="RangeServer"')
        assert get(server.port, "/private", {"Authorization": "Bearer wrong"}).status == 403
        ok = get(server.port, "/private", {"Authorization": "Bearer tok-123"})
        assert (ok.status, ok.body) == (200, b"secret bytes")
        assert [r.header("authorization") for r in server.log] == [None, "Bearer wrong", "Bearer tok-123"]


def test_range_server_redirect_to_another_server() -> None:
    with RangeServer() as front, RangeServer() as back:
        back.put("/real.bin", DATA)
        front.add_redirect("/m.bin", back.url("/real.bin"), status=307)
        status, headers, body = fetch(front.url("/m.bin"), {"Range": "bytes=100-199"})
        assert (status, body) == (206, DATA[100:200])
        assert [(r.status, r.body_bytes) for r in front.log] == [(307, 0)]
        assert [(r.path, r.range, r.span) for r in back.log] == [("/real.bin", "bytes=100-199", (100, 200))]
        assert back.log[0].header("Host") == f"127.0.0.1:{back.port}"
        with pytest.raises(ValueError):
            front.add_redirect("/x", back.url("/x"), status=200)


def test_range_server_keep_alive_log_and_spans() -> None:
    with RangeServer() as server:
        server.put("/dir/a b.bin", DATA)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for first, last in ((0, 99), (100, 199), (150, 249)):
            conn.request("GET", "/dir/a%20b.bin?x-id=1", headers={"Range": f"bytes={first}-{last}", "X-Test": "yes"})
            assert conn.getresponse().read() == DATA[first : last + 1]
        conn.close()
        log = server.requests_for("/dir/a b.bin")
        assert [r.connection for r in log] == [1, 1, 1]  # one connection, kept alive
        assert all(r.header("x-test") == "yes" and r.path == "/dir/a%20b.bin?x-id=1" for r in log)
        assert server.spans("/dir/a b.bin") == [(0, 100), (100, 200), (150, 250)]
        assert overlaps(server.spans("/dir/a b.bin")) == [((100, 200), (150, 250))]
        assert server.bytes_sent() == 300


def test_overlaps() -> None:
    assert overlaps([(0, 10), (10, 20), (20, 20)]) == []
    assert overlaps([(5, 15), (0, 10), (9, 10)]) == [((0, 10), (5, 15)), ((0, 10), (9, 10)), ((5, 15), (9, 10))]


def test_range_server_serves_files(tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    path.write_bytes(DATA * 3)
    with RangeServer() as server:
        server.put("/m.bin", path)
        assert get(server.port, "/m.bin", {"Range": "bytes=1048570-1048585"}).body == (DATA * 3)[1048570:1048586]
        assert get(server.port, "/m.bin").body == DATA * 3


def raw_ranged_get(port: int) -> socket.socket:
    """Opens a connection, GETs byte 0 of /m.bin on it, reads the whole answer and returns the idle connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /m.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\n\r\n")
    answer = b""
    while not (b"\r\n\r\n" in answer and len(answer.partition(b"\r\n\r\n")[2]) == 1):
        piece = sock.recv(1024)
        assert piece, answer
        answer += piece
    assert answer.startswith(b"HTTP/1.1 206")
    return sock


def test_range_server_close_releases_threads_and_port() -> None:
    before = threading.active_count()
    server = RangeServer()
    server.put("/m.bin", DATA)
    idle = raw_ranged_get(server.port)  # an idle keep-alive connection
    server.close()
    server.close()  # idempotent
    assert idle.recv(1024) == b""  # cut by close()
    idle.close()
    assert threading.active_count() == before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


# --- FaultProxy in front of a RangeServer ------------------------------------------------------------------------


@pytest.fixture
def origin():
    with RangeServer() as server:
        server.put("/m.bin", DATA)
        yield server


@pytest.fixture
def proxy(origin):
    with FaultProxy(origin.endpoint) as p:
        yield p


def test_proxy_forwards_requests_unchanged(origin, proxy) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    headers = {"Host": "bucket.example.test:9000", "Range": "bytes=10-19", "X-Amz-Date": "20260101T000000Z"}
    for _ in range(2):
        conn.request("GET", "/m.bin?versionId=1", headers=headers)
        response = conn.getresponse()
        assert (response.status, response.read()) == (206, DATA[10:20])
    conn.close()
    seen = origin.log
    assert [r.header("Host") for r in seen] == ["bucket.example.test:9000"] * 2
    assert seen[0].headers == proxy.log[0].headers
    assert [r.path for r in seen] == ["/m.bin?versionId=1"] * 2
    assert [r.connection for r in seen] == [1, 1]  # the upstream connection is kept alive too
    assert [(r.status, r.body_bytes, r.span, r.fault, r.connection) for r in proxy.log] == [(206, 10, (10, 20), None, 1)] * 2
    assert (proxy.requests, proxy.faults_injected) == (2, 0)


def test_proxy_reset_after(origin, proxy) -> None:
    rule = proxy.reset_after(65536)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.request("GET", "/m.bin")
    response = conn.getresponse()
    assert response.status == 200
    received = 0
    with pytest.raises(ConnectionResetError):
        while chunk := response.read(4096):
            received += len(chunk)
    conn.close()
    assert 0 < received <= 65536
    assert [(r.status, r.body_bytes, r.fault) for r in proxy.log] == [(200, 65536, "reset")]
    assert (rule.fired, proxy.faults_injected) == (1, 1)
    assert fetch(proxy.url("/m.bin"))[2] == DATA  # the rule fired once; the next request passes


def test_proxy_truncate_after(proxy) -> None:
    proxy.truncate_after(1000)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    conn.request("GET", "/m.bin", headers={"Range": "bytes=5000-9999"})
    response = conn.getresponse()
    assert response.getheader("Content-Length") == "5000"  # promised, not sent
    with pytest.raises(http.client.IncompleteRead) as error:
        response.read()
    conn.close()
    assert error.value.partial == DATA[5000:6000]
    assert [(r.body_bytes, r.span, r.fault) for r in proxy.log] == [(1000, (5000, 6000), "truncate")]


def test_proxy_status_twice_then_forward(origin, proxy) -> None:
    proxy.status(503, times=2, headers={"Retry-After": "0"}, body=b"<Error><Code>SlowDown</Code></Error>")
    answers = [fetch(proxy.url("/m.bin"), {"Range": "bytes=0-3"}) for _ in range(3)]
    assert [(a[0], a[1].get("Retry-After")) for a in answers] == [(503, "0"), (503, "0"), (206, None)]
    assert answers[0][2] == b"<Error><Code>SlowDown</Code></Error>" and answers[2][2] == DATA[:4]
    assert len(origin.log) == 1  # injected answers never reach the upstream
    assert [r.fault for r in proxy.log] == ["status", "status", None]


@pytest.mark.parametrize("after_headers", [True, False])
def test_proxy_stall_is_seen_as_a_client_timeout(proxy, after_headers) -> None:
    proxy.stall(120.0, after_headers=after_headers)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.5)
    conn.request("GET", "/m.bin")
    if after_headers:
        response = conn.getresponse()  # the head comes, the body does not
        assert response.status == 200
        with pytest.raises(socket.timeout):
            response.read()
    else:
        with pytest.raises(socket.timeout):
            conn.getresponse()
    conn.close()
    began = time.monotonic()
    proxy.close()  # interrupts the stall
    assert time.monotonic() - began < 10
    assert [r.fault for r in proxy.log] == (["stall"] if after_headers else [])
    assert proxy.requests == 1


def test_proxy_replace_object_before_nth_request(origin, proxy) -> None:
    proxy.replace_object(lambda: origin.replace("/m.bin", DATA[::-1]), nth=2, path="/m.bin")
    first = fetch(proxy.url("/m.bin"), {"Range": "bytes=0-3"})
    second = fetch(proxy.url("/m.bin"), {"Range": "bytes=4-7", "If-Match": first[1]["ETag"]})
    assert first[2] == DATA[:4]
    assert second[0] == 412 and second[1]["ETag"] != first[1]["ETag"]
    assert [r.fault for r in proxy.log] == [None, "replace"]


def test_proxy_rules_count_per_path_and_nth(origin, proxy) -> None:
    origin.put("/other.bin", b"other")
    every = proxy.status(500, nth=2, times=None, path="/m.bin")
    codes = [fetch(proxy.url(p))[0] for p in ("/m.bin", "/other.bin", "/m.bin", "/other.bin", "/m.bin")]
    assert codes == [200, 200, 500, 200, 500]
    assert (every.seen, every.fired) == (3, 2)


def test_proxy_upstream_down_is_502() -> None:
    dead = RangeServer()
    dead.close()
    with FaultProxy(dead.endpoint) as proxy:
        assert fetch(proxy.url("/m.bin"))[0] == 502
        assert proxy.log[0].status == 502


def test_proxy_close_releases_threads() -> None:
    before = threading.active_count()
    with RangeServer() as origin, FaultProxy(origin.endpoint) as proxy:
        origin.put("/m.bin", DATA)
        idle = raw_ranged_get(proxy.port)
    assert idle.recv(1024) == b""
    idle.close()
    assert threading.active_count() == before
