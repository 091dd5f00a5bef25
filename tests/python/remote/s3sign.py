"""A minimal AWS Signature Version 4 signer for S3 requests (header auth), for the test fixtures.

Start here: `sign_headers(method, url, headers, access_key=..., secret_key=...)` returns the headers to send.
It implements only what the fixtures need: path-style URLs, one value per header, header (not query) auth.
It is checked against the signatures in AWS's documentation ("Signature Calculations for the Authorization
Header", the GET Object example) by test_fixtures.py.

Every header given is signed, plus Host, X-Amz-Date and X-Amz-Content-Sha256, which are added. The path is
percent-decoded and then encoded once, as S3 expects (S3 does not double-encode, unlike other services), so a
URL may carry a raw key ("/b/a b") or an encoded one ("/b/a%20b"); send the path `canonical_uri` returns.
Pure functions, safe to call from any thread.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from typing import Mapping, Optional
from urllib.parse import parse_qsl, quote, unquote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
# The payload hash of an empty body, and the marker S3 accepts instead of a hash (used for streamed uploads).
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


def canonical_uri(path: str) -> str:
    """The path as S3 canonicalizes it: decoded, then every byte but A-Z a-z 0-9 - . _ ~ / percent-encoded."""
    return quote(unquote(path or "/"), safe="/")


def canonical_query(query: str) -> str:
    """The query string with each name and value encoded once and the pairs sorted (blank values kept)."""
    pairs = [(quote(k, safe=""), quote(v, safe="")) for k, v in parse_qsl(query, keep_blank_values=True)]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_request(
    method: str, path: str, query: str, headers: Mapping[str, str], payload_sha256: str
) -> tuple[str, str]:
    """Returns (the canonical request text, the signed header list "a;b;c") for these exact headers.

    REQUIRES: header names are unique case-insensitively."""
    canon = {}
    for name, value in headers.items():
        key = name.strip().lower()
        if key in canon:
            raise ValueError(f"header {name!r} given twice")
        canon[key] = " ".join(str(value).split())
    names = sorted(canon)
    signed = ";".join(names)
    text = "\n".join(
        [
            method.upper(),
            canonical_uri(path),
            canonical_query(query),
            "".join(f"{n}:{canon[n]}\n" for n in names),
            signed,
            payload_sha256,
        ]
    )
    return text, signed


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """The derived key for one day (date is YYYYMMDD), region and service."""
    key = hmac.new(("AWS4" + secret_key).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign_headers(
    method: str,
    url: str,
    headers: Optional[Mapping[str, str]] = None,
    *,
    access_key: str,
    secret_key: str,
    region: str = "us-east-1",
    service: str = "s3",
    payload_sha256: str = EMPTY_SHA256,
    amz_date: Optional[str] = None,
) -> dict[str, str]:
    """Returns `headers` plus Host (unless given: it is signed as given, so a proxy must forward it unchanged),
    X-Amz-Date (`amz_date`, "YYYYMMDDTHHMMSSZ", default now in UTC), X-Amz-Content-Sha256 (`payload_sha256`,
    the hex SHA-256 of the body or UNSIGNED_PAYLOAD) and Authorization. Raises ValueError on a duplicate header."""
    parts = urlsplit(url)
    out = dict(headers or {})
    lower = {k.lower(): k for k in out}
    if "host" not in lower:
        out["Host"] = parts.netloc
    if amz_date is None:
        amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if "x-amz-date" not in lower:
        out["X-Amz-Date"] = amz_date
    if "x-amz-content-sha256" not in lower:
        out["X-Amz-Content-Sha256"] = payload_sha256
    text, signed = canonical_request(method, parts.path, parts.query, out, payload_sha256)
    date = amz_date[:8]
    scope = f"{date}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(text.encode()).hexdigest()])
    signature = hmac.new(signing_key(secret_key, date, region, service), string_to_sign.encode(), hashlib.sha256)
    out["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature.hexdigest()}"
    )
    return out
