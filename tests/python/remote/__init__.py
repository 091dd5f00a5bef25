"""Test servers for the remote source (HTTP range requests, S3). Everything listens on 127.0.0.1 only, is started
and stopped by the tests, and uses the standard library only (pytest for the fixtures).

* range_server.py -- start here: RangeServer, an HTTP/1.1 object server with ranges, ETags, preconditions,
  bearer tokens, redirects and a request log (RequestRecord).
* fault_proxy.py -- FaultProxy, a reverse proxy in front of either server that injects resets, truncations,
  error statuses, stalls and mid-load object replacement.
* seaweed.py -- SeaweedS3, a real S3 endpoint (SeaweedFS `weed server -s3`), and the `seaweed_s3` fixture.
* s3sign.py -- a minimal AWS SigV4 signer (the fixtures' own uploads; checked against AWS's examples).
* test_fixtures.py -- the fixtures' own tests (no safetensors needed); `-m s3` selects the SeaweedFS ones.

Clients in tests must bypass any HTTP proxy from the environment (urllib: ProxyHandler({}); curl: --noproxy '*'),
so that no request leaves the machine.
"""
