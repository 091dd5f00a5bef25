"""Remote checkpoints: ``s3://`` against a real S3-compatible server (SeaweedFS, SigV4 identities), ``http://``
against a Range-capable server of our own, and faults injected by a proxy in between. Everything listens on
127.0.0.1 and is started and stopped by the tests (tests/python/remote).

Every load is compared byte for byte with the same load of the local file. Bytes fetched are counted by the
servers (and by ``File.source_stats()``): a load fetches what it needs and nothing twice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
import torch

import safetensors
import safetensors.numpy
import safetensors.torch
from safetensors import SafetensorError, safe_open
from safetensors import _safetensors_cpp as _cpp

from remote.fault_proxy import FaultProxy
from remote.range_server import RangeServer, overlaps
from remote.seaweed import SeaweedS3, seaweed_s3_fixture
from malicious_files import CASES

seaweed_s3 = seaweed_s3_fixture()

# Retries without waiting, so fault tests take no time backing off.
FAST = {"retry_base_delay_ms": 1, "retry_max_delay_ms": 5}


# -- the checkpoint --------------------------------------------------------------------------------------------

def state() -> Dict[str, torch.Tensor]:
    """Every dtype torch holds, tensors of several read pieces (8 MiB and more), small ones next to each other,
    a scalar and an empty tensor: about 21 MiB. The same bits every run."""
    g = torch.Generator().manual_seed(25)

    def raw(n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)

    out = {
        "big": raw(18 << 20).view(torch.float32).reshape(-1, 1024),
        "rows": raw(1 << 20).view(torch.bfloat16).reshape(512, 1024),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "packed": raw(64).view(torch.float4_e2m1fn_x2).reshape(8, 8),
        "flags": torch.randint(0, 2, (100,), generator=g).bool(),
    }
    for dtype in (torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e8m0fnu,
                  torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.int16, torch.uint16, torch.float16,
                  torch.bfloat16, torch.int32, torch.uint32, torch.float32, torch.complex64, torch.float64,
                  torch.int64, torch.uint64):
        size = torch.empty(0, dtype=dtype).element_size()
        out[f"d.{str(dtype).split('.')[-1]}"] = raw(23 * 7 * size).view(dtype).reshape(23, 7)
    return out


#: Tensors numpy holds natively (its load of every dtype is tested in test_numpy.py).
NUMPY_NAMES = ["big", "scalar", "empty", "flags", "d.int8", "d.uint8", "d.int16", "d.int32", "d.int64", "d.float16",
               "d.float32", "d.float64", "d.complex64"]


def digest(t: Any) -> List[Any]:
    if isinstance(t, np.ndarray):
        return [str(t.dtype), list(t.shape), hashlib.sha256(np.ascontiguousarray(t).tobytes()).hexdigest()]
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return [str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest()]


def digests(tensors: Dict[str, Any]) -> Dict[str, List[Any]]:
    return {name: digest(t) for name, t in tensors.items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("remote") / "model.safetensors"
    safetensors.torch.save_file(state(), path, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def s3_model(seaweed_s3: SeaweedS3, checkpoint: Path) -> Dict[str, Any]:
    """The checkpoint in a bucket: its s3:// URL and the storage options that reach it."""
    bucket = seaweed_s3.new_bucket("models")
    seaweed_s3.put_file(bucket, "dir/model.safetensors", checkpoint)
    options = {
        "endpoint_url": seaweed_s3.endpoint,
        "aws_access_key_id": seaweed_s3.access_key,
        "aws_secret_access_key": seaweed_s3.secret_key,
        "region": "us-east-1",
    }
    return {"url": f"s3://{bucket}/dir/model.safetensors", "bucket": bucket, "options": options, "server": seaweed_s3}


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS settings from the machine: an empty HOME (no ~/.aws) and none of the variables."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def aws_env(no_aws: None, monkeypatch: pytest.MonkeyPatch, seaweed_s3: SeaweedS3) -> None:
    """The credentials and endpoint as AWS tools take them from the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed_s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed_s3.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", seaweed_s3.endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")


@pytest.fixture(scope="module")
def http_model(checkpoint: Path) -> Iterator[Dict[str, Any]]:
    with RangeServer() as server:
        server.put("/m/model.safetensors", checkpoint)
        yield {"server": server, "url": server.url("/m/model.safetensors"), "path": "/m/model.safetensors"}


# -- every entry point, byte for byte -----------------------------------------------------------------------------

def each_entry_point(location: str, options: Any) -> Dict[str, Dict[str, List[Any]]]:
    """What every reading entry point gives for ``location`` (a path or a URL), as digests."""
    out: Dict[str, Dict[str, List[Any]]] = {}
    for backend in ("mmap", "pread"):
        with safe_open(location, "pt", backend=backend, storage_options=options) as f:
            out[f"get_tensors/{backend}"] = digests(f.get_tensors())
            out[f"get_tensor/{backend}"] = digests({k: f.get_tensor(k) for k in f.keys()})
            out[f"slices/{backend}"] = digests({
                "rows": f.get_slice("rows")[100:300],
                "cols": f.get_slice("rows")[:, 17:900:3],
                "big.row": f.get_slice("big")[4000],
                "packed": f.get_slice("packed")[2:5],
            })
            out[f"meta/{backend}"] = {k: list(f.get_tensor_meta(k).data_offsets) for k in f.keys()}
            out[f"metadata/{backend}"] = {"m": [f.metadata()]}
    with safe_open(location, "pt", storage_options=options) as f:
        with f.prefetch(threads=4) as loader:
            out["prefetch/cpu"] = digests(dict(loader))
        with f.prefetch({"rows": slice(10, 20), "d.int64": None}) as loader:
            out["prefetch/plan"] = digests(dict(loader))
    with safe_open(location, "np", storage_options=options) as f:
        out["numpy"] = digests({k: f.get_tensor(k) for k in NUMPY_NAMES})
    return out


def test_s3_every_entry_point_matches_the_local_file(s3_model: Dict[str, Any], checkpoint: Path, no_aws: None):
    local = each_entry_point(str(checkpoint), None)
    remote = each_entry_point(s3_model["url"], s3_model["options"])
    assert remote == local


def test_http_every_entry_point_matches_the_local_file(http_model: Dict[str, Any], checkpoint: Path):
    local = each_entry_point(str(checkpoint), None)
    assert each_entry_point(http_model["url"], {"connections": 3}) == local


def test_load_file_reads_the_aws_environment(s3_model: Dict[str, Any], checkpoint: Path, aws_env: None):
    """load_file and load(bytes)-free loaders take credentials and endpoint from the environment."""
    expected = digests(safetensors.torch.load_file(checkpoint))
    assert digests(safetensors.torch.load_file(s3_model["url"])) == expected
    assert digests(safetensors.torch.load_file(s3_model["url"], backend="pread")) == expected
    flat = safetensors.numpy.load_file(checkpoint)
    assert digests(safetensors.numpy.load_file(s3_model["url"])) == digests(flat)


def test_every_load_file_and_load_model_take_storage_options(s3_model: Dict[str, Any], checkpoint: Path,
                                                             no_aws: None):
    options = s3_model["options"]
    expected = safetensors.torch.load_file(checkpoint)
    assert digests(safetensors.torch.load_file(s3_model["url"], storage_options=options)) == digests(expected)
    assert digests(safetensors.numpy.load_file(s3_model["url"], storage_options=options)) == digests(
        safetensors.numpy.load_file(checkpoint))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, tensor in expected.items():
                self.register_buffer(name.replace(".", "_"), torch.empty_like(tensor))

    renamed = {name.replace(".", "_"): t for name, t in expected.items()}
    local = Model()
    local.load_state_dict(renamed)
    path = checkpoint.parent / "model_renamed.safetensors"
    safetensors.torch.save_model(local, path)
    bucket = s3_model["bucket"]
    model = Model()
    seaweed = s3_model["server"]
    seaweed.put_file(bucket, "model_renamed.safetensors", path)
    missing, unexpected = safetensors.torch.load_model(model, f"s3://{bucket}/model_renamed.safetensors",
                                                       storage_options=options)
    assert not missing and not unexpected
    assert digests(dict(model.state_dict())) == digests(renamed)


def test_aws_profile_files(s3_model: Dict[str, Any], checkpoint: Path, no_aws: None, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch, seaweed_s3: SeaweedS3):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[store]\naws_access_key_id = {seaweed_s3.access_key}\naws_secret_access_key = {seaweed_s3.secret_key}\n"
    )
    (tmp_path / ".aws" / "config").write_text(f"[profile store]\nregion = us-east-1\nendpoint_url = {seaweed_s3.endpoint}\n")
    monkeypatch.setenv("AWS_PROFILE", "store")
    with safe_open(s3_model["url"], "pt") as f:
        assert digest(f.get_tensor("d.int32")) == digest(safetensors.torch.load_file(checkpoint)["d.int32"])


def test_a_full_load_fetches_each_byte_once(http_model: Dict[str, Any], checkpoint: Path):
    server = http_model["server"]
    server.clear_log()
    with safe_open(http_model["url"], "pt") as f:
        f.get_tensors()
        stats = f._open().file.source_stats()
    size = checkpoint.stat().st_size
    spans = server.spans(http_model["path"])
    assert overlaps(spans) == []
    assert sum(end - begin for begin, end in spans) == size
    assert server.bytes_sent(http_model["path"]) == size
    assert stats["bytes_fetched"] == size and stats["retries"] == 0
    # Every request asked for the version pinned at open.
    etag = server.etag(http_model["path"])
    assert all(r.header("If-Match") == etag for r in server.requests_for(http_model["path"])[1:])


def test_a_slice_fetches_only_its_rows(http_model: Dict[str, Any]):
    server = http_model["server"]
    with safe_open(http_model["url"], "pt", storage_options={"header_request_bytes": 4096}) as f:
        server.clear_log()
        rows = f.get_slice("rows")[200:210]
        _, _, begin, _ = f._open().file.info("rows")
        data_offset = f._open().file.data_offset
    assert rows.shape == (10, 1024)
    spans = server.spans(http_model["path"])
    assert spans == [(data_offset + begin + 200 * 2048, data_offset + begin + 210 * 2048)]


def test_inspect_fetches_only_the_header(s3_model: Dict[str, Any], seaweed_s3: SeaweedS3, aws_env: None,
                                         monkeypatch: pytest.MonkeyPatch):
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        proc = subprocess.run([sys.executable, "-m", "safetensors", "inspect", s3_model["url"]],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "d.complex64" in proc.stdout and "C64" in proc.stdout
        assert proxy.requests == 1
        assert sum(r.body_bytes for r in proxy.log) <= 256 << 10


def test_cli_verify_and_diff_take_urls(s3_model: Dict[str, Any], checkpoint: Path, aws_env: None):
    verify = subprocess.run([sys.executable, "-m", "safetensors", "verify", s3_model["url"]],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    diff = subprocess.run([sys.executable, "-m", "safetensors", "diff", s3_model["url"], str(checkpoint)],
                          capture_output=True, text=True, timeout=120)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_sharded_checkpoint_with_a_remote_index(seaweed_s3: SeaweedS3, tmp_path: Path, aws_env: None):
    tensors = state()
    local_dir = tmp_path / "ckpt"
    local_dir.mkdir()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    bucket = seaweed_s3.new_bucket("sharded")
    weight_map = {}
    for shard, members in shards.items():
        safetensors.torch.save_file({n: tensors[n] for n in members}, local_dir / shard)
        seaweed_s3.put_file(bucket, f"ckpt/{shard}", local_dir / shard)
        weight_map.update({n: shard for n in members})
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}).encode()
    seaweed_s3.put_object(bucket, "ckpt/model.safetensors.index.json", index)
    opened = _cpp.sharded.ShardedFile.open_index(f"s3://{bucket}/ckpt/model.safetensors.index.json", "pread")
    assert [s.path for s in opened.shards] == [f"s3://{bucket}/ckpt/{s}" for s in sorted(shards)]
    assert sorted(opened.keys()) == names


# -- errors ---------------------------------------------------------------------------------------------------

def test_wrong_credentials_are_a_permission_error_naming_the_url(s3_model: Dict[str, Any], no_aws: None):
    options = dict(s3_model["options"], aws_secret_access_key="not-the-secret-1234")
    with pytest.raises(OSError) as info:
        safe_open(s3_model["url"], "pt", storage_options=options)
    assert isinstance(info.value, SafetensorError)
    assert info.value.errno == errno.EACCES
    text = str(info.value)
    assert s3_model["url"] in text and "HTTP 403" in text
    assert "not-the-secret-1234" not in text and s3_model["options"]["aws_secret_access_key"] not in text


def test_a_missing_object_is_file_not_found(s3_model: Dict[str, Any], no_aws: None):
    url = f"s3://{s3_model['bucket']}/dir/missing.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        safe_open(url, "pt", storage_options=s3_model["options"])
    assert str(info.value) == f"No such file or directory: {url}"


def test_no_credentials_is_a_clear_error(s3_model: Dict[str, Any], no_aws: None, seaweed_s3: SeaweedS3):
    with pytest.raises(SafetensorError, match="no AWS credentials"):
        safe_open(s3_model["url"], "pt", storage_options={"endpoint_url": seaweed_s3.endpoint})


def test_anonymous_reads_a_public_bucket(seaweed_s3: SeaweedS3, checkpoint: Path, no_aws: None):
    public = seaweed_s3.new_bucket("public", public=True)
    seaweed_s3.put_file(public, "model.safetensors", checkpoint)
    options = {"endpoint_url": seaweed_s3.endpoint, "anonymous": True}
    with safe_open(f"s3://{public}/model.safetensors", "pt", storage_options=options) as f:
        assert digest(f.get_tensor("d.int16")) == digest(safetensors.torch.load_file(checkpoint)["d.int16"])
    private = seaweed_s3.new_bucket("private")
    seaweed_s3.put_file(private, "model.safetensors", checkpoint)
    with pytest.raises(OSError) as info:
        safe_open(f"s3://{private}/model.safetensors", "pt", storage_options=options)
    assert info.value.errno == errno.EACCES


def test_bearer_token_and_redirects(checkpoint: Path, no_aws: None, monkeypatch: pytest.MonkeyPatch):
    expected = digests(safetensors.torch.load_file(checkpoint))
    with RangeServer() as origin, RangeServer() as front:
        origin.put("/private/model.safetensors", checkpoint, token="s3cret-token")
        front.add_redirect("/resolve/model.safetensors", origin.url("/private/model.safetensors"))
        url = front.url("/resolve/model.safetensors")
        # libcurl sends the token to the host it was given for only: a redirect to another host goes without.
        with pytest.raises(OSError) as info:
            safe_open(url, "pt", storage_options={"token": "s3cret-token"})
        assert info.value.errno == errno.EACCES and "s3cret-token" not in str(info.value)
        with safe_open(origin.url("/private/model.safetensors"), "pt",
                       storage_options={"token": "s3cret-token"}) as f:
            assert digests(f.get_tensors()) == expected
        origin.put("/public/model.safetensors", checkpoint)
        front.add_redirect("/resolve/public.safetensors", origin.url("/public/model.safetensors"))
        with safe_open(front.url("/resolve/public.safetensors"), "pt") as f:
            assert digests(f.get_tensors()) == expected
        # Ranges after the first go straight to where the redirect led.
        assert len(front.requests_for("/resolve/public.safetensors")) == 1


@pytest.fixture(scope="module")
def tls_server_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ssl.SSLContext, Path]]:
    """A self-signed certificate for 127.0.0.1 (made by the openssl CLI) and a server context serving it."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    yield context, cert


def test_https_verifies_the_server_against_the_ca_bundle(checkpoint: Path, tls_server_context):
    context, cert = tls_server_context
    expected = digests(safetensors.torch.load_file(checkpoint))
    with RangeServer(tls=context) as server:
        url = server.url("/m.safetensors")
        server.put("/m.safetensors", checkpoint)
        assert digests(safetensors.torch.load_file(url, storage_options={"ca_bundle": str(cert)})) == expected
        # The system's CAs do not know a self-signed certificate: refused, and the error says it was TLS.
        with pytest.raises(OSError, match="TLS") as info:
            safe_open(url, "pt", storage_options=FAST)
        assert url in str(info.value)
        with safe_open(url, "pt", storage_options={"verify_tls": False}) as f:
            assert digests(f.get_tensors()) == expected


# TensorFlow's libtensorflow_framework exports curl_* and BoringSSL's SSL_* functions into the global scope;
# libcurl loaded without RTLD_DEEPBIND resolved its own calls there: "Failed initialization", then a crash.
LOAD_AFTER_TENSORFLOW = r"""
import sys
import tensorflow  # noqa: F401  (its exported symbols are what this checks against)
import safetensors.torch
local = safetensors.torch.save(safetensors.torch.load_file(sys.argv[4]))
for url, options in ((sys.argv[1], {}), (sys.argv[2], {"ca_bundle": sys.argv[3]})):
    print(safetensors.torch.save(safetensors.torch.load_file(url, storage_options=options)) == local)
"""


def test_loads_work_in_a_process_that_imported_tensorflow(checkpoint: Path, tls_server_context):
    pytest.importorskip("tensorflow")
    context, cert = tls_server_context
    with RangeServer() as plain, RangeServer(tls=context) as secure:
        plain.put("/m.safetensors", checkpoint)
        secure.put("/m.safetensors", checkpoint)
        out = subprocess.run([sys.executable, "-c", LOAD_AFTER_TENSORFLOW, plain.url("/m.safetensors"),
                              secure.url("/m.safetensors"), str(cert), str(checkpoint)],
                             capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr[-3000:]


def test_extra_headers_are_sent(http_model: Dict[str, Any]):
    server = http_model["server"]
    server.clear_log()
    with safe_open(http_model["url"], "pt", storage_options={"headers": {"X-Tenant": "t1"}}) as f:
        f.get_tensor("d.int8")
    assert all(r.header("X-Tenant") == "t1" for r in server.requests_for(http_model["path"]))


def test_bad_storage_options_are_refused_before_any_request(http_model: Dict[str, Any]):
    with pytest.raises(SafetensorError, match='unknown remote option "nope"'):
        safe_open(http_model["url"], "pt", storage_options={"nope": 1})
    with pytest.raises(SafetensorError, match='option "connections" takes a whole number'):
        safe_open(http_model["url"], "pt", storage_options={"connections": "many"})
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        safe_open(http_model["url"], "pt", storage_options=[("connections", 1)])


@pytest.mark.parametrize("cls", sorted(CASES))
def test_hostile_files_served_remotely_fail_as_on_disk(cls: str, tmp_path: Path):
    """The malicious-file corpus (malicious_files.py), from a server: the same error, naming the URL."""
    with RangeServer() as server:
        for i, case in enumerate(CASES[cls]):
            path = tmp_path / f"{i}.safetensors"
            path.write_bytes(case.data)
            server.put(f"/{i}.safetensors", case.data)
            with pytest.raises(SafetensorError) as on_disk:
                safe_open(path, "pt")
            with pytest.raises(SafetensorError) as remote:
                safe_open(server.url(f"/{i}.safetensors"), "pt")
            assert str(remote.value) == str(on_disk.value).replace(str(path), server.url(f"/{i}.safetensors")), case.label


# -- faults between us and the store --------------------------------------------------------------------------

@pytest.fixture
def proxied(s3_model: Dict[str, Any], seaweed_s3: SeaweedS3) -> Iterator[Dict[str, Any]]:
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        options = dict(s3_model["options"], endpoint_url=proxy.endpoint, **FAST)
        yield {"proxy": proxy, "options": options, "url": s3_model["url"]}


@pytest.mark.parametrize("fault", ["reset", "truncate", "503", "429"])
def test_faults_mid_load_are_retried_and_the_result_is_exact(fault: str, proxied: Dict[str, Any], checkpoint: Path,
                                                             no_aws: None):
    proxy = proxied["proxy"]
    with safe_open(proxied["url"], "pt", storage_options=proxied["options"]) as f:
        # After the open: the load's requests get the fault, several times over.
        rule = {
            "reset": lambda: proxy.reset_after(1000, nth=1, times=3),
            "truncate": lambda: proxy.truncate_after(1000, nth=2, times=3),
            "503": lambda: proxy.status(503, nth=1, times=3, headers={"Retry-After": "0"}),
            "429": lambda: proxy.status(429, nth=1, times=3, body=b"<Error><Code>SlowDown</Code></Error>"),
        }[fault]()
        tensors = f.get_tensors()
        stats = f._open().file.source_stats()
    assert rule.fired == 3
    # Each fault hit a request (a request whose body is shorter than the cut is not cut): retried, never failed.
    assert stats["retries"] >= 1
    assert digests(tensors) == digests(safetensors.torch.load_file(checkpoint))


def test_a_stalled_server_ends_the_load_with_an_error(proxied: Dict[str, Any], no_aws: None):
    proxy = proxied["proxy"]
    options = dict(proxied["options"], stall_timeout_ms=500, max_retries=1)
    with safe_open(proxied["url"], "pt", storage_options=options) as f:
        proxy.stall(60, times=None)
        start = time.monotonic()
        with pytest.raises(OSError) as info:
            f.get_tensor("big")
        elapsed = time.monotonic() - start
    assert info.value.errno == errno.ETIMEDOUT
    assert "no data for 500 ms (after 2 attempts)" in str(info.value)
    assert elapsed < 30  # two stalls of about a second each; far below the server's 60 s


def test_an_object_replaced_mid_load_is_an_error(proxied: Dict[str, Any], seaweed_s3: SeaweedS3, checkpoint: Path,
                                                 no_aws: None):
    proxy = proxied["proxy"]
    bucket = seaweed_s3.new_bucket("replaced")
    seaweed_s3.put_file(bucket, "model.safetensors", checkpoint)
    data = bytearray(checkpoint.read_bytes())
    data[-1] ^= 0xFF  # same size and header: only a version check can tell
    with safe_open(f"s3://{bucket}/model.safetensors", "pt", storage_options=proxied["options"]) as f:
        proxy.replace_object(lambda: seaweed_s3.put_object(bucket, "model.safetensors", bytes(data)), nth=1)
        with pytest.raises(OSError) as info:
            f.get_tensors()
    assert info.value.errno == errno.ESTALE
    assert "changed after it was opened" in str(info.value)
    assert not proxy.hook_errors
