"""Tests of the remote-source test servers themselves, with plain clients (http.client, urllib) and without the
safetensors package."""

from __future__ import annotations

import hashlib

import pytest

from .s3sign import sign_headers

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
