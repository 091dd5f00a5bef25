"""Tests of the remote-source test servers themselves, with plain clients (http.client, urllib, curl) and without
the safetensors package. `-m s3` selects the SeaweedFS tests, `-m "not s3"` the rest."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import itertools
import os
import resource
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from .fault_proxy import FaultProxy
from .range_server import RangeServer, overlaps, parse_range
from .s3sign import EMPTY_SHA256, sign_headers
from .seaweed import SeaweedS3

CURL = shutil.which("curl")
s3 = pytest.mark.s3
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
    ids=["get-object", "put-object", "get-bucket-lifecycle", "list-objects"],
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
    ids=["a-b", "a-", "-n", "a-past-end", "unsatisfiable", "multi-range", "no-range"],
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


def test_overlaps_lists_each_pair_of_spans_that_share_a_byte() -> None:
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
    # The dead upstream is a port bound and never listened on, held for the whole test: connecting to it is refused.
    # A server closed before the proxy starts would free its port, and the proxy, taking a free port of its own,
    # could get that same one and forward every request to itself until the client timed out.
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{dead.getsockname()[1]}"
        with FaultProxy(upstream) as proxy:
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


# --- SeaweedFS ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CurlResult:
    status: int
    headers: dict[str, str]  # of the final response, names lowercased
    body: bytes


@pytest.fixture
def curl(tmp_path: Path):
    """Runs curl (never through a proxy) and returns a CurlResult; `sign` is (access key, secret key)."""
    if CURL is None:
        pytest.skip("the curl command line tool is not installed")
    counter = itertools.count()

    def run(url: str, *args: str, sign: Optional[tuple[str, str]] = None, region: str = "us-east-1") -> CurlResult:
        n = next(counter)
        head, body = tmp_path / f"curl{n}.head", tmp_path / f"curl{n}.body"
        command = [CURL, "-sS", "--noproxy", "*", "--max-time", "60", "-D", str(head), "-o", str(body)]
        command += ["-w", "%{http_code}"]
        if sign is not None:
            command += ["--aws-sigv4", f"aws:amz:{region}:s3", "--user", f"{sign[0]}:{sign[1]}"]
        proc = subprocess.run([*command, *args, url], capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()
        blocks = head.read_text("latin-1").strip().split("\r\n\r\n")
        headers = {}
        for line in blocks[-1].splitlines()[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return CurlResult(int(proc.stdout), headers, body.read_bytes() if body.exists() else b"")

    return run


def admin(server: SeaweedS3) -> tuple[str, str]:
    return (server.access_key, server.secret_key)


@s3
def test_seaweed_write_then_range_read(seaweed_s3: SeaweedS3, curl) -> None:
    bucket = seaweed_s3.new_bucket()
    etag = seaweed_s3.put_object(bucket, "dir/m.bin", DATA)
    url = seaweed_s3.endpoint + seaweed_s3.object_path(bucket, "dir/m.bin")
    full = curl(url, sign=admin(seaweed_s3))
    assert (full.status, full.body, full.headers["etag"]) == (200, DATA, etag)
    ranged = curl(url, "-H", "Range: bytes=1000-1999", sign=admin(seaweed_s3))
    assert (ranged.status, ranged.body) == (206, DATA[1000:2000])
    assert ranged.headers["content-range"] == f"bytes 1000-1999/{len(DATA)}"
    assert ranged.headers["etag"] == etag  # a ranged GET carries the ETag
    assert curl(url, "-H", "Range: bytes=-5", sign=admin(seaweed_s3)).body == DATA[-5:]
    assert curl(url, "-H", f"Range: bytes={len(DATA)}-", sign=admin(seaweed_s3)).status == 416


@s3
def test_seaweed_refuses_wrong_secret_and_reports_missing(seaweed_s3: SeaweedS3, curl) -> None:
    bucket = seaweed_s3.new_bucket()
    seaweed_s3.put_object(bucket, "m.bin", b"x")
    url = seaweed_s3.endpoint + f"/{bucket}/m.bin"
    wrong = curl(url, sign=(seaweed_s3.access_key, "not-the-secret"))
    assert wrong.status == 403 and b"SignatureDoesNotMatch" in wrong.body
    assert curl(url, sign=("UNKNOWNKEY0000000000", "x")).status == 403
    missing = curl(seaweed_s3.endpoint + f"/{bucket}/missing.bin", sign=admin(seaweed_s3))
    assert missing.status == 404 and b"NoSuchKey" in missing.body


@s3
def test_seaweed_readonly_identity_cannot_write(seaweed_s3: SeaweedS3, curl, tmp_path: Path) -> None:
    bucket = seaweed_s3.new_bucket()
    seaweed_s3.put_object(bucket, "m.bin", b"readable")
    reader = (seaweed_s3.readonly_access_key, seaweed_s3.readonly_secret_key)
    url = seaweed_s3.endpoint + f"/{bucket}/m.bin"
    assert curl(url, sign=reader).body == b"readable"
    upload = tmp_path / "upload.bin"
    upload.write_bytes(b"overwrite")
    assert curl(url, "-T", str(upload), sign=reader).status == 403
    assert curl(url, "-X", "DELETE", sign=reader).status == 403
    assert seaweed_s3.get_object(bucket, "m.bin") == b"readable"


@s3
def test_seaweed_public_bucket_allows_anonymous_reads_only(seaweed_s3: SeaweedS3) -> None:
    public = seaweed_s3.new_bucket("public", public=True)
    private = seaweed_s3.new_bucket()
    for bucket in (public, private):
        seaweed_s3.put_object(bucket, "m.bin", DATA)
    status, headers, body = fetch(seaweed_s3.endpoint + f"/{public}/m.bin", {"Range": "bytes=0-9"})
    assert (status, body) == (206, DATA[:10])
    assert fetch(seaweed_s3.endpoint + f"/{private}/m.bin")[0] == 403
    assert seaweed_s3.request("PUT", f"/{public}/new.bin", body=b"x", credentials=None).status == 403


@s3
def test_seaweed_sigv4_with_and_without_content_sha256(seaweed_s3: SeaweedS3, curl) -> None:
    """curl 7.88's --aws-sigv4 sends no X-Amz-Content-Sha256 unless told to; SeaweedFS accepts both forms (AWS
    S3 itself requires the header). The FaultProxy log shows what curl sent."""
    bucket = seaweed_s3.new_bucket()
    seaweed_s3.put_object(bucket, "m.bin", DATA)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        url = proxy.url(f"/{bucket}/m.bin")
        plain = curl(url, "-H", "Range: bytes=0-99", sign=admin(seaweed_s3))
        hashed = curl(url, "-H", "Range: bytes=0-99", "-H", f"x-amz-content-sha256: {EMPTY_SHA256}",
                      sign=admin(seaweed_s3))  # fmt: skip
        unsigned = curl(url, "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", sign=admin(seaweed_s3))
        assert (plain.status, hashed.status, unsigned.status) == (206, 206, 200)
        sent = proxy.log
    signed = [r.header("Authorization").partition("SignedHeaders=")[2].partition(",")[0] for r in sent]
    # curl signs the headers given with -H (Range included) besides host and x-amz-date.
    assert signed == ["host;range;x-amz-date", "host;range;x-amz-content-sha256;x-amz-date",
                      "host;x-amz-content-sha256;x-amz-date"]  # fmt: skip
    assert [r.header("x-amz-content-sha256") for r in sent] == [None, EMPTY_SHA256, "UNSIGNED-PAYLOAD"]
    # The Host curl signed (the proxy's address) reached SeaweedFS unchanged, or the signatures would fail.
    assert {r.header("Host") for r in sent} == {f"127.0.0.1:{proxy.port}"}
    assert all(seaweed_s3.secret_key not in value for r in sent for _, value in r.headers)


@s3
def test_seaweed_if_match(seaweed_s3: SeaweedS3, curl) -> None:
    bucket = seaweed_s3.new_bucket()
    old = seaweed_s3.put_object(bucket, "m.bin", DATA)
    new = seaweed_s3.put_object(bucket, "m.bin", DATA[::-1])
    url = seaweed_s3.endpoint + f"/{bucket}/m.bin"
    assert old != new
    assert curl(url, "-H", f"If-Match: {new}", "-H", "Range: bytes=0-3", sign=admin(seaweed_s3)).status == 206
    stale = curl(url, "-H", f"If-Match: {old}", "-H", "Range: bytes=0-3", sign=admin(seaweed_s3))
    assert stale.status == 412 and b"PreconditionFailed" in stale.body


@s3
def test_seaweed_accepts_s3sign_signatures_through_fault_proxy(seaweed_s3: SeaweedS3) -> None:
    bucket = seaweed_s3.new_bucket()
    seaweed_s3.put_object(bucket, "m.bin", DATA)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        proxy.status(503, times=1, headers={"Retry-After": "0"})
        path = f"/{bucket}/m.bin"
        statuses = []
        for _ in range(2):
            headers = sign_headers("GET", proxy.url(path), {"Range": "bytes=10-19"},
                                   access_key=seaweed_s3.access_key, secret_key=seaweed_s3.secret_key)  # fmt: skip
            response = get(proxy.port, path, headers)
            statuses.append(response.status)
        assert statuses == [503, 206] and response.body == DATA[10:20]
        assert proxy.log[1].span == (10, 20) and proxy.log[1].header("Range") == "bytes=10-19"


@s3
def test_seaweed_curl_upload_through_proxy_expect_continue(seaweed_s3: SeaweedS3, curl, tmp_path: Path) -> None:
    """curl sends `Expect: 100-continue` with -T: the proxy relays the interim 100, or a final refusal."""
    bucket = seaweed_s3.new_bucket()
    upload = tmp_path / "upload.bin"
    upload.write_bytes(DATA * 3)
    reader = (seaweed_s3.readonly_access_key, seaweed_s3.readonly_secret_key)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        url = proxy.url(f"/{bucket}/upload.bin")
        assert curl(url, "-T", str(upload), sign=reader).status == 403
        assert curl(url, "-T", str(upload), sign=admin(seaweed_s3)).status == 200
        assert [(r.method, r.status, r.header("Expect")) for r in proxy.log] == [("PUT", 403, "100-continue"),
                                                                                ("PUT", 200, "100-continue")]  # fmt: skip
    assert seaweed_s3.get_object(bucket, "upload.bin") == DATA * 3


@s3
def test_seaweed_put_file_streams(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    path = tmp_path / "m.bin"
    with open(path, "wb") as f:
        for i in range(16):
            f.write(bytes([i]) * (1 << 20))
    bucket = seaweed_s3.new_bucket()
    etag = seaweed_s3.put_file(bucket, "m.bin", path)
    assert etag == f'"{hashlib.md5(path.read_bytes()).hexdigest()}"'
    assert seaweed_s3.get_object(bucket, "m.bin", byte_range="bytes=5242870-5242889") == b"\x04" * 10 + b"\x05" * 10
    seaweed_s3.delete_object(bucket, "m.bin")
    assert seaweed_s3.request("GET", f"/{bucket}/m.bin").status == 404


@s3
@pytest.mark.skipif(not os.environ.get("SAFETENSORS_TEST_2GIB"), reason="set SAFETENSORS_TEST_2GIB=1 (about 40 s)")
def test_seaweed_put_file_2gib_without_loading_it(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    size = 2 << 30
    with open(path, "wb") as f:  # sparse: zeros but for two markers
        f.truncate(size)
        f.seek(123)
        f.write(b"head-marker")
        f.seek(size - 11)
        f.write(b"tail-marker")
    bucket = seaweed_s3.new_bucket()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seaweed_s3.put_file(bucket, "big.bin", path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB: far below 2 GiB
    assert seaweed_s3.get_object(bucket, "big.bin", byte_range="bytes=123-133") == b"head-marker"
    assert seaweed_s3.get_object(bucket, "big.bin", byte_range="bytes=-11") == b"tail-marker"
    seaweed_s3.delete_object(bucket, "big.bin")
