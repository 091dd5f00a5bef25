"""A loopback HTTP/1.1 reverse proxy that forwards requests unchanged and injects faults by rule.

Start here: ::

    with RangeServer() as origin, FaultProxy(origin.endpoint) as proxy:
        origin.put("/m.safetensors", data)
        proxy.status(503, times=2, headers={"Retry-After": "0"})   # the first two requests get 503
        proxy.reset_after(4096, nth=3)                               # the third gets 4 KiB of body, then RST
        fetch(proxy.url("/m.safetensors"))                           # the code under test
        assert proxy.faults_injected == 3

Forwarding: the request head (request line and headers, Host included, byte for byte as the client sent them:
SigV4 signs Host, so an S3 endpoint such as SeaweedFS accepts requests signed for the proxy's address) and body
go to the upstream, and the response head and body come back, unchanged. Each client connection gets its own
upstream connection, kept alive as long as both sides keep theirs. `Expect: 100-continue` works (the interim
response is relayed). The upstream base URL must be http://host:port with no path. If the upstream cannot be
reached the client gets a 502.

Rules (methods below) are checked in the order they were added. Each counts the requests whose path (query
dropped, percent-decoding undone) equals its `path` filter, or all requests without one, and applies to the
`nth` of them (1-based) and the `times - 1` after it (`times=None`: every one from the nth on). On a request
every due `replace_object` hook runs first, then the first due response fault (status, reset, truncate, stall) is
injected; a later due response fault still counts the request but is not applied. Body-byte counts are of the
body as sent on the wire (for a chunked body, framing included); `nbytes` should be less than the body's length,
else the whole body goes out before the connection is closed or reset.

Log and counters: `log` holds one `RequestRecord` (see range_server.py) per request that got an answer, with
`fault` naming the rules applied ("replace", "status", "reset", "truncate", "stall", comma-separated), appended
before the response body is sent and corrected if less went out. For bodies whose length is not known up front
(chunked, close-delimited) call `wait_idle()` before reading the record.

Thread-safety: all methods may be called from any thread while requests are served; rules added take effect for
requests that arrive afterwards. `close()` interrupts stalls, cuts every connection, joins every thread and
releases the port.
"""

from __future__ import annotations

import dataclasses
import fcntl
import socket
import socketserver
import struct
import termios
import threading
import time
from typing import Callable, Iterator, Optional
from urllib.parse import urlsplit

from .range_server import JoinableThreadingMixIn, LoopbackService, RequestRecord, object_path, parse_content_range

CHUNK = 256 * 1024
MAX_HEAD = 64 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclasses.dataclass
class FaultRule:
    """One fault rule (made by a FaultProxy method; see the module docstring for matching).

    kind: "status", "reset", "truncate", "stall" or "replace". seen: matching requests so far. fired: how many
    times it was applied. The other fields are the parameters it was made with. Read it under no lock: the
    counters are ints updated by the proxy's threads."""

    kind: str
    nth: int
    times: Optional[int]
    path: Optional[str]
    nbytes: int = 0
    code: int = 0
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    seconds: float = 0.0
    after_headers: bool = True
    callback: Optional[Callable[[], None]] = None
    seen: int = 0
    fired: int = 0

    def count(self, path: str) -> bool:
        """Counts a request for `path` if it matches the filter; returns whether the rule is due for it."""
        if self.path is not None and self.path != path:
            return False
        self.seen += 1
        return self.seen >= self.nth and (self.times is None or self.seen < self.nth + self.times)


class SocketReader:
    """Buffered reads from a socket without makefile() (which would keep the descriptor open past close())."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def fill(self) -> bool:
        data = self.sock.recv(CHUNK)
        self.buf += data
        return bool(data)

    def readline(self, limit: int = MAX_HEAD) -> bytes:
        """One line with its terminator; what is left (maybe b"") at EOF. ValueError past `limit` bytes."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > limit:
                raise ValueError("line too long")
            if not self.fill():
                line = bytes(self.buf)
                self.buf.clear()
                return line

    def read_some(self, n: int) -> bytes:
        """Up to n bytes (at least one unless at EOF)."""
        if not self.buf and not self.fill():
            return b""
        piece = bytes(self.buf[:n])
        del self.buf[:n]
        return piece


def read_head(reader: SocketReader) -> Optional[bytes]:
    """A message head (start line, headers, blank line) as raw bytes; None at EOF before its first byte.
    Blank lines before the start line are skipped (RFC 9112 2.2). EOFError if the head is cut short."""
    line = reader.readline()
    while line in (b"\r\n", b"\n"):
        line = reader.readline()
    if not line:
        return None
    head = bytearray(line)
    while True:
        line = reader.readline()
        if not line.endswith(b"\n"):
            raise EOFError("connection closed inside a message head")
        head += line
        if len(head) > MAX_HEAD:
            raise ValueError("message head too long")
        if line in (b"\r\n", b"\n"):
            return bytes(head)


def parse_head(head: bytes) -> tuple[list[str], list[tuple[str, str]]]:
    """(start line split in at most 3 fields, headers as (name, value) pairs) of a raw head (latin-1)."""
    lines = head.decode("latin-1").split("\n")
    start = lines[0].rstrip("\r").split(" ", 2)
    headers = []
    for line in lines[1:]:
        line = line.rstrip("\r")
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return start, headers


def get_header(headers: list[tuple[str, str]], name: str) -> Optional[str]:
    name = name.lower()
    return next((v for k, v in headers if k.lower() == name), None)


def has_token(headers: list[tuple[str, str]], name: str, token: str) -> bool:
    """Whether a comma-separated header (Connection, Transfer-Encoding, Expect) lists `token`."""
    name = name.lower()
    return any(
        t.strip().lower() == token for k, v in headers if k.lower() == name for t in v.split(",")
    )


def body_framing(headers: list[tuple[str, str]], *, eof_allowed: bool) -> tuple[str, int]:
    """("chunked", 0), ("length", n), or, with no framing header, ("eof", 0) for a response (eof_allowed) and
    ("length", 0) for a request."""
    if has_token(headers, "Transfer-Encoding", "chunked"):
        return "chunked", 0
    length = get_header(headers, "Content-Length")
    if length is not None:
        return "length", int(length)
    return ("eof", 0) if eof_allowed else ("length", 0)


def body_pieces(reader: SocketReader, framing: tuple[str, int]) -> Iterator[bytes]:
    """The raw bytes of a body in pieces (chunk framing included). EOFError if the body is cut short."""
    kind, length = framing
    if kind == "length":
        remaining = length
        while remaining:
            piece = reader.read_some(min(CHUNK, remaining))
            if not piece:
                raise EOFError("connection closed inside a body")
            remaining -= len(piece)
            yield piece
    elif kind == "eof":
        while True:
            piece = reader.read_some(CHUNK)
            if not piece:
                return
            yield piece
    else:
        while True:
            line = reader.readline()
            if not line.endswith(b"\n"):
                raise EOFError("connection closed inside a chunked body")
            yield line
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:
                    line = reader.readline()
                    if not line.endswith(b"\n"):
                        raise EOFError("connection closed inside chunked trailers")
                    yield line
                    if line in (b"\r\n", b"\n"):
                        return
            remaining = size + 2  # the data and its CRLF
            while remaining:
                piece = reader.read_some(min(CHUNK, remaining))
                if not piece:
                    raise EOFError("connection closed inside a chunk")
                remaining -= len(piece)
                yield piece


def wait_sent(sock: socket.socket, deadline: float, stop: threading.Event) -> None:
    """Polls until the peer has acknowledged everything sent on `sock` (Linux TIOCOUTQ is 0), the deadline
    passes or `stop` is set. Before an RST, so that the bytes promised before it are not dropped with it."""
    while time.monotonic() < deadline and not stop.is_set():
        try:
            pending = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return
        if pending == 0:
            return
        stop.wait(0.005)


class FaultProxy(LoopbackService):
    """A fault-injecting loopback reverse proxy in front of `upstream` (see the module docstring).

    Listens from construction on. Attributes: `port`, `endpoint` ("http://127.0.0.1:PORT"), `upstream`.
    Safe for concurrent use by multiple threads."""

    def __init__(self, upstream: str, *, upstream_timeout: float = 60.0, idle_timeout: float = 60.0) -> None:
        """upstream: "http://host:port" of the server to forward to. upstream_timeout: seconds to wait for the
        upstream to connect or send a byte. idle_timeout: seconds an idle client connection is kept."""
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"upstream must be http://host:port: {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.upstream_address = (parts.hostname, parts.port or 80)
        self.upstream_timeout = upstream_timeout
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._rules: list[FaultRule] = []
        self._log: list[RequestRecord] = []
        self._requests = 0
        self._in_flight = 0
        self._connections = 0
        self._open_sockets: set[socket.socket] = set()
        self.hook_errors: list[BaseException] = []
        server = ProxyTCPServer(("127.0.0.1", 0), ProxyHandler)
        server.proxy = self
        self._serve(server, "FaultProxy")

    def close(self) -> None:
        """Interrupts stalls, stops serving, cuts every connection (client and upstream), joins every thread and
        releases the port. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._stop()

    # Rules. Each returns the rule, whose `fired` counts its applications.

    def reset_after(self, nbytes: int, *, nth: int = 1, times: Optional[int] = 1, path: Optional[str] = None) -> FaultRule:
        """Forwards the response head and `nbytes` of body, waits (up to 5 s) until the client's kernel has
        acknowledged them, then closes the client connection with an RST (SO_LINGER 0). The client sees
        ECONNRESET, possibly before it has read all `nbytes`: Linux drops unread received data when an RST
        arrives, so a client cannot count on holding exactly `nbytes`."""
        return self._add(FaultRule("reset", nth, times, path, nbytes=nbytes))

    def truncate_after(
        self, nbytes: int, *, nth: int = 1, times: Optional[int] = 1, path: Optional[str] = None
    ) -> FaultRule:
        """Forwards the response head (its Content-Length unchanged) and `nbytes` of body, then closes the client
        connection normally (FIN): the client sees a short body."""
        return self._add(FaultRule("truncate", nth, times, path, nbytes=nbytes))

    def status(
        self,
        code: int,
        *,
        times: Optional[int] = 1,
        headers: Optional[dict[str, str]] = None,
        body: bytes = b"",
        nth: int = 1,
        path: Optional[str] = None,
    ) -> FaultRule:
        """Answers `code` with `headers` and `body` (plus Content-Length) without contacting the upstream; the
        connection stays open. After `times` such answers requests are forwarded again."""
        return self._add(FaultRule("status", nth, times, path, code=code, headers=dict(headers or {}), body=body))

    def stall(
        self,
        seconds: float,
        *,
        after_headers: bool = True,
        nth: int = 1,
        times: Optional[int] = 1,
        path: Optional[str] = None,
    ) -> FaultRule:
        """Sends nothing for `seconds`, then forwards normally: after the response head (after_headers=True) or
        before anything, even before the request is forwarded (after_headers=False). close() cuts it short."""
        return self._add(FaultRule("stall", nth, times, path, seconds=seconds, after_headers=after_headers))

    def replace_object(
        self, callback: Callable[[], None], *, nth: int = 1, times: Optional[int] = 1, path: Optional[str] = None
    ) -> FaultRule:
        """Runs `callback()` (e.g. a RangeServer.replace or SeaweedS3.put_object) in the proxy's thread before
        forwarding the matching request, so that request and later ones see the new object. If it raises, the
        client gets a 500 and the exception is kept in `hook_errors`."""
        return self._add(FaultRule("replace", nth, times, path, callback=callback))

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def _add(self, rule: FaultRule) -> FaultRule:
        if rule.nth < 1 or (rule.times is not None and rule.times < 1):
            raise ValueError("nth and times must be at least 1")
        with self._lock:
            self._rules.append(rule)
        return rule

    # Log and counters.

    @property
    def log(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    @property
    def requests(self) -> int:
        """Requests received (including ones not answered because the proxy closed)."""
        with self._lock:
            return self._requests

    @property
    def faults_injected(self) -> int:
        """Rule applications so far, replace hooks included."""
        with self._lock:
            return sum(rule.fired for rule in self._rules)

    def requests_for(self, path: str) -> list[RequestRecord]:
        """The logged requests whose path (query dropped, percent-decoding undone) is `path`."""
        return [r for r in self.log if object_path(r.path) == path]

    def bytes_sent(self, path: Optional[str] = None) -> int:
        """Body bytes sent to clients in total, or for one path."""
        records = self.log if path is None else self.requests_for(path)
        return sum(r.body_bytes for r in records)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Waits until no request is being answered (its record is final). TimeoutError after `timeout`."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout):
                raise TimeoutError(f"FaultProxy still answering {self._in_flight} request(s) after {timeout}s")

    # The handler's interface to the proxy state; public because ProxyHandler lives outside this class.

    @property
    def closing(self) -> threading.Event:
        return self._closing

    def begin_request(self, target: str) -> tuple[list[FaultRule], Optional[FaultRule]]:
        """Counts a request: returns the replace hooks due for it and the response fault to inject, if any
        (their `fired` counters are incremented here)."""
        path = object_path(target)
        hooks, fault = [], None
        with self._lock:
            self._requests += 1
            self._in_flight += 1
            for rule in self._rules:
                if not rule.count(path):
                    continue
                if rule.kind == "replace":
                    hooks.append(rule)
                    rule.fired += 1
                elif fault is None:
                    fault = rule
                    rule.fired += 1
        return hooks, fault

    def end_request(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def add_hook_error(self, error: BaseException) -> None:
        with self._lock:
            self.hook_errors.append(error)

    def register_socket(self, sock: socket.socket, *, client: bool) -> int:
        """Tracks a connection for cut_connections (shutting it at once if the proxy is closing); returns the
        serial number of a client connection (0 for an upstream one)."""
        with self._lock:
            self._open_sockets.add(sock)
            if client:
                self._connections += 1
            number = self._connections if client else 0
        if self._closing.is_set():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return number

    def unregister_socket(self, sock: socket.socket) -> None:
        with self._lock:
            self._open_sockets.discard(sock)

    def append_record(self, record: RequestRecord) -> int:
        with self._lock:
            self._log.append(record)
            return len(self._log) - 1

    def correct_record(self, index: int, record: RequestRecord, **changes: object) -> None:
        with self._lock:
            if index < len(self._log) and self._log[index] is record:
                self._log[index] = dataclasses.replace(record, **changes)  # type: ignore[arg-type]


class ProxyTCPServer(JoinableThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    proxy: FaultProxy


class ProxyHandler(socketserver.BaseRequestHandler):
    """Serves one client connection of a FaultProxy: a loop of exchanges, each one request and its response."""

    server: ProxyTCPServer

    def setup(self) -> None:
        self.proxy = self.server.proxy
        self.client: socket.socket = self.request
        self.client.settimeout(self.proxy.idle_timeout)
        self.client_reader = SocketReader(self.client)
        self.connection_id = self.proxy.register_socket(self.client, client=True)
        self.upstream: Optional[socket.socket] = None
        self.upstream_reader: Optional[SocketReader] = None

    def handle(self) -> None:
        try:
            while not self.proxy.closing.is_set():
                head = read_head(self.client_reader)
                if head is None or not self.exchange(head):
                    break
        except (OSError, EOFError, ValueError):
            pass

    def finish(self) -> None:
        self.drop_upstream()
        self.proxy.unregister_socket(self.client)

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.proxy.unregister_socket(self.upstream)
            self.upstream.close()
            self.upstream = self.upstream_reader = None

    def connect_upstream(self) -> None:
        if self.upstream is None:
            sock = socket.create_connection(self.proxy.upstream_address, timeout=self.proxy.upstream_timeout)
            self.proxy.register_socket(sock, client=False)
            self.upstream, self.upstream_reader = sock, SocketReader(sock)

    def exchange(self, head: bytes) -> bool:
        """Answers one request; returns whether the client connection stays open."""
        start, headers = parse_head(head)
        if len(start) != 3:
            raise ValueError(f"bad request line {start!r}")
        method, target, _ = start
        hooks, fault = self.proxy.begin_request(target)
        try:
            return self.answer(head, method, target, headers, hooks, fault)
        finally:
            self.proxy.end_request()

    def record(
        self, method: str, target: str, headers: list[tuple[str, str]], status: int, body_bytes: int,
        span: Optional[tuple[int, int]], faults: list[str],
    ) -> RequestRecord:
        return RequestRecord(
            method=method,
            path=target,
            range=get_header(headers, "Range"),
            status=status,
            body_bytes=body_bytes,
            span=span,
            headers=tuple(headers),
            connection=self.connection_id,
            fault=",".join(faults) or None,
        )

    def send_local(
        self, method: str, target: str, headers: list[tuple[str, str]], code: int, extra: dict[str, str],
        body: bytes, faults: list[str],
    ) -> None:
        """Answers the client from the proxy itself (injected status, 500 from a hook, 502)."""
        body_out = b"" if method == "HEAD" else body
        lines = [f"HTTP/1.1 {code} {REASONS.get(code, 'Error')}"]
        lines += [f"{k}: {v}" for k, v in extra.items()]
        lines.append(f"Content-Length: {len(body)}")
        self.proxy.append_record(self.record(method, target, headers, code, len(body_out), None, faults))
        self.client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body_out)

    def answer(
        self, head: bytes, method: str, target: str, headers: list[tuple[str, str]],
        hooks: list[FaultRule], fault: Optional[FaultRule],
    ) -> bool:
        faults = (["replace"] if hooks else []) + ([fault.kind] if fault is not None else [])
        request_framing = body_framing(headers, eof_allowed=False)
        has_body = request_framing != ("length", 0)
        expects_continue = has_body and has_token(headers, "Expect", "100-continue")
        client_keeps = not has_token(headers, "Connection", "close")
        for hook in hooks:
            try:
                assert hook.callback is not None
                hook.callback()
            except Exception as error:  # reported to the test through hook_errors and a 500
                self.proxy.add_hook_error(error)
                if not expects_continue:
                    for _ in body_pieces(self.client_reader, request_framing):
                        pass
                self.send_local(method, target, headers, 500, {}, f"replace hook failed: {error!r}\n".encode(), faults)
                return client_keeps and not expects_continue
        if fault is not None and fault.kind == "status":
            if not expects_continue:  # a client that waits for 100 Continue sends no body after a final answer
                for _ in body_pieces(self.client_reader, request_framing):
                    pass
            self.send_local(method, target, headers, fault.code, fault.headers, fault.body, faults)
            return client_keeps and not expects_continue
        if fault is not None and fault.kind == "stall" and not fault.after_headers:
            if self.proxy.closing.wait(fault.seconds):
                return False
        try:
            self.connect_upstream()
            assert self.upstream is not None and self.upstream_reader is not None
            self.upstream.sendall(head)
            response = None
            if expects_continue:
                response = read_head(self.upstream_reader)
                if response is not None and parse_head(response)[0][1:2] == ["100"]:
                    self.client.sendall(response)
                    response = None
                    self.relay_request_body(request_framing)
                elif response is not None:
                    client_keeps = False  # the client may or may not send its body now: start afresh
            else:
                self.relay_request_body(request_framing)
            if response is None:
                response = self.read_final_head()
        except (OSError, EOFError, ValueError) as error:
            self.drop_upstream()
            self.send_local(method, target, headers, 502, {}, f"upstream: {error!r}\n".encode(), faults)
            return False
        return self.relay_response(method, target, headers, response, fault, faults) and client_keeps

    def relay_request_body(self, framing: tuple[str, int]) -> None:
        assert self.upstream is not None
        for piece in body_pieces(self.client_reader, framing):
            self.upstream.sendall(piece)

    def read_final_head(self) -> bytes:
        """The upstream's final response head; interim (1xx) responses before it are relayed to the client."""
        assert self.upstream_reader is not None
        while True:
            response = read_head(self.upstream_reader)
            if response is None:
                raise EOFError("upstream closed the connection before answering")
            code = parse_head(response)[0][1:2]
            if not (code and code[0].startswith("1") and code[0] != "101"):
                return response
            self.client.sendall(response)

    def relay_response(
        self, method: str, target: str, headers: list[tuple[str, str]], response: bytes,
        fault: Optional[FaultRule], faults: list[str],
    ) -> bool:
        """Relays the response head and body, applying a body fault; returns whether both connections may be
        kept."""
        assert self.upstream_reader is not None
        start, response_headers = parse_head(response)
        status = int(start[1])
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing: tuple[str, int] = ("length", 0)
        else:
            framing = body_framing(response_headers, eof_allowed=True)
        limit = fault.nbytes if fault is not None and fault.kind in ("reset", "truncate") else None
        planned = framing[1] if framing[0] == "length" else 0
        if limit is not None:
            planned = min(planned, limit)
        span_start = None
        if 200 <= status < 300 and method == "GET" and framing[0] == "length":
            content_range = parse_content_range(get_header(response_headers, "Content-Range"))
            span_start = content_range[0] if content_range is not None else 0 if status == 200 else None
        span = None if span_start is None else (span_start, span_start + planned)
        record = self.record(method, target, headers, status, planned, span, faults)
        index = self.proxy.append_record(record)
        sent = 0
        try:
            self.client.sendall(response)
            if fault is not None and fault.kind == "stall" and fault.after_headers:
                if self.proxy.closing.wait(fault.seconds):
                    self.correct(index, record, 0, span_start)
                    return False
            for piece in body_pieces(self.upstream_reader, framing):
                if limit is not None and sent + len(piece) >= limit:
                    piece = piece[: limit - sent]
                    self.client.sendall(piece)
                    sent += len(piece)
                    break
                self.client.sendall(piece)
                sent += len(piece)
        except (OSError, EOFError, ValueError):
            self.drop_upstream()
            self.correct(index, record, sent, span_start)
            return False
        if sent != planned:
            self.correct(index, record, sent, span_start)
        if limit is not None:
            self.drop_upstream()  # the rest of the upstream body was not read
            if fault is not None and fault.kind == "reset":
                wait_sent(self.client, time.monotonic() + 5.0, self.proxy.closing)
                self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.client.close()
            return False
        upstream_keeps = framing[0] != "eof" and not has_token(response_headers, "Connection", "close")
        if not upstream_keeps:
            self.drop_upstream()
        return upstream_keeps

    def correct(self, index: int, record: RequestRecord, sent: int, span_start: Optional[int]) -> None:
        span = None if span_start is None else (span_start, span_start + sent)
        self.proxy.correct_record(index, record, body_bytes=sent, span=span)
