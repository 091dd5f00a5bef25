"""A loopback HTTP/1.1 object server with byte ranges, validators, bearer tokens, redirects and a request log.

Start here: ::

    with RangeServer() as server:
        server.put("/model.safetensors", data)            # bytes, or a path served from disk
        url = server.url("/model.safetensors")            # http://127.0.0.1:PORT/model.safetensors
        ...                                               # the code under test fetches url
        assert [r.range for r in server.log] == ["bytes=0-7", ...]

What it serves, per path (the request's path with its query string dropped and percent-decoding undone):

* GET and HEAD only (anything else is 405). One range per request: `bytes=a-b`, `bytes=a-`, `bytes=-n` give
  206 with `Content-Range: bytes a-b/total`; a range that starts at or past the end (every range of an empty
  object) gives 416 with `Content-Range: bytes */total`. A Range header that is not one well-formed byte range
  (a multi-range, another unit, garbage) is ignored and the whole object sent with 200, as RFC 9110 allows.
* A strong ETag per object version (`"rs<port>-<generation>"`, new on every put/replace, unique within a server
  and between servers on different ports) and Last-Modified (strictly increasing per path, whole seconds).
* Preconditions in RFC 9110 order: If-Match (`*` or a list; strong comparison, so a weak tag never matches) gives
  412 when none matches; else If-Unmodified-Since gives 412 when the object is newer; then If-Range (an ETag or
  a date) turns a range request into a 200 of the whole object when it does not match.
* An object put with `token=` requires `Authorization: Bearer <token>`: 401 (with WWW-Authenticate) without
  one, 403 with another.
* `add_redirect(path, url, status)` answers that path with a redirect (before any object lookup).

Every response has a Content-Length and connections are kept alive (HTTP/1.1) until the client closes them or
`close()` shuts them down. `log` holds one `RequestRecord` per request, appended when the response starts to be
sent and corrected afterwards if fewer body bytes went out than planned (the client went away), so a client
that has read a whole response always finds its record.

Threads: one per connection, as with http.server's ThreadingHTTPServer, but joined on close (the stock mixin
does not join daemon threads). Thread-safety: all methods may be called from any thread while requests are
served; `put`/`replace`/`delete` take effect for requests whose lookup starts after they return. Every thread
and the port are released by `close()` (or leaving the `with` block), which also cuts keep-alive connections.
"""

from __future__ import annotations

import dataclasses
import email.utils
import os
import socket
import socketserver
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterable, Optional, TypeVar, Union
from urllib.parse import unquote, urlsplit

CHUNK = 256 * 1024


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One request as a server (or FaultProxy) saw and answered it.

    method, path: from the request line (path is the target as sent, query included).
    range: the Range header as received, or None.
    status: the status sent (for FaultProxy: the one the client saw, injected or upstream's).
    body_bytes: body bytes written to the client's socket (0 for HEAD).
    span: the byte range [start, stop) of the object that body covers, or None for HEAD and non-2xx answers.
    headers: the request headers as received, in order, names in the client's case.
    connection: serial number (1-based) of the TCP connection it came on; equal numbers mean keep-alive reuse.
    fault: FaultProxy only: the kind of fault injected ("status", "reset", ...), or None.
    """

    method: str
    path: str
    range: Optional[str]
    status: int
    body_bytes: int
    span: Optional[tuple[int, int]]
    headers: tuple[tuple[str, str], ...]
    connection: int
    fault: Optional[str] = None

    def header(self, name: str) -> Optional[str]:
        """The first request header called `name` (case-insensitive), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


def overlaps(spans: Iterable[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The pairs of spans (each [start, stop)) that share at least one byte, each pair in sorted order: empty when
    no byte was fetched twice. Empty spans overlap nothing."""
    ordered = sorted(s for s in spans if s[1] > s[0])
    found = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b[0] >= a[1]:
                break
            found.append((a, b))
    return found


def parse_range(header: Optional[str], size: int) -> Union[None, str, tuple[int, int]]:
    """Interprets a Range header against an object of `size` bytes: None when it is absent or to be ignored (not
    a single well-formed byte range), "unsatisfiable" for a 416, else the [start, stop) to send."""
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            return "unsatisfiable"
        return (max(0, size - suffix), size)
    start = int(first)
    if last != "" and int(last) < start:
        return None
    if start >= size:
        return "unsatisfiable"
    stop = size if last == "" else min(size, int(last) + 1)
    return (start, stop)


def parse_content_range(header: Optional[str]) -> Optional[tuple[int, int]]:
    """The [start, stop) of a `Content-Range: bytes a-b/total` header, or None if absent or of another form."""
    if not header:
        return None
    unit, _, rest = header.strip().partition(" ")
    first, dash, last = rest.partition("/")[0].partition("-")
    if unit.lower() != "bytes" or not dash or not first.isdigit() or not last.isdigit():
        return None
    return (int(first), int(last) + 1)


def etag_list(header: str) -> list[str]:
    """The entity tags of an If-Match / If-None-Match value, quotes and W/ kept (`*` comes back as ["*"])."""
    return [t.strip() for t in header.split(",") if t.strip()]


def http_date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


def parse_http_date(value: str) -> Optional[float]:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


class JoinableThreadingMixIn(socketserver.ThreadingMixIn):
    """ThreadingMixIn whose handler threads are daemons (a forgotten server does not hold up interpreter exit)
    and yet are joined by `join_handlers()`: the stock mixin only tracks non-daemon threads."""

    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True,
            name=f"{type(self).__name__}:{client_address[1]}",
        )  # fmt: skip
        lock = self.__dict__.setdefault("handler_lock", threading.Lock())
        with lock:
            threads = self.__dict__.setdefault("handler_threads", [])
            threads[:] = [t for t in threads if t.is_alive()]
            threads.append(thread)
        thread.start()

    def join_handlers(self, timeout: float = 30.0) -> None:
        """Joins every handler thread; RuntimeError naming those still running after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.__dict__.setdefault("handler_lock", threading.Lock()):
            threads = list(self.__dict__.get("handler_threads", []))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"handler threads still running {timeout}s after close: {stuck}")


class RangeHTTPServer(JoinableThreadingMixIn, HTTPServer):
    pass


@dataclasses.dataclass(frozen=True)
class StoredObject:
    """One version of an object: exactly one of data / file is set. Immutable; a put makes a new one."""

    data: Optional[bytes]
    file: Optional[str]
    size: int
    etag: str
    last_modified: int
    token: Optional[str]
    content_type: str


_Service = TypeVar("_Service", bound="LoopbackService")


class LoopbackService:
    """What a loopback server of these tests shares: its socketserver served by one thread, the connections it
    holds open, and stopping it all. Subclasses set `_lock` and `_open_sockets`, call `_serve` and define
    `close`."""

    _lock: threading.Lock
    _open_sockets: set
    endpoint: str
    port: int

    def _serve(self, server: Any, name: str, scheme: str = "http") -> None:
        """Starts serving `server` (bound to a free loopback port) on a thread of its own."""
        self._server = server
        self.port = server.server_address[1]
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"{name}:{self.port}"
        )
        self._thread.start()

    def __enter__(self: _Service) -> _Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        """Stops serving, cuts every open connection, joins every thread and releases the port."""
        self._server.shutdown()
        self._thread.join()
        self.cut_connections()
        self._server.server_close()
        self._server.join_handlers()

    def cut_connections(self) -> None:
        """Shuts down every open connection (a client sees its keep-alive connection closed)."""
        with self._lock:
            sockets = list(self._open_sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def url(self, path: str) -> str:
        """The URL of `path` (which starts with "/") on this server."""
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        return self.endpoint + path


class RangeServer(LoopbackService):
    """A threaded loopback HTTP/1.1 server of in-memory or on-disk objects (see the module docstring).

    Construct it, use it, close it (or use it as a context manager); it listens from construction on. Attributes:
    `port`, `endpoint` ("http://127.0.0.1:PORT"). Safe for concurrent use by multiple threads."""

    def __init__(self, *, idle_timeout: float = 60.0, tls: Optional[ssl.SSLContext] = None) -> None:
        """Starts listening on a free loopback port. `idle_timeout`: seconds an idle keep-alive connection is
        kept before the server closes it. `tls`: a server context; the server then speaks HTTPS."""
        self._lock = threading.Lock()
        self._objects: dict[str, StoredObject] = {}
        self._redirects: dict[str, tuple[str, int]] = {}
        self._log: list[RequestRecord] = []
        self._generation = 0
        self._connections = 0
        self._open_sockets: set[socket.socket] = set()
        self._closed = False
        handler = type("BoundRangeHandler", (RangeHandler,), {"owner": self, "timeout": idle_timeout})
        server = RangeHTTPServer(("127.0.0.1", 0), handler)
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        self._serve(server, "RangeServer", "https" if tls is not None else "http")

    def close(self) -> None:
        """Stops serving, cuts every open connection, joins every thread and releases the port. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop()

    def put(
        self,
        path: str,
        data: Union[bytes, bytearray, memoryview, os.PathLike, str],
        *,
        token: Optional[str] = None,
        etag: Optional[str] = None,
        last_modified: Optional[int] = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        """Stores a new version of the object at `path` and returns its ETag.

        data: the bytes (copied), or the path of a file served from disk (its size is taken now; REQUIRES: the
        file is not changed while it is served). token: if set, requests need `Authorization: Bearer <token>`.
        etag: the ETag header value to use (quotes and W/ included) instead of a generated strong one.
        last_modified: Unix seconds; default now, or one second after the path's previous version if that is
        not earlier."""
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        if isinstance(data, (bytes, bytearray, memoryview)):
            body, file, size = bytes(data), None, len(data)
        else:
            file = os.fspath(data)
            body, size = None, os.stat(file).st_size
        with self._lock:
            self._generation += 1
            previous = self._objects.get(path)
            stamp = int(time.time()) if last_modified is None else last_modified
            if last_modified is None and previous is not None and stamp <= previous.last_modified:
                stamp = previous.last_modified + 1
            tag = etag if etag is not None else f'"rs{self.port}-{self._generation}"'
            self._objects[path] = StoredObject(body, file, size, tag, stamp, token, content_type)
            return tag

    def replace(self, path: str, data: Union[bytes, bytearray, memoryview, os.PathLike, str], **kwargs: object) -> str:
        """Like put, for a path that must already hold an object (KeyError otherwise); returns the new ETag."""
        with self._lock:
            if path not in self._objects:
                raise KeyError(path)
        return self.put(path, data, **kwargs)  # type: ignore[arg-type]

    def delete(self, path: str) -> None:
        """Removes the object at `path` (later requests get 404). KeyError if there is none."""
        with self._lock:
            del self._objects[path]

    def etag(self, path: str) -> str:
        """The current ETag of the object at `path`; KeyError if there is none."""
        with self._lock:
            return self._objects[path].etag

    def add_redirect(self, path: str, target_url: str, status: int = 302) -> None:
        """Answers GET/HEAD of `path` with `status` (301, 302, 303, 307 or 308) and `Location: target_url`."""
        if status not in (301, 302, 303, 307, 308):
            raise ValueError(f"not a redirect status: {status}")
        with self._lock:
            self._redirects[path] = (target_url, status)

    @property
    def log(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def requests_for(self, path: str) -> list[RequestRecord]:
        """The logged requests whose path (query dropped, percent-decoding undone) is `path`."""
        return [r for r in self.log if object_path(r.path) == path]

    def spans(self, path: str) -> list[tuple[int, int]]:
        """The [start, stop) byte ranges of `path` sent in bodies, in request order (see `overlaps`)."""
        return [r.span for r in self.requests_for(path) if r.span is not None and r.method == "GET"]

    def bytes_sent(self, path: Optional[str] = None) -> int:
        """Body bytes sent in total, or for one path."""
        records = self.log if path is None else self.requests_for(path)
        return sum(r.body_bytes for r in records)

    # The handler's interface to the server state; public because RangeHandler lives outside this class.

    def lookup(self, path: str) -> tuple[Optional[StoredObject], Optional[tuple[str, int]]]:
        """(object, redirect) currently stored for a request path; either may be None."""
        key = object_path(path)
        with self._lock:
            return self._objects.get(key), self._redirects.get(key)

    def register_connection(self, sock: socket.socket) -> int:
        """Numbers a new connection and tracks it for `cut_connections`; one that arrives while the server
        closes is shut down at once, so that no handler thread outlives `close()`."""
        with self._lock:
            self._connections += 1
            self._open_sockets.add(sock)
            closing = self._closed
            number = self._connections
        if closing:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return number

    def unregister_connection(self, sock: socket.socket) -> None:
        with self._lock:
            self._open_sockets.discard(sock)

    def append_record(self, record: RequestRecord) -> int:
        """Appends a record and returns its index (for `correct_record`)."""
        with self._lock:
            self._log.append(record)
            return len(self._log) - 1

    def correct_record(self, index: int, record: RequestRecord, body_bytes: int) -> None:
        """Replaces the record at `index` (appended as `record`) with one that says `body_bytes` were sent."""
        with self._lock:
            if index < len(self._log) and self._log[index] is record:
                self._log[index] = dataclasses.replace(record, body_bytes=body_bytes)


def object_path(target: str) -> str:
    """The object key of a request target: its path with the query dropped and percent-decoding undone."""
    return unquote(urlsplit(target).path)


class RangeHandler(BaseHTTPRequestHandler):
    """Serves one connection for a RangeServer (bound to it as the class attribute `owner`)."""

    protocol_version = "HTTP/1.1"
    server_version = "RangeServer/1"
    owner: RangeServer

    def setup(self) -> None:
        super().setup()
        self.connection_id = self.owner.register_connection(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.owner.unregister_connection(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client reset or timed out: nothing to answer, and no traceback on stderr
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.serve(head=False)

    def do_HEAD(self) -> None:
        self.serve(head=True)

    def do_PUT(self) -> None:
        self.refuse()

    do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def refuse(self) -> None:
        self.close_connection = True  # the request body, if any, is not read
        self.answer(405, {"Allow": "GET, HEAD"}, b"method not allowed\n")

    def serve(self, head: bool) -> None:
        obj, redirect = self.owner.lookup(self.path)
        if redirect is not None:
            target, status = redirect
            self.answer(status, {"Location": target}, b"")
            return
        if obj is None:
            self.answer(404, {}, b"not found\n")
            return
        if obj.token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                self.answer(401, {"WWW-Authenticate": 'Bearer realm="RangeServer"'}, b"unauthorized\n")
                return
            if auth != f"Bearer {obj.token}":
                self.answer(403, {}, b"forbidden\n")
                return
        validators = {"ETag": obj.etag, "Last-Modified": http_date(obj.last_modified)}
        if not self.preconditions_hold(obj):
            self.answer(412, validators, b"precondition failed\n")
            return
        span = parse_range(self.headers.get("Range"), obj.size)
        if span is not None and not self.if_range_holds(obj):
            span = None
        if span == "unsatisfiable":
            self.answer(416, {**validators, "Content-Range": f"bytes */{obj.size}"}, b"range not satisfiable\n")
            return
        headers = {**validators, "Accept-Ranges": "bytes", "Content-Type": obj.content_type}
        if isinstance(span, tuple):
            status, (start, stop) = 206, span
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{obj.size}"
        else:
            status, start, stop = 200, 0, obj.size
        self.send_object(status, headers, obj, start, stop, head)

    def preconditions_hold(self, obj: StoredObject) -> bool:
        if_match = self.headers.get("If-Match")
        if if_match is not None:
            tags = etag_list(if_match)
            return tags == ["*"] or (not obj.etag.startswith("W/") and obj.etag in tags)
        since = self.headers.get("If-Unmodified-Since")
        if since is not None:
            limit = parse_http_date(since)
            return limit is None or obj.last_modified <= limit
        return True

    def if_range_holds(self, obj: StoredObject) -> bool:
        value = self.headers.get("If-Range")
        if value is None:
            return True
        value = value.strip()
        if value.startswith('"') or value.startswith("W/"):
            return not value.startswith("W/") and value == obj.etag
        stamp = parse_http_date(value)
        return stamp is not None and obj.last_modified == stamp

    def record(self, status: int, body_bytes: int, span: Optional[tuple[int, int]]) -> RequestRecord:
        return RequestRecord(
            method=self.command,
            path=self.path,
            range=self.headers.get("Range"),
            status=status,
            body_bytes=body_bytes,
            span=span,
            headers=tuple(self.headers.items()),
            connection=self.connection_id,
        )

    def answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """Sends a small complete response (no body for HEAD) and logs it."""
        if self.command == "HEAD":
            body_to_send = b""
        else:
            body_to_send = body
        record = self.record(status, len(body_to_send), None)
        index = self.owner.append_record(record)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body_to_send)
        except OSError:
            self.owner.correct_record(index, record, 0)
            self.close_connection = True

    def send_object(
        self, status: int, headers: dict[str, str], obj: StoredObject, start: int, stop: int, head: bool
    ) -> None:
        length = stop - start
        record = self.record(status, 0 if head else length, None if head else (start, stop))
        index = self.owner.append_record(record)
        sent = 0
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if head:
                return
            if obj.data is not None:
                view = memoryview(obj.data)[start:stop]
                while sent < length:
                    sent += self.wfile.write(view[sent : sent + CHUNK])
                return
            assert obj.file is not None
            with open(obj.file, "rb") as f:
                f.seek(start)
                while sent < length:
                    chunk = f.read(min(CHUNK, length - sent))
                    if not chunk:
                        raise OSError(f"{obj.file} is shorter than when it was put")
                    self.wfile.write(chunk)
                    sent += len(chunk)
        except OSError:
            self.owner.correct_record(index, record, sent)
            self.close_connection = True
