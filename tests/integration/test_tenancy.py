"""One tenant's checkpoint never restores into another tenant's container
(issue 13): real containerd (namespaces are tenants), gVisor's shim, thaw's
stand-in, runsc, thawd (which asks containerd through thaw-ctrinfo) and
SeaweedFS. Containers start with plain `ctr`; every cross-tenant attempt must
start cold with its reason in the stand-in's decision log and in thawd's
counters, and the owner must still restore."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from control.dev import ocibuild
from control.dev.testbed import ANNOTATIONS, BUILD, COUNTER, IMAGE, Stack
from control.images.store import Store

from tests.conftest import REPO, require

THAW = REPO / ".venv" / "bin" / "thaw"

OTHER_NS = "tenant-b"


def stack(name: str, **env: str) -> Stack:
    require((BUILD / "thaw-runsc").is_file(), "the stand-in built at build/thaw-runsc")
    require((BUILD / "thaw-ctrinfo").is_file(), "build/thaw-ctrinfo (make setup)")
    require((BUILD / "busybox").is_file(), "build/busybox (make setup)")
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["rm", "-rf", str(base)])
    return Stack(base, name, extra_env=env)


@pytest.fixture
def cleanup():
    made: list[Stack] = []
    yield made.append
    for s in made:
        s.stop()
        subprocess.run(["rm", "-rf", str(s.base)])


def image_archive(s: Stack, tag: str, variant: bytes) -> Path:
    """The counter workload's image under `tag`, with one more file: other content, other digest."""
    out = s.base / f"image-{variant.decode()}.tar"
    ocibuild.build(out, tag, ocibuild.busybox_files(BUILD / "busybox", {
        "/app/run.sh": ocibuild.File(COUNTER, 0o755), "/app/variant": ocibuild.File(variant)}), ["/app/run.sh"])
    return out


def decisions(s: Stack, cid: str) -> list[dict]:
    return [d for d in s.decisions() if d["id"] == cid]


def started_cold(s: Stack, cid: str, owner_boot: str, ns: str = "thaw") -> dict:
    """The container runs with a fresh boot id; its create decision (asserted cold)."""
    boot, _ = s.state(cid, ns=ns)
    assert boot != owner_boot, f"{cid} came up with the owner's memory"
    d = decisions(s, cid)
    assert d[0]["decision"] == "cold" and d[-1]["decision"] == "started-cold", d
    return d[0]


def bucket_objects(s: Stack) -> dict[str, tuple[bytes, dict]]:
    """Every object of the stack's bucket: name -> (body, user metadata)."""
    store = Store(s.settings(), prefix="")
    out = {}
    for page in store.client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket):
        for o in page.get("Contents", []):
            r = store.client.get_object(Bucket=store.bucket, Key=o["Key"])
            out[o["Key"]] = (r["Body"].read(), r.get("Metadata", {}))
    return out


def test_cross_tenant_attempts_start_cold_and_the_owner_still_restores(name, runsc_bin, cleanup):
    s = stack(name)
    cleanup(s)
    s.start()
    owner_digest = s.ctrd.image_digest(IMAGE)

    # The owner: cold, checkpointed once ready, and a second container of the same
    # tenant and image restores it.
    s.ctrd.run(IMAGE, "owner", ANNOTATIONS)
    owner_boot, _ = s.state("owner")
    key = s.wait_published(key_prefix="ctr-thaw.counter.")["key"]
    s.ctrd.remove("owner")
    s.ctrd.run(IMAGE, "sibling", ANNOTATIONS)
    assert s.state("sibling")[0] == owner_boot, "same tenant, same image: restored"
    assert [d["decision"] for d in decisions(s, "sibling")] == ["restore", "restored"]
    s.ctrd.remove("sibling")

    # Another containerd namespace, identical image and annotations: another tenant.
    s.ctrd.import_image(s.base / "image.tar", ns=OTHER_NS)
    assert s.ctrd.image_digest(IMAGE, ns=OTHER_NS) == owner_digest
    s.ctrd.run(IMAGE, "intruder", ANNOTATIONS, ns=OTHER_NS)
    d = started_cold(s, "intruder", owner_boot, ns=OTHER_NS)
    assert d["reason"] == "no-image" and d["workload_key"].startswith(f"ctr-{OTHER_NS}.counter.")
    s.ctrd.remove("intruder", ns=OTHER_NS)

    # The same namespace forging the owner's tenant in its annotation: refused, no key.
    s.ctrd.run(IMAGE, "forger", {**ANNOTATIONS, "thaw.dev/tenant": "ctr-thaw"}, ns=OTHER_NS)
    d = started_cold(s, "forger", owner_boot, ns=OTHER_NS)
    assert d["reason"].startswith("tenant-refused: annotation thaw.dev/tenant='ctr-thaw'"), d
    assert not d.get("workload_key")
    s.ctrd.remove("forger", ns=OTHER_NS)

    # The owner's namespace, a different image with identical annotations.
    s.ctrd.import_image(image_archive(s, "thaw.dev/test/other:1", b"other"))
    s.ctrd.run("thaw.dev/test/other:1", "other-image", ANNOTATIONS)
    d = started_cold(s, "other-image", owner_boot)
    assert d["reason"] == "no-image" and d["workload_key"] != key
    s.ctrd.remove("other-image")

    # The same tag re-pushed with other content. A container made before the push
    # and started after it is refused (its rootfs is not what the tag names now);
    # one made after it has another digest, so another key.
    s.ctrd.run(IMAGE, "made-before-push", ANNOTATIONS, create_only=True)
    s.ctrd.import_image(image_archive(s, IMAGE, b"repushed"))
    assert s.ctrd.image_digest(IMAGE) != owner_digest
    s.ctrd.start_task("made-before-push")
    d = started_cold(s, "made-before-push", owner_boot)
    assert d["reason"].startswith("image-moved: "), d
    s.ctrd.remove("made-before-push")
    s.ctrd.run(IMAGE, "repushed", ANNOTATIONS)
    d = started_cold(s, "repushed", owner_boot)
    assert d["reason"] == "no-image" and d["workload_key"] != key
    s.ctrd.remove("repushed")

    c = s.metrics()
    assert c['thaw_cold_decisions_total{reason="tenant-refused"}'] == 1
    assert c['thaw_cold_decisions_total{reason="image-moved"}'] == 1
    assert c['thaw_cold_decisions_total{reason="no-image"}'] >= 4   # owner, intruder, other image, re-pushed
    assert c["thaw_restores_total"] == 1
    # The store keeps each tenant under its own prefix, nothing outside them.
    names = list(bucket_objects(s))
    assert names and all(n.startswith(("tenants/ctr-thaw/", f"tenants/ctr-{OTHER_NS}/")) for n in names), names


def test_tampered_manifest_is_refused_and_the_signed_one_restores(name, runsc_bin, cleanup):
    mkey = Path(f"/tmp/thaw-it/{name}/manifest.key")
    s = stack(name, THAW_STORE_MANIFEST_KEY_FILE=str(mkey))
    cleanup(s)
    s.base.mkdir(parents=True)
    mkey.write_bytes(os.urandom(32))
    mkey.chmod(0o400)
    s.start()
    marker = f"plaintext-marker-{os.urandom(8).hex()}"
    s.ctrd.run(IMAGE, "owner", ANNOTATIONS, env={"SECRET": marker})
    owner_boot, _ = s.state("owner")
    key = s.wait_published(key_prefix="ctr-thaw.counter.")["key"]
    s.ctrd.remove("owner")
    objs = bucket_objects(s)
    # The control for the encrypted test below: without encryption the marker is there to be found.
    assert any(marker.encode() in body for body, _ in objs.values()), "the marker must be in a plaintext store"
    [mname] = [n for n in objs if "/manifests/" in n]
    good = objs[mname][0]
    assert json.loads(good)["tag"]

    store = Store(s.settings(), prefix="")
    doc = json.loads(good)
    doc["creator"]["host"] = "someone-else"          # any change; the tag is kept
    store.client.put_object(Bucket=store.bucket, Key=mname, Body=json.dumps(doc).encode())
    assert s.thaw("evict", key).returncode == 0      # the node must read the store's manifest again
    s.ctrd.run(IMAGE, "victim", ANNOTATIONS)
    d = started_cold(s, "victim", owner_boot)
    assert d["reason"].startswith("manifest-refused: manifest ") and "does not verify" in d["reason"], d
    assert s.metrics()['thaw_cold_decisions_total{reason="manifest-refused"}'] == 1
    s.ctrd.remove("victim")

    store.client.put_object(Bucket=store.bucket, Key=mname, Body=good)
    s.ctrd.run(IMAGE, "healed", ANNOTATIONS)
    assert s.state("healed")[0] == owner_boot, "the signed manifest restores"
    s.ctrd.remove("healed")


def test_encrypted_store_holds_no_plaintext_and_still_restores(name, runsc_bin, cleanup):
    base = Path(f"/tmp/thaw-it/{name}")
    keys = Path(f"/tmp/thaw-it/{name}-keys")
    s = stack(name, THAW_STORE_ENCRYPT="true", THAW_STORE_TENANT_KEYS_DIR=str(keys / "tenants"),
              THAW_STORE_MANIFEST_KEY_FILE=str(keys / "manifest.key"))
    cleanup(s)
    subprocess.run(["rm", "-rf", str(keys)])
    (keys / "tenants").mkdir(parents=True)
    for f in (keys / "tenants" / "ctr-thaw", keys / "manifest.key"):
        f.write_bytes(os.urandom(32))
        f.chmod(0o400)
    try:
        s.start()
        marker = f"encrypted-marker-{os.urandom(8).hex()}"
        s.ctrd.run(IMAGE, "owner", ANNOTATIONS, env={"SECRET": marker})
        owner_boot, _ = s.state("owner")
        key = s.wait_published(key_prefix="ctr-thaw.counter.")["key"]
        s.ctrd.remove("owner")

        objs = bucket_objects(s)
        assert any("/packs/" in n for n in objs) and any("/manifests/" in n for n in objs)
        for n, (body, meta) in objs.items():
            assert marker.encode() not in body and marker not in n and marker not in json.dumps(meta), n
        # The store's own files too (volumes, filer metadata): nothing holds the marker.
        hits = subprocess.run(["grep", "-rlaF", marker, str(base / "weed")], capture_output=True, text=True)
        assert hits.stdout == "", hits.stdout

        # Restored from the encrypted store, into the same tenant: streamed (store.stream,
        # the default), each chunk opened with its key by thaw-gofer while runsc restores.
        assert s.thaw("evict", key).returncode == 0
        s.ctrd.run(IMAGE, "restored", ANNOTATIONS)
        assert s.state("restored")[0] == owner_boot
        # The file ends with the marker: the restored memory holds it in plaintext again.
        assert s.ctrd.exec("restored", "tail", "-c", str(len(marker)), "/tmp/secret").stdout == marker
        assert s.metrics().get("thaw_cache_misses_total", 0) >= 1
        end = time.monotonic() + 60
        while s.metrics().get('thaw_streams_total{result="installed"}') != 1 and time.monotonic() < end:
            time.sleep(0.5)
        m = s.metrics()
        assert m.get('thaw_streams_total{result="installed"}') == 1, m
        assert 'thaw_streams_total{result="failed"}' not in m, m
        s.ctrd.remove("restored")

        # A tenant without a key neither restores nor publishes.
        s.ctrd.import_image(base / "image.tar", ns=OTHER_NS)
        s.ctrd.run(IMAGE, "keyless", ANNOTATIONS, ns=OTHER_NS)
        d = started_cold(s, "keyless", owner_boot, ns=OTHER_NS)
        assert d["reason"].startswith("no-tenant-key: "), d
        s.ctrd.remove("keyless", ns=OTHER_NS)
        assert not [n for n in bucket_objects(s) if n.startswith(f"tenants/ctr-{OTHER_NS}/")]
    finally:
        subprocess.run(["rm", "-rf", str(keys)])


# -- CRI: the pod's Kubernetes namespace as containerd's CRI plugin records it ----------------

@pytest.fixture
def cri_node(name, runsc_bin, weed):
    """ci/cri.sh's private containerd with CRI on, and a thawd that asks it (and SeaweedFS)."""
    from tests.integration.test_cri_pod import CRI, Cri
    for b in ("crictl", "containerd", "thaw-image", "thaw-ctrinfo", "cni-bin/ptp"):
        require((BUILD / b).is_file(), f"{b} built at {BUILD / b}")
    base = Path(f"/tmp/thaw-it/{name}")
    sock = base / "thawd" / "thawd.sock"
    subprocess.run(["bash", str(CRI), "down", str(base)], capture_output=True, timeout=120)
    r = subprocess.run(["bash", str(CRI), "up", str(base)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "THAW_THAWD_SOCKET": str(sock)})
    thawd = log = None
    try:
        assert r.returncode == 0, f"ci/cri.sh up failed:\n{r.stdout}\n{r.stderr}"
        env = dict(line.split("=", 1) for line in r.stdout.split())
        weed.credentials.write_aws_file(base / "aws-credentials")
        tenv = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
        tenv.update({
            "THAW_NODE_STATE_DIR": str(base / "thaw-state"), "THAW_NODE_LOG_DIR": str(base / "thaw-log"),
            "THAW_CACHE_DIR": str(base / "thaw-cache"), "THAW_THAWD_SOCKET": str(sock),
            "THAW_THAWD_METRICS_ADDR": "", "THAW_RUNSC_PATH": str(BUILD / "runsc"),
            "THAW_STORE_ENDPOINT": weed.endpoint, "THAW_STORE_BUCKET": name.replace("_", "-")[:60],
            "THAW_STORE_CREDENTIALS_FILE": str(base / "aws-credentials"),
            "THAW_CONTAINERD_ADDRESS": env["CONTAINERD_ADDRESS"], "THAW_CONTAINERD_RUNSC_ROOT": str(base / "runsc-root"),
            "THAW_CONTAINERD_INFO": str(BUILD / "thaw-ctrinfo"),
            "THAW_TENANCY_MAP": "k8s:team-c=team-a"})
        log = open(base / "thawd.log", "ab")
        thawd = subprocess.Popen([str(THAW), "serve"], env=tenv, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + 60
        while not sock.exists():
            assert thawd.poll() is None and time.monotonic() < end, (base / "thawd.log").read_text()[-3000:]
            time.sleep(0.1)
        yield Cri(base, env)
    finally:
        if thawd is not None:
            thawd.terminate()
            thawd.wait(30)
        if log is not None:
            log.close()
        d = subprocess.run(["bash", str(CRI), "down", str(base)], capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, d.stderr


def test_cri_containers_are_keyed_by_their_pods_kubernetes_namespace(cri_node, name):
    """Pods in two Kubernetes namespaces with identical annotations and image get
    different tenants (k8s-<namespace>, from the CRI plugin's records; a mapped
    namespace gets its mapped tenant); a pod claiming another namespace's tenant
    in its annotation is refused. Each is a pod (control/thawd/pods.py): its pause container
    has no image digest, and its tenant alone starts the pod's lookup key."""
    cri = cri_node
    ann = {"thaw.dev/workload": "w"}
    pods = {}
    for pod, ns, extra in (("a", "team-a", {}), ("b", "team-b", {}), ("c", "team-c", {}),
                           ("forged", "team-b", {"thaw.dev/tenant": "k8s-team-a"})):
        logs = cri.base / "logs" / pod
        logs.mkdir(parents=True, exist_ok=True)
        cfg = cri.write(f"{pod}-pod.json", {
            "metadata": {"name": pod, "namespace": ns, "uid": f"{name}-{pod}", "attempt": 0}, "hostname": pod,
            "log_directory": str(logs), "annotations": {**ann, **extra}, "linux": {}})
        sandbox = cri.crictl("runp", "--runtime", "runsc-thaw", cfg).stdout.strip()
        app = cri.crictl("create", sandbox, cri.container_config(pod, "app"), cfg).stdout.strip()
        cri.crictl("start", app)
        pods[pod] = (sandbox, app)
    lines = [json.loads(x) for x in (cri.base / "standin.log").read_text().splitlines()]
    create = {x["id"]: x for x in lines if x["cmd"] == "create"}
    keys = {pod: create[app]["workload_key"] for pod, (_, app) in pods.items()}
    assert create[pods["a"][1]]["reason"].startswith("pod-cold: ") and keys["a"].startswith("k8s-team-a.w.")
    assert create[pods["b"][1]]["reason"].startswith("pod-cold: ") and keys["b"].startswith("k8s-team-b.w.")
    assert keys["c"].startswith("team-a.w.")            # tenancy.map k8s:team-c -> team-a
    assert len({keys["a"], keys["b"], keys["c"]}) == 3
    forged = create[pods["forged"][1]]
    assert forged["reason"].startswith("pod-cold: tenant-refused: annotation thaw.dev/tenant='k8s-team-a'"), forged
    assert not forged["workload_key"]
    for pod, (sandbox, _) in pods.items():
        d = create[sandbox]
        if pod == "forged":
            assert d["decision"] == "cold" and d["reason"].startswith("tenant-refused: "), d
            assert not d["workload_key"]
        else:   # cold: the pod declares no container (thaw.dev/ready.<container>); keyed by its tenant
            assert d["decision"] == "cold" and d["reason"].startswith("no-declared-containers: "), d
            assert d["workload_key"] == keys[pod], (d, keys[pod])
    for sandbox, app in pods.values():
        cri.crictl("stop", app)
        cri.crictl("rm", app)
        cri.crictl("stopp", sandbox)
        cri.crictl("rmp", sandbox)
