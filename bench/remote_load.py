"""Remote loads: a checkpoint in an S3-compatible store (SeaweedFS on 127.0.0.1), loaded in a fresh process.

    .venv/bin/python bench/remote_load.py [--size 2G] [--rounds 5] [--markdown FILE]

Implementations, each load in a new interpreter (imports done before the clock starts), taking turns round by
round:
  ours      safetensors.torch.load_file("s3://bucket/key") (its body: safe_open + get_tensors), tensors in memory
            of their own, read straight into them by parallel range requests
  runai     Run:ai model streamer with its S3 backend (runai-model-streamer-s3, pinned in requirements-bench.txt):
            SafetensorsStreamer.stream_file + get_tensors
  boto3     boto3's multipart download (16 threads, 16 MiB parts) to a local file, then this package's
            load_file(backend="pread") of it
  ceiling   bench/remote_ceiling.c: raw parallel range requests (16 connections, 16 MiB each) for the whole
            object into pre-faulted memory, from the same server
  fresh     the same requests into fresh memory (faulted in as the bodies land, as a load's new tensors are):
            what the network path costs once fresh memory is paid for

All of them read the same object from the same server with the same credentials (the AWS environment
variables). Reported per implementation: wall time (min / median / max), bytes fetched where the client counts
them (ours: File.source_stats()), and peak RSS above the tensors (VmHWM after the load minus RSS before it minus
the tensors' bytes). The server shares the machine's CPUs with the client: figures are this machine's, not a
network's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from suite import section  # bench/ is this script's directory, so first on sys.path
from suite.common import size_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_DIR = ROOT / "build" / "bench-peers"
MiB = 1 << 20
GiB = 1 << 30
IMPLS = ["ours", "runai", "boto3", "ceiling", "fresh"]
# The peers' modules, installed by scripts/bench.sh into PEERS_DIR.
PEER_MODULES = {"runai": "runai_model_streamer", "boto3": "boto3"}
CONNECTIONS = 16
PART = 16 * MiB


def memory() -> Dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith("Vm"))
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items() if k in ("VmRSS", "VmHWM")}


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- one measurement, in its own process ------------------------------------------------------------------------

def worker(impl: str, url: str, scratch: str) -> Dict[str, Any]:
    import torch  # noqa: F401  (imported before the clock, as a user's program has it)

    out: Dict[str, Any] = {"impl": impl}
    if impl == "ours":
        from safetensors import safe_open
    elif impl == "runai":
        from runai_model_streamer import SafetensorsStreamer
    elif impl == "boto3":
        import boto3
        from boto3.s3.transfer import TransferConfig

        from safetensors.torch import load_file
    base = memory()["VmRSS"]
    reset_peak()
    start = time.perf_counter()
    if impl == "ours":
        with safe_open(url, "pt", backend="pread") as f:
            state = f.get_tensors()
            out["bytes_fetched"] = f._open().file.source_stats()["bytes_fetched"]
    elif impl == "runai":
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(url)
            state = dict(streamer.get_tensors())
    else:
        bucket, key = url[len("s3://"):].split("/", 1)
        client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=CONNECTIONS)
        local = os.path.join(scratch, "download.safetensors")
        client.download_file(bucket, key, local, Config=config)
        state = load_file(local, backend="pread")
    out["seconds"] = time.perf_counter() - start
    out["tensor_bytes"] = nbytes(state.values())
    out["above_tensors"] = memory()["VmHWM"] - base - out["tensor_bytes"]
    if impl == "boto3":
        os.unlink(os.path.join(scratch, "download.safetensors"))
    return out


# -- the driver -------------------------------------------------------------------------------------------------

def build_ceiling(build_dir: Path) -> Path:
    exe = build_dir / "remote_ceiling"
    subprocess.run(["cc", "-O2", "-std=c11", "-o", str(exe), str(HERE / "remote_ceiling.c"), "-lcurl", "-lpthread"],
                   check=True)
    return exe


def make_checkpoint(path: Path, size: int, tensors: int) -> int:
    """``tensors`` bf16 tensors of size/tensors bytes each, distinct bytes per tensor (the store cannot
    deduplicate or compress them). Returns the file size."""
    import torch

    from safetensors.torch import save_file

    each = size // tensors
    g = torch.Generator().manual_seed(25)
    state = {}
    for i in range(tensors):
        state[f"layers.{i:03d}.weight"] = torch.randint(0, 256, (each,), dtype=torch.uint8, generator=g).view(
            torch.bfloat16).reshape(-1, 1024)
    save_file(state, path)
    return path.stat().st_size


def run_one(impl: str, url: str, env: Dict[str, str], scratch: str, ceiling: Path, size: int,
            s3: Any) -> Dict[str, Any]:
    if impl in ("ceiling", "fresh"):
        bucket_key = url[len("s3://"):]
        proc = subprocess.run([str(ceiling), f"{s3.endpoint}/{bucket_key}", str(size), str(CONNECTIONS), str(PART),
                               "aws:amz:us-east-1:s3", f"{s3.access_key}:{s3.secret_key}"],
                              capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, REMOTE_CEILING_FRESH="1" if impl == "fresh" else "0"))
        if proc.returncode != 0:
            raise RuntimeError(f"remote_ceiling failed: {proc.stderr}")
        result = json.loads(proc.stdout)
        return {"impl": impl, "seconds": result["seconds"], "bytes_fetched": result["bytes"]}
    proc = subprocess.run([sys.executable, __file__, "--worker", impl, "--url", url, "--scratch", scratch],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    seconds = sorted(s["seconds"] for s in samples)
    out: Dict[str, Any] = {"min": seconds[0], "median": statistics.median(seconds), "max": seconds[-1],
                           "n": len(seconds)}
    for key in ("bytes_fetched", "above_tensors", "tensor_bytes"):
        values = [s[key] for s in samples if key in s]
        if values:
            out[key] = max(values)
    return out


def markdown(results: Dict[str, Any]) -> str:
    size, needed = results["file_size"], results["data_bytes"]
    rows = results["summary"]
    lines = section.heading(f"Remote loads: a {size_name(results.get('size', size))} checkpoint from S3 on loopback", results["meta"],
                            f"SeaweedFS {results['seaweedfs']} on 127.0.0.1, SigV4")
    lines += section.doc_paragraphs(__doc__, 0, 1) + section.doc_paragraphs(__doc__, 3)
    lines += [
        f"{results['tensors']} bf16 tensors, each load in a new process, {results['rounds']} round(s), "
        "implementations taking turns.",
        "",
        "| implementation | min | median | max | GB/s (median) | bytes fetched | peak RSS above the tensors |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"ours": "this package, `load_file(\"s3://...\")`", "runai": "Run:ai model streamer 0.17.0, S3 backend",
             "boto3": "boto3 1.44.8 download (16 threads) + `load_file(backend=\"pread\")`",
             "ceiling": "ceiling: raw parallel range requests (16 x 16 MiB) into pre-faulted memory",
             "fresh": "the same raw requests into fresh memory (faulted in as bodies land)"}
    for impl in IMPLS:
        if impl not in rows:
            continue
        r = rows[impl]
        fetched = f"{r['bytes_fetched'] / needed:.4f}x needed" if "bytes_fetched" in r else "not counted"
        above = f"{r['above_tensors'] / MiB:.0f} MiB" if "above_tensors" in r else "-"
        lines.append(f"| {names[impl]} | {r['min']:.3f} s | {r['median']:.3f} s | {r['max']:.3f} s | "
                     f"{size / r['median'] / 1e9:.2f} | {fetched} | {above} |")
    ours, runai, ceiling = rows.get("ours"), rows.get("runai"), rows.get("ceiling")
    lines.append("")
    for impl in results.get("missing", []):
        lines.append(f"- Not measured: {names[impl]} ({PEER_MODULES[impl]} is not installed in "
                     f"{os.path.relpath(PEERS_DIR, ROOT)}: scripts/bench.sh installs requirements-bench.txt there).")
    if ours and runai:
        ratio = runai["median"] / ours["median"]
        lines.append(f"- Against Run:ai (target >= 1.2x): {ratio:.2f}x, {'met' if ratio >= 1.2 else 'not met'}.")
    if ours and ceiling:
        share = ceiling["median"] / ours["median"]
        lines.append(f"- Share of the ceiling (target >= 90%): {share:.0%}, {'met' if share >= 0.9 else 'not met'}.")
    fresh = rows.get("fresh")
    if ours and fresh:
        lines.append(f"- Share of the same requests into fresh memory: {fresh['median'] / ours['median']:.0%}.")
    if ours and "bytes_fetched" in ours:
        ratio = ours["bytes_fetched"] / needed
        lines.append(f"- Bytes fetched / bytes needed (target <= 1.01): {ratio:.4f}, "
                     f"{'met' if ratio <= 1.01 else 'not met'}.")
    if ours and "above_tensors" in ours:
        cap = 256 * MiB
        lines.append(f"- Peak RSS above the tensors (target <= the slab pool's cap, {cap // MiB} MiB): "
                     f"{ours['above_tensors'] / MiB:.0f} MiB, {'met' if ours['above_tensors'] <= cap else 'not met'}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="2G", help="checkpoint size (e.g. 512M, 2G)")
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", default=str(ROOT / "build" / "bench-results" / "remote.json"))
    parser.add_argument("--markdown", default=str(ROOT / "build" / "bench-results" / "remote.md"),
                        help="the section for BENCHMARKS.md (bench/run.py --sections remote puts it there)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.url, args.scratch)))
        return 0

    sys.path.insert(0, str(ROOT / "tests" / "python"))
    from remote.seaweed import SeaweedS3

    unit = {"M": MiB, "G": GiB}[args.size[-1].upper()]
    size = int(float(args.size[:-1]) * unit)
    impls = [i for i in args.impls.split(",") if i]
    out_dir = Path(args.json).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as scratch, SeaweedS3() as s3:
        checkpoint = Path(scratch) / "model.safetensors"
        file_size = make_checkpoint(checkpoint, size, args.tensors)
        from safetensors import safe_open

        with safe_open(checkpoint, "pt") as f:
            data_bytes = file_size - f._open().file.data_offset
        bucket = s3.new_bucket("bench")
        s3.put_file(bucket, "model.safetensors", checkpoint)
        checkpoint.unlink()  # the load reads the store, and the download gets the disk space
        url = f"s3://{bucket}/model.safetensors"
        env = dict(os.environ, AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key,
                   AWS_ENDPOINT_URL=s3.endpoint, AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true", RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                   RUNAI_STREAMER_LOG_LEVEL="WARNING")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PEERS_DIR), env.get("PYTHONPATH", "")) if p)
        ceiling = build_ceiling(Path(scratch))
        # A peer that is not installed is left out (and named in the report), not a failed run.
        missing = [i for i in impls if i in PEER_MODULES and subprocess.run(
            [sys.executable, "-c", f"import {PEER_MODULES[i]}"], env=env, capture_output=True).returncode]
        impls = [i for i in impls if i not in missing]
        samples: Dict[str, List[Dict[str, Any]]] = {i: [] for i in impls}
        meta = section.start()
        for r in range(args.rounds):
            order = impls[r % len(impls):] + impls[:r % len(impls)]
            for impl in order:
                sample = run_one(impl, url, env, scratch, ceiling, file_size, s3)
                samples[impl].append(sample)
                print(f"round {r + 1} {impl}: {sample['seconds']:.3f} s", flush=True)
        results = {
            "size": size, "file_size": file_size, "data_bytes": data_bytes, "tensors": args.tensors, "rounds": args.rounds,
            "seaweedfs": "4.48", "meta": meta,
            "samples": samples, "summary": {i: summary(s) for i, s in samples.items() if s}, "missing": missing,
        }
    Path(args.json).write_text(json.dumps(results, indent=1))
    text = markdown(results)
    Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
