"""Kubernetes Deployment benchmark on the dev cluster (issue 29 item 6): scale
0 -> 6, time to all Ready and each pod's create-to-Ready, cold vs thaw, side by
side in one run.

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/cluster.py [--repeat 3] \\
        [--workloads server,pod] [--out bench/results/cluster-DATE.json]

Brings up the real two-node cluster of control/dev/cluster.py (docs/cluster.md),
SeaweedFS on its bridge address as the store, and thaw's Helm chart with the
values of tests/integration/test_cluster_scenario.py. Per workload, two
Deployments of one pod template on RuntimeClass runsc-thaw, spread evenly over
the two nodes (a topology spread: 3 pods on each):

- "thaw": opted in (thaw.dev/workload). Seeded first: at one replica (node b
  cordoned) its pod starts cold on node a and thawd checkpoints and publishes it;
  then 0 replicas, node b uncordoned.
- "cold": the same template without thaw.dev/workload. Its pods go through the same
  handler (gVisor's shim, thaw's stand-in, runsc), image, probes and nodes; only
  the opt-in differs, so each starts the workload from its entrypoint. Not
  opting in is a fair cold, rather than removing thaw's images: an opted-in
  Deployment without an image has every pod start cold and then one is
  checkpointed (CPU and disk work during the round), and the images would have to
  go from the store and both caches before every round.

Rounds alternate cold, thaw (--repeat of each): the Deployment scaled 0 -> 6, then
back to 0 and its pods gone before the next. Times are this process's monotonic
clock as a watch on the API server saw them (control/dev/podwatch.py): all Ready
is from just before `kubectl scale` to the sixth pod's Ready condition as its
kubelet reported it; a pod's create-to-Ready is from its appearance in the watch
(the ReplicaSet controller's create) to its Ready. The API's own timestamps
(whole seconds) are kept beside. Each thaw pod's decision is thawd's Event on it
(restored from which source, or started cold and why); whether node b held the
image in its cache before the round is read from its cache directory.

Workloads: "server" is the scenario's (a busybox server holding 256 MB of random
bytes, readinessProbe httpGet /); "pod" is bench/pods.py's two-container pod (app
256 MB and sidecar 32 MB, each hashed WARMUP_ROUNDS times at start).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit, spread  # noqa: E402
from control.dev import chart, ocibuild  # noqa: E402
from control.dev import cluster as clustermod  # noqa: E402
from control.dev.clusternode import RESTART_COMMAND  # noqa: E402
from control.dev.podwatch import PodWatch, all_gone, ready_count  # noqa: E402
from control.dev.seaweed import Seaweed  # noqa: E402
from control.dev.testbed import POD_SCRIPT  # noqa: E402
from control.errors import ThawError  # noqa: E402

BUILD = clustermod.BUILD
IMAGE = "thaw.dev/bench/server:1"
NS = "default"
CACHE_DIR = "/var/lib/thaw/cache"        # twin: deploy/helm/thaw/values.yaml cache.dir
THAWD = "thaw.dev/thawd"                 # thawd's reportingComponent (control/thawd/events.py)
DECISIONS = ("ThawRestored", "ThawColdStart", "ThawRestoreFailed")


def http_probe() -> dict:
    return {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}


def containers(workload: str, weights_mb: int, sidecar_mb: int, rounds: int) -> tuple[list[dict], dict, str]:
    """The pod template's containers, its extra thaw annotations (opted-in only) and a description."""
    def env(**kv: str) -> list[dict]:
        return [{"name": k, "value": v} for k, v in kv.items()]
    if workload == "server":
        return ([{"name": "server", "image": IMAGE, "imagePullPolicy": "Never",
                  "env": env(PORT="8080", WEIGHTS_MB=str(weights_mb)),
                  "ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": http_probe()}], {},
                f"the cluster scenario's server: busybox, {weights_mb} MB of random bytes in memory hashed once at "
                "start, then httpd on :8080; readinessProbe httpGet / every 1 s")
    app = {"name": "app", "image": IMAGE, "imagePullPolicy": "Never",
           "env": env(PORT="8080", WEIGHTS_MB=str(weights_mb), WARMUP_ROUNDS=str(rounds)),
           "ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": http_probe()}
    side = {"name": "sidecar", "image": IMAGE, "imagePullPolicy": "Never",
            "env": env(WEIGHTS_MB=str(sidecar_mb), WARMUP_ROUNDS=str(rounds))}
    # The sidecar's readiness for thaw is an annotation, not an exec readinessProbe: the
    # kubelet would run `runsc exec` every second in each of six pods, CPU this 2-core
    # machine's rounds would share; the app's probe gates the pod's Ready either way.
    return ([app, side], {"thaw.dev/ready.sidecar": "file:/tmp/ready"},
            f"bench/pods.py's pod as a Deployment: app with {weights_mb} MB of random bytes hashed {rounds} times at "
            f"start, then httpd on :8080 (readinessProbe httpGet / every 1 s); sidecar with {sidecar_mb} MB, same "
            "warm-up (no probe: the kubelet counts it ready once running; thaw's readiness for it "
            "thaw.dev/ready.sidecar=file:/tmp/ready)")


def deployment(name: str, ctrs: list[dict], annotations: dict | None, replicas: int) -> dict:
    labels = {"app": name}
    meta: dict = {"labels": labels}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {"metadata": meta, "spec": {
            "runtimeClassName": "runsc-thaw", "terminationGracePeriodSeconds": 1,
            # Both nodes, evenly; a cordoned node is no domain of the spread (nodeTaintsPolicy).
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                                           "labelSelector": {"matchLabels": labels}}],
            "containers": ctrs}}}}


def chart_values(c, weed, bucket: str) -> dict:
    """tests/integration/test_cluster_scenario.py's values (the reasons are there)."""
    return {
        "store": {"endpoint": weed.endpoint, "bucket": bucket, "region": "us-east-1",
                  "credentials": {"accessKeyId": weed.credentials.access_key,
                                  "secretAccessKey": weed.credentials.secret_key}},
        "cache": {"budget": "8g", "minFree": "1g"}, "node": {"gpu": "no"},
        "containerd": {"restartCommand": list(RESTART_COMMAND)},
        "extraConfig": {"kubernetes": {"server": c.api_url}, "thawd": {"prepare_timeout_s": 30}},
    }


class Bench:
    def __init__(self, c, t0: float) -> None:
        self.c, self.t0 = c, t0
        self.commands: list[dict] = []
        pki = c.pki.dir
        self.tls = (pki / "ca.crt", pki / "admin.crt", pki / "admin.key")

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        """A kubectl command that changes the cluster, recorded with when it ran."""
        self.commands.append({"t_s": round(time.monotonic() - self.t0, 3), "cmd": "kubectl " + shlex.join(args)})
        return self.c.kubectl(*args, timeout=timeout).stdout

    def watch(self, name: str) -> PodWatch:
        return PodWatch(self.c.api_url, *self.tls, NS, f"app={name}").start()

    def thaw_events(self) -> dict[str, list[dict]]:
        """thawd's Events in the namespace by pod uid, oldest first."""
        items = json.loads(self.c.kubectl("get", "events", "-n", NS, "-o", "json").stdout)["items"]
        out: dict[str, list[dict]] = {}
        for e in sorted(items, key=lambda e: e.get("firstTimestamp") or ""):
            if e.get("reportingComponent") == THAWD:
                out.setdefault(e["involvedObject"].get("uid", ""), []).append(
                    {"reason": e["reason"], "message": e["message"], "type": e["type"]})
        return out

    def wait_decisions(self, uids: list[str], reasons: tuple[str, ...], timeout_s: float) -> dict[str, list[dict]]:
        end = time.monotonic() + timeout_s
        while True:
            evs = self.thaw_events()
            if all(any(e["reason"] in reasons for e in evs.get(u, [])) for u in uids) or time.monotonic() > end:
                return {u: evs.get(u, []) for u in uids}
            time.sleep(1)

    def scale_to_zero(self, name: str, w: PodWatch) -> float:
        t = time.monotonic()
        self.kubectl("scale", "deployment", name, "--replicas=0")
        w.wait(lambda ps: ready_count(ps) == 0 and all_gone(ps), 180, f"the pods of {name} gone")
        return round(time.monotonic() - t, 3)


def cached(node, key: str) -> list[str]:
    """The node's cache entries of `key` (entries/<key>@<tuple>@<id>, control/images/cache.py)."""
    d = node.host_path(CACHE_DIR) / "entries"
    return sorted(p.name for p in d.glob(f"{key}@*")) if d.is_dir() else []


def decision(evs: list[dict]) -> dict:
    """One pod's thaw decision from its Events."""
    out: dict = {"events": [f"{e['reason']}: {e['message']}" for e in evs]}
    for e in evs:
        if e["reason"] == "ThawRestored":
            m = re.search(r"in ([\d.]+)s(?: \((.*)\))?$", e["message"])
            out.update(decision="restored", restore_s=float(m.group(1)) if m else None,
                       source=(m.group(2) or "") if m else "")
        elif e["reason"] in ("ThawColdStart", "ThawRestoreFailed") and out.get("decision") != "restored":
            out.update(decision="cold", why=e["message"])
    out.setdefault("decision", "none (no thawd Event)")
    return out


def one_round(b: Bench, name: str, mode: str, replicas: int, key: str, node_b) -> dict:
    out: dict = {"mode": mode, "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    if mode == "thaw":
        out["node_b_cached_before"] = bool(cached(node_b, key))
    w = b.watch(name)
    try:
        t0 = time.monotonic()
        b.kubectl("scale", "deployment", name, f"--replicas={replicas}")
        ps = w.wait(lambda ps: ready_count(ps) >= replicas, 900, f"{replicas} pods of {name} Ready")
        live = {u: p for u, p in ps.items() if p.live}
        out["all_ready_s"] = round(max(p.ready_seen for p in live.values()) - t0, 3)
        evs = (b.wait_decisions(list(live), DECISIONS, 60) if mode == "thaw" else
               {u: b.thaw_events().get(u, []) for u in live})
        pods = []
        for u, p in sorted(live.items(), key=lambda kv: kv[1].ready_seen):
            pods.append({"pod": p.name, "node": p.node, "create_to_ready_s": round(p.ready_seen - p.first_seen, 3),
                         "scale_to_ready_s": round(p.ready_seen - t0, 3), "restarts": p.restarts,
                         "api_created": p.created, "api_ready": p.ready_transition, **decision(evs[u])})
        out["pods"] = pods
        out["create_to_ready"] = spread([p["create_to_ready_s"] for p in pods])
        out["per_node"] = {n: sum(1 for p in pods if p["node"] == n) for n in sorted({p["node"] for p in pods})}
        if mode == "thaw":
            out["decisions"] = {d: sum(1 for p in pods if p["decision"] == d) for d in sorted({p["decision"] for p in pods})}
            out["node_b_sources"] = sorted(p.get("source", "") for p in pods if p["node"] == node_b.name)
        out["scale_down_s"] = b.scale_to_zero(name, w)
    finally:
        w.stop()
    if mode == "thaw":   # a streamed fill ends after its pod answered: let it finish before the next round
        end = time.monotonic() + 120
        while not cached(node_b, key) and time.monotonic() < end:
            time.sleep(1)
        out["node_b_cached_after"] = bool(cached(node_b, key))
    return out


def run_workload(b: Bench, workload: str, a: argparse.Namespace, res: dict) -> None:
    """One workload's seed and rounds, into `res` as they finish (a failure keeps what ran)."""
    c = b.c
    node_b = c.nodes[1]
    ctrs, extra, what = containers(workload, a.weights_mb, a.sidecar_weights_mb, a.warmup_rounds)
    cold_name, thaw_name = f"{workload}-cold", f"{workload}-thaw"
    res.update({"workload": what, "replicas": a.replicas,
                "deployments": {"cold": deployment(cold_name, ctrs, None, 0),
                                "thaw": deployment(thaw_name, ctrs, {"thaw.dev/workload": thaw_name, **extra}, 0)}})
    # The seed: one pod of the thaw Deployment, cold on node a, checkpointed and published.
    b.kubectl("cordon", node_b.name)
    for d in res["deployments"].values():
        b.commands.append({"t_s": round(time.monotonic() - b.t0, 3), "cmd": f"kubectl apply -f - # {d['metadata']['name']}"})
        c.apply(d)
    w = b.watch(thaw_name)
    try:
        t = time.monotonic()
        b.kubectl("scale", "deployment", thaw_name, "--replicas=1")
        [p] = [p for p in w.wait(lambda ps: ready_count(ps) == 1, 600, "the seed pod Ready").values() if p.live]
        seed: dict = {"pod": p.name, "node": p.node, "create_to_ready_s": round(p.ready_seen - p.first_seen, 3)}
        evs = b.wait_decisions([p.uid], ("ThawCheckpointed", "ThawCheckpointFailed"), 300)[p.uid]
        seed["events"] = [f"{e['reason']}: {e['message']}" for e in evs]
        seed["scale_to_published_s"] = round(time.monotonic() - t, 3)
        saved = [e for e in evs if e["reason"] == "ThawCheckpointed"]
        if not saved:
            raise ThawError(f"the seed pod {p.name} was not checkpointed: {seed['events']}")
        key = saved[0]["message"].split("image ", 1)[1].split(":", 1)[0]
        seed["key"] = key
        seed["scale_down_s"] = b.scale_to_zero(thaw_name, w)
    finally:
        w.stop()
    b.kubectl("uncordon", node_b.name)
    res["seed"] = seed
    runs: list[dict] = []
    res["runs"] = runs
    for i in range(a.repeat):
        for mode, name in (("cold", cold_name), ("thaw", thaw_name)):
            r = one_round(b, name, mode, a.replicas, key, node_b)
            r["round"] = i + 1
            runs.append(r)
            print(f"{workload} round {i + 1} {mode}: all Ready {r['all_ready_s']} s, per node {r['per_node']}, "
                  f"decisions {r.get('decisions', '-')}", file=sys.stderr, flush=True)
            time.sleep(a.settle_s)
    for mode in ("cold", "thaw"):
        rs = [r for r in runs if r["mode"] == mode]
        res[mode] = {"all_ready": spread([r["all_ready_s"] for r in rs], runs=True),
                     "create_to_ready_all_pods": spread([p["create_to_ready_s"] for r in rs for p in r["pods"]]),
                     "create_to_ready_run_medians": spread([r["create_to_ready"]["median_s"] for r in rs], runs=True)}
    res["ratio_cold_over_thaw"] = {
        "all_ready": round(res["cold"]["all_ready"]["median_s"] / res["thaw"]["all_ready"]["median_s"], 2),
        "create_to_ready": round(res["cold"]["create_to_ready_all_pods"]["median_s"]
                                 / res["thaw"]["create_to_ready_all_pods"]["median_s"], 2)}
    for name in (cold_name, thaw_name):
        b.kubectl("delete", "deployment", name, "--wait=true")


def facts() -> dict:
    mem = next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")

    def out(*argv: str) -> str:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else ""
        except OSError as e:
            return str(e)
    repo = Path(__file__).resolve().parent.parent
    return {"machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, {model}, "
                       f"{int(mem) // 1024} MiB, kernel {platform.release()})",
            "git": out("git", "-C", str(repo), "rev-parse", "HEAD"),
            "git_dirty": bool(out("git", "-C", str(repo), "status", "--porcelain")),
            "kubernetes": out(str(BUILD / "k8s" / "kubectl"), "version", "--client"),
            "runsc": out(str(BUILD / "runsc"), "--version"),
            "containerd": out(str(BUILD / "containerd"), "--version")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each, cold and thaw alternating")
    ap.add_argument("--replicas", type=int, default=6)
    ap.add_argument("--workloads", default="server", help="comma-separated: server, pod")
    ap.add_argument("--weights-mb", type=int, default=256)
    ap.add_argument("--sidecar-weights-mb", type=int, default=32, help="pod: the sidecar's state")
    ap.add_argument("--warmup-rounds", type=int, default=6, help="pod: hash passes at start (server: one)")
    ap.add_argument("--settle-s", type=float, default=3.0, help="pause between rounds")
    ap.add_argument("--name", default="bench-cluster", help="the cluster's name")
    ap.add_argument("--base", type=Path, default=Path("/var/tmp/thaw-bench-cluster"))
    ap.add_argument("--keep", action="store_true", help="keep --base's logs (thawd's, the nodes')")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    workloads = [w for w in a.workloads.split(",") if w]
    if not workloads or set(workloads) - {"server", "pod"}:
        ap.error(f"--workloads {a.workloads!r}: each must be server or pod")
    if os.geteuid() != 0:
        print("bench/cluster.py: error: run as root (the cluster's nodes, cgroups, bridge)", file=sys.stderr)
        return 69
    missing = [x for x in (*clustermod.NEEDED, "k8s/helm", "thaw-daemonset.oci.tar") if not (BUILD / x).exists()]
    if missing:
        print(f"bench/cluster.py: error: not built in {BUILD}: {', '.join(missing)} (make setup)", file=sys.stderr)
        return 69
    t0 = time.monotonic()
    result: dict = {
        "benchmark": "cluster", "date": time.strftime("%Y-%m-%d"), "started_utc": time.strftime("%H:%M:%S"),
        "invocation": shlex.join([".venv/bin/python", "bench/cluster.py", *sys.argv[1:]]), **facts(),
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
        "measure": "monotonic seconds of this process as a watch on the API server saw the pods "
                   "(control/dev/podwatch.py): all_ready_s from just before `kubectl scale --replicas=N` to the "
                   "N-th pod's Ready condition True (the kubelet's status); create_to_ready_s from the pod's ADDED "
                   "event to its Ready; api_created / api_ready: the API's own timestamps (whole seconds)",
        "cold": "the same pod template on the same RuntimeClass (runsc-thaw: gVisor's shim, thaw's stand-in, "
                "runsc), image, probes and nodes without the opt-in annotation thaw.dev/workload: every pod starts "
                "its workload from the entrypoint and thawd does nothing for it (no checkpoint after)",
        "thaw": "opted in (thaw.dev/workload); its image published by thawd after one seed pod's cold start on "
                "node a; node b's first pod of a round streams the image from the store when b's cache lacks it, "
                "its others wait for that entry (thawd.prepare_timeout_s 30)",
        "topology": "two nodes of one machine (control/dev/cluster.py), a topology spread of maxSkew 1: half "
                    "the pods on each; SeaweedFS on the cluster's bridge as the store",
        "repeat": a.repeat}
    base = a.base
    shutil.rmtree(base, ignore_errors=True)
    c = clustermod.Cluster(base / "cluster", a.name)
    weed = None
    b = Bench(c, t0)
    rc = 0
    try:
        t = time.monotonic()
        c.start()
        weed = Seaweed(base / "weed", host=c.host_address).start()
        files = ocibuild.busybox_files(BUILD / "busybox", {"/app/run.sh": ocibuild.File(POD_SCRIPT, 0o755),
                                                           "/bin/httpd": ocibuild.File(link="busybox"),
                                                           "/bin/mv": ocibuild.File(link="busybox")})
        ocibuild.build(base / "server.tar", IMAGE, files, ["/app/run.sh"])
        c.import_image(base / "server.tar")
        result["cluster_up_s"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        vals = chart_values(c, weed, "bench-cluster")
        shown = {**vals, "store": {**vals["store"], "credentials": "(SeaweedFS's, generated)"}}
        b.commands.append({"t_s": round(t - t0, 3), "cmd": "helm upgrade --install thaw deploy/helm/thaw --namespace "
                           f"thaw-system --create-namespace --wait -f values.json # {json.dumps(shown)}; image "
                           "build/thaw-daemonset.oci.tar imported into each node, pullPolicy Never; nodes labelled "
                           "thaw.dev/node=true (control/dev/chart.py install)"})
        chart.install(c.kubeconfig, values=vals, nodes=c.node_names, load_image=c.import_image, pull_never=True,
                      timeout_s=300)
        result["helm_install_s"] = round(time.monotonic() - t, 3)
        result["workloads"] = {}
        for wl in workloads:
            run_workload(b, wl, a, result["workloads"].setdefault(wl, {}))
    except Exception as e:  # noqa: BLE001 - what ran so far is still written, with the error
        result["error"] = f"{type(e).__name__}: {e}"
        rc = 1
    finally:
        result["commands"] = b.commands
        result["total_s"] = round(time.monotonic() - t0, 1)
        try:
            if a.keep:
                keep_logs(c, base / "logs")
            c.stop()
            left = c.leftovers()
            if left:
                result["leftovers"] = left
        except (ThawError, OSError) as e:
            result["stop_error"] = str(e)
            rc = 1
        finally:
            if weed is not None:
                weed.stop()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    emit(result, a.out)
    return rc


def keep_logs(c, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for n in c.nodes:
        for f in n.host_path("/var/log/thaw").glob("*.log"):
            (out / f"{n.letter}-{f.name}").write_bytes(f.read_bytes())


if __name__ == "__main__":
    sys.exit(main())
