"""thaw's settings: one table of keys, one frozen dataclass made from it, read once.

Precedence, highest first: CLI flag > environment (THAW_<SECTION>_<KEY>) >
TOML file (THAW_CONFIG, else /etc/thaw/config.toml when it exists) > default.

Every key is one `Key` row in `KEYS`: its name, what it accepts, its default,
its help line and, for numbers, its range. Everything else is derived from
that row: the environment variable, the `Settings` field, validation,
`thaw config`, the docs table (ci/update-config-docs.py), provision's seeded
config, and the Go stand-in's table of the keys it reads
(go/internal/standin/config_keys.go, generated). A bad value raises ConfigError
naming the key and where the value came from. No other module reads os.environ.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from control.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("/etc/thaw/config.toml")  # twin: go/internal/standin/config.go DefaultConfigFile
REPO_ROOT = Path(__file__).resolve().parent.parent
from control.config_env import ENV_NOT_KEYS  # noqa: F401  (tests and check_env read it here)
from control.install import DEFAULT_INSTALL_DIR, RELEASE_MARKER, Install, install_of  # noqa: F401

INSTALL = install_of(REPO_ROOT)
BIN_DIR = INSTALL.bin_dir   # the binary keys' defaults

# The version label the build stamps into runsc (ci/build-go.sh computes the
# same "thaw-gvisor-<commit>" from go/go.mod's gvisor.dev/gvisor pseudo-version);
# restore refuses images written by a runsc with another label. Not derived at
# import: an installed thaw has no go/go.mod. Twins: go/go.mod, ci/build-go.sh
# `label`; tests/unit/test_config.py checks all three agree.
GVISOR_COMMIT = "160fafc42237"
RUNSC_VERSION_LABEL = f"thaw-gvisor-{GVISOR_COMMIT}"

from control.config_kinds import (ABS_PATH, BOOL, DNS_LABEL, INT, IPV4, IPV4_SLOTS, MARK, OPT_PATH,  # noqa: F401
                                  PATH, POW2_SIZE, SECONDS, SIZE, SOCKET, STR, TENANT_MAP, TENANT_PATTERN, WORDS,
                                  _SIZE_UNITS, Kind, Pairs, one_of)


# -- keys -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    """One setting. `name` is "section.name" (`name` inside `[section]`)."""
    name: str
    kind: Kind
    default: Any
    help: str
    range: tuple[float, float] | None = None  # inclusive bounds; every numeric key has one
    field: str = ""          # the Settings attribute; default: the name with "." -> "_"
    standin: bool = False    # the Go stand-in reads it too (go/internal/standin/config_keys.go)
    installed: str = ""      # a binary `thaw provision` installs into <node.install_dir>/bin

    def __post_init__(self) -> None:
        if not self.field:
            object.__setattr__(self, "field", self.name.replace(".", "_"))
        if self.kind.numeric != (self.range is not None):
            raise TypeError(f"config key {self.name}: numeric keys, and only they, need a range")

    @property
    def env(self) -> str:
        """THAW_<SECTION>_<NAME>."""
        return "THAW_" + self.name.replace(".", "_").upper()

    @property
    def type_doc(self) -> str:
        if self.range is None:
            return self.kind.name
        lo, hi = (_show_number(self, x) for x in self.range)
        return f"{self.kind.name}, {lo} .. {hi}"

    def parse(self, raw: Any, source: str) -> Any:
        """The value of `raw` from `source` ("env THAW_...", "file PATH", ...)."""
        try:
            value = self.kind.parse(raw)
            if self.range is not None and not self.range[0] <= value <= self.range[1]:
                lo, hi = (_show_number(self, x) for x in self.range)
                raise ValueError(f"expected {lo} .. {hi}, got {raw!r}")
        except ValueError as e:
            raise ConfigError(self.name, f"{e} (from {source})") from None
        return value


def _show_number(key: Key, x: float) -> str:
    if key.kind in (SIZE, POW2_SIZE) and x:
        for suffix, unit in reversed(_SIZE_UNITS.items()):
            if x % unit == 0:
                return f"{int(x // unit)}{suffix}"
    if key.kind is MARK and x >= 1 << 16:
        return hex(int(x))
    return f"{x:g}"


_K, _M, _G, _T = (_SIZE_UNITS[u] for u in "kmgt")
_DAY = 86400.0

KEYS: tuple[Key, ...] = (
    # [runsc]
    Key("runsc.path", PATH, BIN_DIR / "runsc",
        "The real runsc binary (thawd and the stand-in run it). `thaw provision` writes "
        "<node.install_dir>/bin/runsc. The stand-in runs the runsc installed beside it.", installed="runsc"),
    Key("runsc.root", PATH, Path("/run/thaw/runsc"),
        "runsc --root for sandboxes thaw starts itself (tests, `thaw run`)."),
    Key("runsc.platform", one_of("systrap", "ptrace", "kvm"), "systrap",
        "runsc --platform; systrap fits VMs without nested virtualisation."),
    Key("runsc.flags", WORDS, (),
        "Extra runsc global flags (`--name` or `--name=value`) on every call, also written into "
        "runsc.toml's [runsc_config] for containerd's shim."),
    Key("runsc.timeout_s", SECONDS, 120.0, "Deadline of one runsc call.", range=(1, _DAY)),
    Key("runsc.timeout_per_gib_s", SECONDS, 4.0, "Seconds added to runsc.timeout_s per GiB a checkpoint "
        "saves (sandbox and GPU memory) or a restore loads (the image): deadlines scale with the footprint "
        "(control/lifecycle/deadlines.py). 0: the fixed runsc.timeout_s.", range=(0, 3600)),
    # [node]
    Key("node.state_dir", ABS_PATH, Path("/var/lib/thaw"),
        "thaw's own state: sandbox records, netns leases.", field="state_dir"),
    Key("node.log_dir", ABS_PATH, Path("/var/log/thaw"),
        "runsc and shim logs (the shim writes <log_dir>/shim/runsc-shim-<id>.log); the workload logs and "
        "exit status of `thaw run`/`thaw restore` sandboxes (<log_dir>/sandboxes/<id>/, `thaw logs`).",
        field="log_dir", standin=True),
    # The lower bound's twins: go/cmd/thaw-monitor/log.go minMaxBytes, control/lifecycle/logs.py MIN_MAX_BYTES.
    Key("node.log_max_bytes", SIZE, 8 * _M,
        "A `thaw run`/`thaw restore` sandbox's workload log (stdout and stderr, "
        "<log_dir>/sandboxes/<id>/workload.log) is rotated to workload.log.1 at this size; one old file is "
        "kept, so a sandbox's log takes at most twice this.", field="log_max_bytes", range=(64 * _K, 1024 * _G)),
    Key("node.run_grace_s", SECONDS, 2.0,
        "How long `thaw run` watches a new workload before it answers: one that exits meanwhile makes the "
        "command fail with its exit status and last log lines (the sandbox stays, stopped, for `thaw logs`). "
        "0: answer at once. Later exits: `thaw health ID`, `thaw ps`.", field="run_grace_s", range=(0, 600)),
    Key("node.machine_type", STR, "unknown",
        "Machine type in the compatibility tuple (e.g. the cloud instance type).", field="machine_type"),
    Key("node.install_dir", ABS_PATH, INSTALL.prefix,
        "Where `thaw provision` installs runsc, the shim, the stand-in and the CUDA helper (<dir>/bin). "
        "A release install's default is the prefix it was installed into (install.sh --prefix).",
        field="install_dir"),
    Key("node.gpu", one_of("auto", "yes", "no"), "auto",
        "Is this a GPU node? auto: if an NVIDIA GPU is found. yes: missing GPU fails the checks. "
        "no: never enable nvproxy.", field="gpu"),
    Key("node.huge_pages", one_of("auto", "yes", "no"), "auto",
        "Host shmem transparent huge pages, without which runsc backs a sandbox's memory with 4 KiB pages "
        "(it needs shmem_enabled = advise and defrag always, defer or never: runsc/boot/loader.go "
        "createMemoryFile). `thaw provision` sets them now and at every boot (/etc/tmpfiles.d). auto: on a "
        "GPU node (H200, 2026-12-01: ~8B restore 7.84 -> 4.47 s, GPT-2-large 2.15 -> 1.64 s, docs/notes/2026-11-29-gpu-restore-journal.md); "
        "yes: on any node; no: the host's settings are left as they are.", field="huge_pages"),
    # [containerd]
    Key("containerd.config", ABS_PATH, Path("/etc/containerd/config.toml"),
        "containerd's main config file; provision adds one `imports` line to it only if it does not "
        "already import the drop-in directory."),
    Key("containerd.dropin_dir", ABS_PATH, Path("/etc/containerd/conf.d"),
        "Directory of containerd config drop-ins; thaw writes thaw.toml here."),
    Key("containerd.runtime_handler", DNS_LABEL, "runsc-thaw",
        "CRI runtime handler name (the RuntimeClass `handler`).", field="runtime_handler"),
    Key("containerd.runsc_root", ABS_PATH, Path("/run/containerd/runsc"),
        "runsc root of sandboxes containerd's shim starts (runsc.toml `root`); runsc state lives in "
        "<root>/<containerd namespace>."),
    Key("containerd.restart_command", WORDS, ("systemctl", "restart", "containerd"),
        "Command that restarts containerd, run by `thaw provision --restart-containerd` after its "
        "config changed."),
    Key("containerd.address", SOCKET, "/run/containerd/containerd.sock",
        "containerd's gRPC socket. thawd asks containerd (through thaw-ctrinfo) whose a container is and "
        "which image digest it runs (docs/security.md)."),
    Key("containerd.cri_namespace", STR, "k8s.io",
        "containerd namespace of the CRI plugin's containers: only there does the pod's Kubernetes "
        "namespace, from the CRI plugin's own records, name the tenant."),
    Key("containerd.info", PATH, BIN_DIR / "thaw-ctrinfo",
        "The thaw-ctrinfo binary that reads containerd's records of a container (go/cmd/thaw-ctrinfo). "
        "`thaw provision` writes /opt/thaw/bin/thaw-ctrinfo.", installed="thaw-ctrinfo"),
    Key("containerd.info_timeout_s", SECONDS, 2.0,
        "Deadline of one thaw-ctrinfo lookup; a container whose identity is not known in time starts cold.",
        range=(0.1, 60)),
    # [tenancy]
    Key("tenancy.map", TENANT_MAP, Pairs(),
        "Node-level tenant mapping: `\"<origin>:<name>\" = \"<tenant>\"` with origin k8s (a Kubernetes "
        "namespace), ctr (a containerd namespace) or user (a local user); unmapped ones are "
        "`<origin>-<name>` (docs/security.md).", field="tenant_map"),
    # [network]
    Key("network.subnet", IPV4_SLOTS, "10.213.0.0/16", "Sandbox addresses come from here (one /30 per sandbox)."),
    Key("network.publish_address", IPV4, "127.0.0.1",
        "Node address published sandbox ports are forwarded from (DNAT)."),
    Key("network.probe_mark", MARK, 0x7468,
        "Packet mark of thaw's health probes: they pass a closed ingress gate.", range=(1, (1 << 32) - 1)),
    Key("network.egress", BOOL, True, "Masquerade sandbox traffic leaving the node."),
    # [store]
    Key("store.endpoint", STR, "",
        "S3 endpoint URL; empty: boto3's default resolution (AWS). Credentials are not thaw keys: boto3 "
        "reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or its other sources."),
    Key("store.bucket", STR, "thaw", "S3 bucket holding chunks and manifests."),
    Key("store.region", STR, "us-east-1", "S3 region."),
    Key("store.prefix", STR, "", "Key prefix inside the bucket."),
    Key("store.profile", STR, "", "boto3 profile name; empty: boto3's default credential chain."),
    Key("store.credentials_file", OPT_PATH, None, "boto3 shared credentials file; empty: boto3's default."),
    Key("store.workers", INT, 8, "Parallel chunk transfers; each holds one chunk in memory (the memory bound).",
        range=(1, 256)),
    Key("store.timeout_s", SECONDS, 30.0, "Connect and read timeout of one S3 request.", range=(1, 3600)),
    Key("store.retries", INT, 3, "Retries of a failed S3 request after its first try, counted as botocore's "
        "'standard' mode counts them (3: 4 tries; 0: none). Twin: go/internal/fetch/retry.go.", range=(0, 20)),
    Key("store.retry_budget_s", SECONDS, 30.0, "A failed S3 request is retried on past store.retries until this "
        "long after its first try, so a pull rides out a store's slow-down or 5xx window; 0: botocore's standard "
        "mode alone (docs/store.md, \"Retry policy\").", range=(0, 3600)),
    # SigV4 presigned URLs live at most 7 days; with temporary credentials a
    # URL stops working when they expire, whichever comes first.
    Key("store.presign_expires_s", INT, 6 * 3600,
        "Lifetime of the presigned URLs a fetch reads packs through: hours of margin for a large image "
        "on a slow link (S3 allows 7 days at most).", range=(60, 7 * _DAY)),
    Key("store.fetcher", PATH, BIN_DIR / "thaw-fetch",
        "The thaw-fetch binary (go/cmd/thaw-fetch over go/internal/fetch, the one fetch engine) that runs a "
        "pull's ranged GETs, checks and writes: every pull of a chunk not on this node needs it "
        "(docs/store.md, \"Why the fetch is in Go\"). `thaw provision` writes /opt/thaw/bin/thaw-fetch.",
        installed="thaw-fetch"),
    Key("store.stream", BOOL, True,
        "Restore an image this node does not hold while it streams in from the store (thaw-gofer as "
        "runsc's checkpoint-gofer sidecar: reads wait for verified bytes, faulted ranges are fetched first), "
        "instead of pulling it whole first; the cache fills as it streams, under the same lock and lease as "
        "a pull. On: first answer from an empty cache 0.26x the pull's at 200 MB/s, 0.60x at 1 GB/s (1 GB "
        "CPU image, bench/stream.py), 0.39x for a 7.5 GB GPU image on the H200 (bench/gpu/node.sh); an encrypting tenant's chunks are opened by the stream, and a "
        "Kubernetes pod's image streams as a lone container's. Pulled whole, logged, without thaw-gofer at "
        "store.gofer; false: always (docs/store.md \"Streaming restore\")."),
    Key("store.gofer", PATH, BIN_DIR / "thaw-gofer",
        "The thaw-gofer binary (go/cmd/thaw-gofer): the stream and runsc's checkpoint-gofer sidecar of a "
        "streamed restore. `thaw provision` writes /opt/thaw/bin/thaw-gofer.", installed="thaw-gofer"),
    Key("store.stream_deadline_s", SECONDS, 30.0,
        "How long a streamed restore's read may wait for bytes not yet arrived; then runsc kills the "
        "sandbox and the container starts cold. A stream that fails fails its waiting reads at once.",
        range=(0.1, 3600)),
    Key("store.stream_logs_keep", INT, 100,
        "How many streams' thaw-gofer logs (<node.log_dir>/streams/<entry>.gofer.log, one per streamed "
        "restore) are kept; each new stream removes the oldest beyond this.", range=(1, 1_000_000)),
    Key("store.encrypt", BOOL, False,
        "Encrypt every chunk and manifest with the tenant's key (AES-256-GCM, convergent within a tenant); "
        "a tenant without a key file then neither publishes nor restores."),
    Key("store.tenant_keys_dir", OPT_PATH, None,
        "Directory of tenant keys: one file per tenant, named after the tenant id, holding 32 random bytes "
        "(raw or 64 hex digits), mode 0400 or 0600."),
    # The store's lifecycle (control/images/gc.py, docs/operate.md): one grace for every node,
    # since a publish on one node is protected from a GC run on another by it.
    Key("store.gc_grace_s", SECONDS, 6 * 3600.0,
        "Store GC waits this long before it condemns an unreferenced pack and as long again before it "
        "deletes it; a publish that takes longer than this from its first probe to its manifest is refused "
        "(it could name a pack a GC has condemned). Set the same value on every node.", range=(1, 30 * _DAY)),
    Key("store.retain_max_age_s", SECONDS, 0.0,
        "`thaw gc --store` removes images published longer ago than this; 0: no age limit.",
        range=(0, 3650 * _DAY)),
    Key("store.retain_keep", INT, 0,
        "`thaw gc --store` keeps this many of the newest images of each workload and node tuple and removes "
        "older ones; 0: no count limit.", range=(0, 100000)),
    Key("store.manifest_key_file", OPT_PATH, None,
        "The cluster's manifest key (32 random bytes, raw or hex; every node shares it): manifests are "
        "published with its HMAC-SHA256 tag and refused without a valid one. Empty: manifests are neither "
        "signed nor checked."),
    # [pack]
    Key("pack.chunker", PATH, BIN_DIR / "thaw-chunk",
        "The thaw-chunk binary (FastCDC, SHA-256 + BLAKE3, go/cmd/thaw-chunk). `thaw provision` writes "
        "/opt/thaw/bin/thaw-chunk.", installed="thaw-chunk"),
    # Max: chunks are at most 4x the average, and manifest.MAX_CHUNK_BYTES is 64 MiB.
    Key("pack.avg_chunk_bytes", POW2_SIZE, 256 * _K, "FastCDC average chunk size (min = avg/4, max = avg*4).",
        range=(4 * _K, 16 * _M)),
    # [cache]
    Key("cache.dir", ABS_PATH, Path("/var/lib/thaw/cache"), "Local checkpoint cache (put it on local NVMe)."),
    Key("cache.budget_bytes", SIZE, 100 * _G,
        "Cache size budget; least recently used entries are evicted above it. doctor warns when the file "
        "system has less free space.", range=(1 * _M, 1024 * _T)),
    Key("cache.lock_timeout_s", SECONDS, 900.0, "How long a pull waits for another pull of the same key.",
        range=(1, _DAY)),
    Key("cache.verify", one_of("read", "stat", "full"), "read",
        "How a restore from the node cache trusts the entry (issue 30). read: runsc reads it through thaw-gofer, "
        "which checks every chunk as it is read (against its BLAKE3-256 where the manifest carries one, else "
        "its SHA-256 name; a BLAKE3 mismatch is checked against the SHA-256 before it counts), so an altered "
        "byte fails the restore "
        "(cold start, entry marked corrupt and fetched again) instead of restoring altered memory; without "
        "thaw-gofer at store.gofer, a full check first. stat: runsc reads the files directly, checked by size, "
        "inode, mtime and ctime only. full: every chunk re-hashed before every use (docs/store.md \"Cache\")."),
    Key("cache.scrub_interval_s", SECONDS, 86400.0,
        "thawd re-hashes every idle cache entry at least this often (a low-priority thread at "
        "cache.scrub_bytes_per_s): an entry found altered is marked corrupt and fetched again on its next use. "
        "`thaw pull` re-hashes an entry not checked within this long before it calls it ready. 0: never.",
        range=(0, 365 * _DAY)),
    Key("cache.scrub_bytes_per_s", SIZE, 64 * _M,
        "The scrub's read rate bound (bytes per second, one thread at nice 19 and idle I/O priority).",
        range=(1 * _M, 64 * _G)),
    Key("cache.direct_io", BOOL, True,
        "Write fetched pages with O_DIRECT (whole pages; the file system's refusal falls back to buffered "
        "writes): no page-cache copy or reclaim, and the node's cached files are not evicted; the first "
        "restore then reads the image from disk. With thaw-fetch it made a 2 GiB fetch ~1.2x faster than "
        "buffered writes here (docs/store.md)."),
    Key("cache.min_free_bytes", SIZE, 10 * _G,
        "provision and doctor fail when the cache file system has less free space.", range=(0, 1024 * _T)),
    # [thawd]
    Key("thawd.decisions_kept", INT, 256,
        "How many of thawd's last decisions (restore, adopt or cold, and why; a restore's result) "
        "`thaw stats --decisions` can show; each is also a log line.", range=(1, 100000)),
    Key("thawd.socket", ABS_PATH, Path("/run/thaw/thawd.sock"),
        "thawd's gRPC Unix socket (root-only directory); the stand-in dials it.", standin=True),
    Key("thawd.metrics_addr", STR, "127.0.0.1:9464", "host:port of thawd's Prometheus /metrics endpoint; empty: off."),
    Key("thawd.prepare_timeout_s", SECONDS, 4.0,
        "How long create waits for an image fetch before answering cold (the fetch goes on). The stand-in "
        "gives thawd this plus 1 s to answer (go/internal/standin prepareSlack).", range=(0.5, 60), standin=True),
    Key("thawd.health_timeout_s", SECONDS, 30.0,
        "Deadline of a health check, all attempts: thawd's check after a restore under containerd (an "
        "unhealthy restore starts cold; PrepareRestore tells the stand-in how long to wait for it, this plus "
        "runsc.timeout_s and the hooks), and `thaw restore`'s and `thaw health`'s.",
        range=(0.5, 3600)),
    Key("thawd.health_attempt_timeout_s", SECONDS, 2.0,
        "Timeout of one health probe attempt of `thaw restore` / `thaw health`.", range=(0.1, 600)),
    Key("thawd.ready_timeout_s", SECONDS, 600.0,
        "How long a cold-started workload may take to become ready for its automatic checkpoint.",
        range=(1, _DAY)),
    Key("thawd.pod_assembly_timeout_s", SECONDS, 120.0,
        "How long a restoring Kubernetes pod may take from its sandbox's restore to its last container's: "
        "runsc restores the sandbox only then, and the kubelet creates the containers one after the other "
        "(pulling images in between); it includes the last one's `runsc restore`, which loads the kernel "
        "from the image (through the stream's reads when it streams: keep it above store.stream_deadline_s). "
        "Past it thawd removes the sandbox and the kubelet re-creates the pod, cold.", range=(1, _DAY)),
    Key("thawd.quarantine_after", INT, 3,
        "Consecutive failed restores after which an image is quarantined (cold starts only).", range=(1, 1000)),
    Key("thawd.auto_checkpoint", BOOL, True,
        "Checkpoint an opted-in workload automatically after its first cold start."),
    Key("thawd.leave_running", BOOL, True,
        "Keep the workload serving after the automatic checkpoint (false: recycle it)."),
    Key("thawd.gate", BOOL, True,
        "Diagnostics only: false keeps the network gate of containers in namespaces thaw plumbed open "
        "over checkpoint and restore (bench/network_flood.py --door containerd measures the difference)."),
    Key("thawd.health_check", BOOL, True,
        "Diagnostics only: false skips the health check after a restore under containerd (traffic may "
        "reach a restore that does not answer; bench/network_flood.py --door containerd)."),
    Key("thawd.workers", INT, 8,
        "thawd's background jobs at once: image pulls and automatic checkpoints (one of those waits up to "
        "ready_timeout_s for its workload; a pull beyond this waits, and its create answers cold).",
        range=(1, 256)),
    Key("thawd.rpc_workers", INT, 16,
        "gRPC requests thawd serves at once; a container start holds one for up to prepare_timeout_s "
        "(create) and its Restore deadline (start).", range=(1, 1024)),
    # [kubernetes]: what thawd asks the API server (control/thawd/kubeapi.py, docs/kubernetes.md).
    Key("kubernetes.events", BOOL, False,
        "Post an Event on the pod for each of thawd's decisions (restored from which image in how long, started "
        "cold and why, checkpointed, quarantined), repeats counted as the kubelet counts them; from a bounded "
        "queue by a worker thread: a slow or failing API server never delays a start."),
    Key("kubernetes.read_pods", BOOL, False,
        "Read a thaw pod's spec when its sandbox is created and use its readinessProbes as its containers' "
        "readiness and health probes (thaw.dev/ready annotations override them); no answer within "
        "kubernetes.timeout_s: the annotations alone."),
    Key("kubernetes.kubeconfig", OPT_PATH, None, "A kubeconfig for thawd outside a pod; empty: its pod's account."),
    Key("kubernetes.server", STR, "", "The API server's URL; empty: the kubeconfig's, else the pod's service's."),
    Key("kubernetes.node_name", STR, "", "This node's name (the Events' source); empty: the host name."),
    Key("kubernetes.timeout_s", SECONDS, 1.0,
        "Deadline of one API request (a pod's create waits at most this for its spec; after a failure, "
        "no spec is asked for 30 s).", range=(0.05, 60)),
    # [park]: sandboxes restored ahead of demand (control/thawd/parking.py, docs/parking.md).
    Key("park.enabled", BOOL, False,
        "Keep sandboxes restored ahead of demand (parked: every page in, GPU state checkpointed, GPU memory "
        "free) for the workloads started on this node; the next matching container adopts one instead of "
        "restoring. Lone containers under containerd only (not Kubernetes pods)."),
    Key("park.per_key", INT, 1,
        "Parked sandboxes kept per workload key (each adoption parks the next one).", range=(1, 64)),
    Key("park.memory_budget_bytes", SIZE, 32 * _G,
        "Host memory all parked sandboxes may hold together (each about its image's memory file); a park "
        "that does not fit removes those of less recently started workloads, or is not made.",
        range=(1 * _M, 64 * _T)),
    Key("park.idle_s", SECONDS, 1800.0,
        "A parked sandbox whose workload has not been started for this long is removed.", range=(1, 30 * _DAY)),
    # [standin]: the runsc stand-in (go/cmd/thaw-runsc-hooks) reads these from the same file and env.
    Key("standin.state_dir", ABS_PATH, Path("/run/thaw/standin"),
        "Where the stand-in keeps create's decision for start and delete (one small file per container).",
        standin=True),
    Key("standin.log", ABS_PATH, Path("/var/log/thaw/standin.log"),
        "The stand-in's decision log: one JSON line per create/start/delete decision.", standin=True),
    # Bounded logs (issue 33): the stand-in rotates its own log, and at each container's delete
    # bounds the shim's per-container logs (go/internal/standin/logrotate.go).
    Key("standin.log_max_bytes", SIZE, 16 * _M,
        "standin.log is rotated (to standin.log.1, .2, ...) once it reaches this size.", range=(64 * _K, 1 * _G),
        standin=True),
    Key("standin.log_keep", INT, 3, "How many rotated stand-in logs are kept (standin.log.1 .. .N).",
        range=(1, 100), standin=True),
    Key("standin.shim_logs_keep", INT, 500,
        "How many deleted containers' shim logs (<node.log_dir>/shim/runsc-shim-<id>.log) are kept; at each "
        "container's delete the stand-in removes the oldest beyond this. A running container's is never removed.",
        range=(1, 1_000_000), standin=True),
    Key("standin.shim_log_max_bytes", SIZE, 8 * _M,
        "A deleted container's shim log larger than this is cut to its last this many bytes; a running "
        "container's holds at most this many on disk (thawd frees the older ones in place every minute: "
        "docs/operate.md).",
        range=(64 * _K, 1 * _G), standin=True),
    # [checkpoint]
    Key("checkpoint.compression", one_of("none", "flate-best-speed"), "none", "runsc checkpoint --compression."),
    # On by default since 2026-12-01: an ~8B GPU restore answered in 6.2 s without it and
    # 3.6 s with it (bench/results/gpu-speed-2026-12-01-loader.json, docs/notes/2026-11-29-gpu-restore-journal.md); a save
    # waits for the loading to end (pgalloc MemoryFile.SaveTo -> AwaitLoadAll).
    Key("checkpoint.restore_background", BOOL, True,
        "runsc restore --background: the workload runs while its memory still loads (off: every page is "
        "loaded before it runs).", field="restore_background"),
)

_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
# Keys that were merged or renamed: a file or env still naming one is an error
# that says where the value goes now, never silently ignored.
RENAMED: dict[str, str] = {
    "health.timeout_s": "thawd.health_timeout_s",
    "health.attempt_timeout_s": "thawd.health_attempt_timeout_s",
}


def key(name: str) -> Key:
    """The Key of a dotted name; ConfigError for an unknown one."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(name, _unknown(name)) from None


def _unknown(name: str, where: str = "") -> str:
    new = RENAMED.get(name)
    if new:
        return f"renamed to {new}" + (f" (found in {where})" if where else "")
    near = difflib.get_close_matches(name, _BY_NAME, n=1, cutoff=0.8)
    return ("unknown key" + (f" in {where}" if where else "")
            + (f" (did you mean {near[0]}?)" if near else ""))


def _env_key(var: str) -> str:
    """The dotted key an environment variable would set, THAW_<SECTION>_<NAME> -> section.name
    (the section is the longest known one its name starts with), else the variable itself."""
    rest = var[len("THAW_"):].lower()
    for sec in sorted({k.name.split(".", 1)[0] for k in KEYS}, key=len, reverse=True):
        if rest.startswith(sec + "_") and len(rest) > len(sec) + 1:
            return f"{sec}.{rest[len(sec) + 1:]}"
    return var


def check_env(environ: Mapping[str, str]) -> None:
    """ConfigError for the first THAW_* variable that names no key (nor one of
    ENV_NOT_KEYS), worded as an unknown key in a file is: "config cache.dirs:
    unknown key in env <its name> (did you mean cache.dir?)"."""
    known = {k.env for k in KEYS} | set(ENV_NOT_KEYS)
    for var in sorted(environ):
        if var.startswith("THAW_") and var not in known:
            name = _env_key(var)
            if name in RENAMED:
                continue   # load() says where it went
            raise ConfigError(name, _unknown(name, f"env {var}"))


# -- Settings: made from KEYS ----------------------------------------------------------

def _runsc_available(self) -> bool:
    return self.runsc_path.is_file() and os.access(self.runsc_path, os.X_OK)


Settings = dataclasses.make_dataclass(
    "Settings", [(k.field, k.kind.type) for k in KEYS], frozen=True,
    namespace={"__doc__": "Every key's value, one field per KEYS row (Key.field).", "__module__": __name__,
               "runsc_available": property(_runsc_available)})


def values(settings: Settings) -> list[tuple[Key, Any]]:
    """(key, value) of every setting, in table order."""
    return [(k, getattr(settings, k.field)) for k in KEYS]


def replace(settings: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(settings, **changes)


# -- rendering --------------------------------------------------------------------------

def render_value(value: Any) -> str:
    """A setting's value as TOML would spell it (docs, `thaw config`, seed configs)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Pairs):
        return "{" + ", ".join(f'"{k}" = "{v}"' for k, v in value) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{w}"' for w in value) + "]"
    return f'"{value}"'


def render_toml(items: list[tuple[Key, Any]], header: tuple[str, ...] = ()) -> str:
    """A config file setting `items` (grouped into their sections, in order)."""
    lines = list(header)
    section = None
    for k, value in items:
        sec, name = k.name.split(".", 1)
        if sec != section:
            lines += ([""] if lines else []) + [f"[{sec}]"]
            section = sec
        lines.append(f"{name} = {render_value(value)}")
    return "\n".join(lines) + "\n"


def json_value(value: Any) -> Any:
    """A setting's value as JSON (`thaw config --json`)."""
    if isinstance(value, Pairs):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)


def markdown_table() -> str:
    """docs/configuration.md's key table, generated from KEYS (`thaw config --markdown`)."""
    rows = ["| key | env | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for k in KEYS:
        d = k.default
        if isinstance(d, Path) and d.parent == BIN_DIR:
            shown = f"`<bin>/{d.name}`"  # the same doc wherever thaw runs from (docs/configuration.md: <bin>)
        elif k.name == "node.install_dir":
            shown = f"`{render_value(DEFAULT_INSTALL_DIR)}`"
        elif k.kind in (SIZE, POW2_SIZE):
            shown = f'`"{_show_number(k, d)}"`'
        else:
            shown = f"`{render_value(d)}`"
        rows.append(f"| `{k.name}` | `{k.env}` | {k.type_doc} | {shown} | {k.help} |")
    return "\n".join(rows) + "\n"


# -- loading ------------------------------------------------------------------------------

def load(overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None,
         config_file: Path | None = None,
         default_file: Path = DEFAULT_CONFIG_FILE) -> Settings:
    """Build Settings from defaults < TOML file < environment < overrides.

    `overrides` are CLI values by dotted key; None values are ignored. The
    file is `config_file`, else $THAW_CONFIG, else `default_file` when it
    exists (`thaw provision --root DIR` passes DIR/etc/thaw/config.toml).
    The stand-in follows the same rules for its keys (go/internal/standin/config.go).
    """
    environ = os.environ if environ is None else environ
    if INSTALL.error:
        raise ConfigError("node.install_dir", INSTALL.error)
    found: dict[str, Any] = {}

    path = config_file or (Path(environ["THAW_CONFIG"]) if environ.get("THAW_CONFIG") else None)
    if path is None and default_file.is_file():
        path = default_file
    if path is not None:
        for name, raw in _read_toml(path).items():
            found[name] = key(name).parse(raw, f"file {path}")

    for old, new in RENAMED.items():
        old_env = "THAW_" + old.replace(".", "_").upper()
        if old_env in environ:
            raise ConfigError(old, f"renamed to {new}: set {key(new).env} instead of {old_env}")
    check_env(environ)
    for k in KEYS:
        if k.env in environ:
            found[k.name] = k.parse(environ[k.env], f"env {k.env}")

    for name, raw in (overrides or {}).items():
        if raw is not None:
            found[name] = key(name).parse(raw, "command line")

    return Settings(**{k.field: found.get(k.name, k.default) for k in KEYS})


def caller_path(environ: Mapping[str, str] | None = None) -> str:
    """The PATH of the process running thaw: `thaw run` builds a command
    sandbox's PATH from it (runsc_hooks/spec.py sandbox_path). Read here, as
    every other piece of the environment is."""
    return (os.environ if environ is None else environ).get("PATH", "")


def kubernetes_service(environ: Mapping[str, str] | None = None) -> str:
    """The API server's URL in a pod (client-go rest.InClusterConfig's variables); "" outside one."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    return "" if not (host and port) else f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "config file does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), f"not valid TOML: {e}") from None
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(section, f"expected a [{section}] table in {path}")
        for name, raw in table.items():
            dotted = f"{section}.{name}"
            if dotted not in _BY_NAME:
                raise ConfigError(dotted, _unknown(dotted, str(path)))
            flat[dotted] = raw
    return flat
