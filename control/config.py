"""thaw's settings: one frozen dataclass, read once.

Precedence, highest first: CLI flag > environment (THAW_<SECTION>_<KEY>) >
TOML file (THAW_CONFIG, else /etc/thaw/config.toml when it exists) > default.
Every key is declared once in `_KEYS`; a bad value raises ConfigError naming
the key and where the value came from. No other module reads os.environ.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from control.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("/etc/thaw/config.toml")
REPO_ROOT = Path(__file__).resolve().parent.parent

# The version label the build stamps into runsc (ci/build-go.sh computes the
# same "thaw-gvisor-<commit>" from go/go.mod); restore refuses images written
# by a runsc with another label. Twin: ci/build-go.sh `label`.
GVISOR_COMMIT = "160fafc42237"
RUNSC_VERSION_LABEL = f"thaw-gvisor-{GVISOR_COMMIT}"


def _default_build_dir() -> Path:
    return REPO_ROOT / "build"


def _parse_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {v!r}")


def _parse_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    s = v.strip().replace("_", "")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    try:
        if s and s[-1].lower() in units:
            return int(float(s[:-1]) * units[s[-1].lower()])
        return int(s)
    except ValueError:
        raise ValueError(f"expected an integer (suffixes k, m, g, t allowed), got {v!r}") from None


def _parse_mark(v: Any) -> int:
    """A netfilter mark: 1 .. 2**32-1, decimal or 0x hex."""
    if isinstance(v, bool):
        raise ValueError(f"expected an integer mark, got {v!r}")
    n = v if isinstance(v, int) else int(str(v).strip(), 0)
    if not 0 < n < 1 << 32:
        raise ValueError(f"a mark must be 1 .. 0xffffffff, got {v!r}")
    return n


def _parse_ipv4(v: Any) -> str:
    import ipaddress
    s = _parse_str(v)
    try:
        return str(ipaddress.IPv4Address(s))
    except ValueError:
        raise ValueError(f"expected an IPv4 address, got {s!r}") from None


def _parse_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a number, got {v!r}")
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {v!r}")
    return f


def _parse_str(v: Any) -> str:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ValueError(f"expected a string, got {v!r}")
    return str(v)


def _parse_opt_path(v: Any) -> Path | None:
    s = _parse_str(v)
    return Path(s) if s else None


def _parse_path(v: Any) -> Path:
    s = _parse_str(v)
    if not s:
        raise ValueError("expected a path, got an empty string")
    return Path(s)


def _parse_abs_path(v: Any) -> Path:
    p = _parse_path(v)
    if not p.is_absolute():
        raise ValueError(f"expected an absolute path, got {str(p)!r}")
    return p


def _parse_words(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(w for w in v.split() if w)
    if isinstance(v, (list, tuple)) and all(isinstance(w, str) for w in v):
        return tuple(v)
    raise ValueError(f"expected a list of strings, got {v!r}")


# A tenant id: lower-case letters, digits and '-', at most 48 characters, no
# '.' (a workload key's first '.'-separated field is its tenant) and no '_' or
# '%' (the node cache matches a tenant's entries with SQL LIKE). Used by
# control/lifecycle/tenant.py for derived ids and here for mapped ones.
TENANT_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?"
# What a mapping key names: <origin>:<name>, origin k8s (a Kubernetes
# namespace), ctr (a containerd namespace) or user (a local user).
_TENANT_SOURCE = r"(k8s|ctr|user):[A-Za-z0-9][A-Za-z0-9._-]{0,75}"


class Pairs(tuple):
    """A mapping setting, kept as sorted (key, value) pairs so Settings stays hashable."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self).get(key, default)


def _parse_tenant_map(v: Any) -> Pairs:
    """<origin>:<name> -> tenant. TOML: an inline table; env: "k8s:a=t1,ctr:b=t2"."""
    if isinstance(v, dict):
        items = list(v.items())
    elif isinstance(v, str):
        items = []
        for part in (p.strip() for p in v.split(",")):
            if not part:
                continue
            if "=" not in part:
                raise ValueError(f"expected <origin>:<name>=<tenant> pairs separated by commas, got {part!r}")
            k, _, t = part.partition("=")
            items.append((k.strip(), t.strip()))
    else:
        raise ValueError(f"expected a table of <origin>:<name> = <tenant>, got {v!r}")
    for k, t in items:
        if not isinstance(k, str) or not re.fullmatch(_TENANT_SOURCE, k):
            raise ValueError(f"{k!r} is not <origin>:<name> with origin k8s, ctr or user")
        if not isinstance(t, str) or not re.fullmatch(TENANT_PATTERN, t):
            raise ValueError(f"tenant {t!r} for {k!r}: expected 1-48 of a-z 0-9 '-', starting and ending "
                             "with a letter or digit")
    return Pairs(sorted(items))


def _parse_address(v: Any) -> str:
    """containerd's gRPC address: a Unix socket path (unix:// optional)."""
    s = _parse_str(v)
    path = s[len("unix://"):] if s.startswith("unix://") else s
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute Unix socket path, got {s!r}")
    return path


def _one_of(*choices: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = _parse_str(v)
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {s!r}")
        return s
    parse.kind = "one of " + ", ".join(choices)  # type: ignore[attr-defined]
    return parse


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        x = parse(v)
        if x <= 0:
            raise ValueError(f"expected a value > 0, got {v!r}")
        return x
    check.kind = _kind(parse) + " > 0"  # type: ignore[attr-defined]
    return check


def _dns_label(v: Any) -> str:
    # A Kubernetes RuntimeClass handler must be a DNS-1123 label
    # (k8s.io/api node/v1 RuntimeClass.Handler), and CRI looks the handler up
    # by this name in containerd's runtimes table.
    s = _parse_str(v)
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", s):
        raise ValueError(f"expected a DNS label (lower case letters, digits, '-', at most 63), got {s!r}")
    return s


def _power_of_two(v: Any) -> int:
    x = _parse_int(v)
    if x < 4096 or x & (x - 1):
        raise ValueError(f"must be a power of two >= 4096, got {v!r}")
    return x


# What each parser accepts, for docs/configuration.md.
_parse_bool.kind = "boolean"  # type: ignore[attr-defined]
_parse_int.kind = "integer (k, m, g, t suffixes)"  # type: ignore[attr-defined]
_parse_float.kind = "number"  # type: ignore[attr-defined]
_parse_str.kind = "string"  # type: ignore[attr-defined]
_parse_path.kind = "path"  # type: ignore[attr-defined]
_parse_abs_path.kind = "absolute path"  # type: ignore[attr-defined]
_parse_words.kind = "list of strings"  # type: ignore[attr-defined]
_dns_label.kind = "DNS label"  # type: ignore[attr-defined]
_power_of_two.kind = "integer, a power of two >= 4096"  # type: ignore[attr-defined]
_parse_opt_path.kind = "path or empty"  # type: ignore[attr-defined]
_parse_ipv4.kind = "IPv4 address"  # type: ignore[attr-defined]
_parse_mark.kind = "integer packet mark"  # type: ignore[attr-defined]
_parse_tenant_map.kind = "table of <origin>:<name> = tenant"  # type: ignore[attr-defined]
_parse_address.kind = "Unix socket path"  # type: ignore[attr-defined]


def _kind(parse: Callable[[Any], Any]) -> str:
    return getattr(parse, "kind", "value")


@dataclass(frozen=True)
class Settings:
    # [runsc]
    runsc_path: Path            # the real runsc binary
    runsc_root: Path            # runsc --root: where runsc keeps sandbox state
    runsc_platform: str         # runsc --platform (systrap fits VMs without nested virt)
    runsc_flags: tuple[str, ...]  # extra global flags for every runsc call
    runsc_timeout_s: float      # default deadline of one runsc call
    # [node]
    state_dir: Path             # thaw's own state: sandbox records, netns leases
    log_dir: Path               # runsc debug logs, one directory per sandbox
    machine_type: str           # part of the compatibility tuple
    install_dir: Path           # where `thaw provision` installs binaries (bin/ under it)
    gpu: str                    # auto | yes | no: is this a GPU node?
    # [containerd]
    containerd_config: Path      # containerd's main config file
    containerd_dropin_dir: Path  # where thaw's drop-in goes (imported by the main config)
    runtime_handler: str         # CRI runtime handler name = RuntimeClass handler
    containerd_runsc_root: Path  # runsc --root of sandboxes the shim starts (+ /<namespace>)
    containerd_restart_command: tuple[str, ...]  # run by `provision --restart-containerd`
    containerd_address: str      # containerd's gRPC socket: thawd asks it whose a container is
    containerd_cri_namespace: str  # the containerd namespace of the CRI plugin's containers
    containerd_info: Path        # the thaw-ctrinfo binary (go/cmd/thaw-ctrinfo)
    containerd_info_timeout_s: float  # deadline of one thaw-ctrinfo lookup
    # [tenancy]
    tenant_map: Pairs            # <origin>:<name> -> tenant
    # [network]
    network_subnet: str         # sandbox addresses come from here (one /30 per sandbox)
    network_publish_address: str  # published ports listen here (DNAT); 127.0.0.1 = this node only
    network_probe_mark: int     # SO_MARK of health probes: the only packets a closed gate lets in
    network_egress: bool        # forwarding on the host veth + masquerade of the sandbox address
    # [health]
    health_timeout_s: float     # deadline of a restore's health check
    health_attempt_timeout_s: float  # of one probe attempt
    # [store]
    store_endpoint: str         # S3 endpoint URL; empty = boto3's default resolution
    store_bucket: str
    store_region: str
    store_prefix: str
    store_profile: str          # boto3 profile name; empty = boto3's default chain
    store_credentials_file: Path | None  # boto3 shared credentials file; None = boto3's default
    store_workers: int          # parallel chunk transfers (each holds one chunk in memory)
    store_timeout_s: float      # connect and read timeout of one S3 request
    store_retries: int          # botocore "standard" retry attempts per request
    store_fetcher: Path | None  # the thaw-fetch binary (go/cmd/thaw-fetch); None = fetch in-process
    store_encrypt: bool         # encrypt chunks (and manifests) with the tenant's key
    store_tenant_keys_dir: Path | None  # one key file per tenant, named after the tenant
    store_manifest_key_file: Path | None  # the cluster's manifest integrity key; None = unsigned
    # [pack]
    pack_chunker: Path          # the thaw-chunk binary (go/cmd/thaw-chunk)
    pack_avg_chunk_bytes: int   # FastCDC average chunk size; min = avg/4, max = avg*4
    # [cache]
    cache_dir: Path
    cache_budget_bytes: int
    cache_lock_timeout_s: float  # how long a pull waits for another pull of the same key
    cache_verify: str           # on use: "stat" (sizes and mtimes) or "full" (re-hash every chunk)
    cache_direct_io: bool       # fills write fetched pages with O_DIRECT
    cache_min_free_bytes: int    # provision/doctor fail below this much free space
    # [thawd]
    thawd_socket: Path          # gRPC Unix socket; twin: go/internal/standin DefaultSocket
    thawd_metrics_addr: str     # host:port of the Prometheus endpoint; empty = off
    thawd_prepare_timeout_s: float  # how long create waits for a fetch before answering cold
    thawd_health_timeout_s: float   # deadline of the post-restore health check
    thawd_ready_timeout_s: float    # how long a cold start may take to get ready for auto-checkpoint
    thawd_quarantine_after: int     # consecutive failed restores that quarantine an image
    thawd_auto_checkpoint: bool     # checkpoint opted-in workloads after their first cold start
    thawd_leave_running: bool       # keep serving after the automatic checkpoint (else recycle)
    # [checkpoint]
    checkpoint_compression: str  # runsc --compression
    restore_background: bool     # runsc restore --background

    @property
    def runsc_available(self) -> bool:
        return self.runsc_path.is_file() and os.access(self.runsc_path, os.X_OK)


# key (section.name) -> (field, parser, default factory)
_KEYS: dict[str, tuple[str, Callable[[Any], Any], Callable[[], Any]]] = {
    "runsc.path": ("runsc_path", _parse_path, lambda: _default_build_dir() / "runsc"),
    "runsc.root": ("runsc_root", _parse_path, lambda: Path("/run/thaw/runsc")),
    "runsc.platform": ("runsc_platform", _one_of("systrap", "ptrace", "kvm"), lambda: "systrap"),
    "runsc.flags": ("runsc_flags", _parse_words, lambda: ()),
    "runsc.timeout_s": ("runsc_timeout_s", _positive(_parse_float), lambda: 120.0),
    "node.state_dir": ("state_dir", _parse_abs_path, lambda: Path("/var/lib/thaw")),
    "node.log_dir": ("log_dir", _parse_abs_path, lambda: Path("/var/log/thaw")),
    "node.machine_type": ("machine_type", _parse_str, lambda: "unknown"),
    "node.install_dir": ("install_dir", _parse_abs_path, lambda: Path("/opt/thaw")),
    "node.gpu": ("gpu", _one_of("auto", "yes", "no"), lambda: "auto"),
    "containerd.config": ("containerd_config", _parse_abs_path, lambda: Path("/etc/containerd/config.toml")),
    "containerd.dropin_dir": ("containerd_dropin_dir", _parse_abs_path, lambda: Path("/etc/containerd/conf.d")),
    "containerd.runtime_handler": ("runtime_handler", _dns_label, lambda: "runsc-thaw"),
    "containerd.runsc_root": ("containerd_runsc_root", _parse_abs_path, lambda: Path("/run/containerd/runsc")),
    "containerd.restart_command": ("containerd_restart_command", _parse_words,
                                   lambda: ("systemctl", "restart", "containerd")),
    "containerd.address": ("containerd_address", _parse_address, lambda: "/run/containerd/containerd.sock"),
    "containerd.cri_namespace": ("containerd_cri_namespace", _parse_str, lambda: "k8s.io"),
    "containerd.info": ("containerd_info", _parse_path, lambda: _default_build_dir() / "thaw-ctrinfo"),
    "containerd.info_timeout_s": ("containerd_info_timeout_s", _positive(_parse_float), lambda: 2.0),
    "tenancy.map": ("tenant_map", _parse_tenant_map, lambda: Pairs()),
    "network.subnet": ("network_subnet", _parse_str, lambda: "10.213.0.0/16"),
    "network.publish_address": ("network_publish_address", _parse_ipv4, lambda: "127.0.0.1"),
    "network.probe_mark": ("network_probe_mark", _parse_mark, lambda: 0x7468),
    "network.egress": ("network_egress", _parse_bool, lambda: True),
    "health.timeout_s": ("health_timeout_s", _parse_float, lambda: 30.0),
    "health.attempt_timeout_s": ("health_attempt_timeout_s", _parse_float, lambda: 2.0),
    "store.endpoint": ("store_endpoint", _parse_str, lambda: ""),
    "store.bucket": ("store_bucket", _parse_str, lambda: "thaw"),
    "store.region": ("store_region", _parse_str, lambda: "us-east-1"),
    "store.prefix": ("store_prefix", _parse_str, lambda: ""),
    "store.profile": ("store_profile", _parse_str, lambda: ""),
    "store.credentials_file": ("store_credentials_file", _parse_opt_path, lambda: None),
    "store.workers": ("store_workers", _positive(_parse_int), lambda: 8),
    "store.timeout_s": ("store_timeout_s", _positive(_parse_float), lambda: 30.0),
    "store.retries": ("store_retries", _positive(_parse_int), lambda: 3),
    "store.fetcher": ("store_fetcher", _parse_opt_path, lambda: _default_build_dir() / "thaw-fetch"),
    "store.encrypt": ("store_encrypt", _parse_bool, lambda: False),
    "store.tenant_keys_dir": ("store_tenant_keys_dir", _parse_opt_path, lambda: None),
    "store.manifest_key_file": ("store_manifest_key_file", _parse_opt_path, lambda: None),
    "pack.chunker": ("pack_chunker", _parse_path, lambda: _default_build_dir() / "thaw-chunk"),
    "pack.avg_chunk_bytes": ("pack_avg_chunk_bytes", _power_of_two, lambda: 256 << 10),
    "cache.lock_timeout_s": ("cache_lock_timeout_s", _positive(_parse_float), lambda: 900.0),
    "cache.verify": ("cache_verify", _one_of("stat", "full"), lambda: "stat"),
    "cache.dir": ("cache_dir", _parse_abs_path, lambda: Path("/var/lib/thaw/cache")),
    "cache.budget_bytes": ("cache_budget_bytes", _positive(_parse_int), lambda: 100 << 30),
    "cache.min_free_bytes": ("cache_min_free_bytes", _parse_int, lambda: 10 << 30),
    "cache.direct_io": ("cache_direct_io", _parse_bool, lambda: True),
    "thawd.socket": ("thawd_socket", _parse_abs_path, lambda: Path("/run/thaw/thawd.sock")),
    "thawd.metrics_addr": ("thawd_metrics_addr", _parse_str, lambda: "127.0.0.1:9464"),
    "thawd.prepare_timeout_s": ("thawd_prepare_timeout_s", _parse_float, lambda: 4.0),
    "thawd.health_timeout_s": ("thawd_health_timeout_s", _parse_float, lambda: 30.0),
    "thawd.ready_timeout_s": ("thawd_ready_timeout_s", _parse_float, lambda: 600.0),
    "thawd.quarantine_after": ("thawd_quarantine_after", _parse_int, lambda: 3),
    "thawd.auto_checkpoint": ("thawd_auto_checkpoint", _parse_bool, lambda: True),
    "thawd.leave_running": ("thawd_leave_running", _parse_bool, lambda: True),
    "checkpoint.compression": ("checkpoint_compression", _one_of("none", "flate-best-speed"), lambda: "none"),
    "checkpoint.restore_background": ("restore_background", _parse_bool, lambda: False),
}

# One line per key for docs/configuration.md (`thaw config --markdown`); a
# unit test checks every key has one and that the doc is up to date.
_HELP: dict[str, str] = {
    "runsc.path": "The real runsc binary (thawd and the stand-in run it). "
                  "Default: the build directory; `thaw provision` writes /opt/thaw/bin/runsc.",
    "runsc.root": "runsc --root for sandboxes thaw starts itself (tests, `thaw run`).",
    "runsc.platform": "runsc --platform; systrap fits VMs without nested virtualisation.",
    "runsc.flags": "Extra runsc global flags (`--name` or `--name=value`) on every call, also "
                   "written into runsc.toml's [runsc_config] for containerd's shim.",
    "runsc.timeout_s": "Deadline of one runsc call, seconds.",
    "node.state_dir": "thaw's own state: sandbox records, netns leases.",
    "node.log_dir": "runsc and shim logs (the shim writes <log_dir>/shim/runsc-shim-<id>.log).",
    "node.machine_type": "Machine type in the compatibility tuple (e.g. the cloud instance type).",
    "node.install_dir": "Where `thaw provision` installs runsc, the shim, the stand-in and the CUDA "
                        "helper (<dir>/bin).",
    "node.gpu": "Is this a GPU node? auto: if an NVIDIA GPU is found. yes: missing GPU fails the checks. "
                "no: never enable nvproxy.",
    "containerd.config": "containerd's main config file; provision adds one `imports` line to it only if "
                         "it does not already import the drop-in directory.",
    "containerd.dropin_dir": "Directory of containerd config drop-ins; thaw writes thaw.toml here.",
    "containerd.runtime_handler": "CRI runtime handler name (the RuntimeClass `handler`).",
    "containerd.runsc_root": "runsc root of sandboxes containerd's shim starts (runsc.toml `root`); "
                             "runsc state lives in <root>/<containerd namespace>.",
    "containerd.restart_command": "Command that restarts containerd, run by `thaw provision "
                                  "--restart-containerd` after its config changed.",
    "containerd.address": "containerd's gRPC socket. thawd asks containerd (through thaw-ctrinfo) whose a "
                          "container is and which image digest it runs (docs/security.md).",
    "containerd.cri_namespace": "containerd namespace of the CRI plugin's containers: only there does "
                                "the pod's Kubernetes namespace, from the CRI plugin's own records, name the tenant.",
    "containerd.info": "The thaw-ctrinfo binary that reads containerd's records of a container "
                       "(go/cmd/thaw-ctrinfo). `thaw provision` writes /opt/thaw/bin/thaw-ctrinfo.",
    "containerd.info_timeout_s": "Deadline of one thaw-ctrinfo lookup; a container whose identity is not "
                                 "known in time starts cold.",
    "tenancy.map": "Node-level tenant mapping: `\"<origin>:<name>\" = \"<tenant>\"` with origin k8s (a Kubernetes "
                   "namespace), ctr (a containerd namespace) or user (a local user); unmapped ones are "
                   "`<origin>-<name>` (docs/security.md).",
    "thawd.socket": "thawd's gRPC Unix socket (root-only directory). Twin: the stand-in's THAW_SOCKET default.",
    "thawd.metrics_addr": "host:port of thawd's Prometheus /metrics endpoint; empty: off.",
    "thawd.prepare_timeout_s": "How long create waits for an image fetch before answering cold (the fetch goes on).",
    "thawd.health_timeout_s": "Deadline of the health check after a restore; unhealthy restores start cold.",
    "thawd.ready_timeout_s": "How long a cold-started workload may take to become ready for its automatic checkpoint.",
    "thawd.quarantine_after": "Consecutive failed restores after which an image is quarantined (cold starts only).",
    "thawd.auto_checkpoint": "Checkpoint an opted-in workload automatically after its first cold start.",
    "thawd.leave_running": "Keep the workload serving after the automatic checkpoint (false: recycle it).",
    "network.subnet": "Sandbox addresses come from here (one /30 per sandbox).",
    "network.publish_address": "Node address published sandbox ports are forwarded from (DNAT).",
    "network.probe_mark": "Packet mark of thaw's health probes: they pass a closed ingress gate.",
    "network.egress": "Masquerade sandbox traffic leaving the node.",
    "health.timeout_s": "Deadline of a sandbox health check (all attempts).",
    "health.attempt_timeout_s": "Timeout of one health probe attempt.",
    "store.endpoint": "S3 endpoint URL; empty: boto3's default resolution (AWS). Credentials are not "
                      "thaw keys: boto3 reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or its other sources.",
    "store.bucket": "S3 bucket holding chunks and manifests.",
    "store.region": "S3 region.",
    "store.prefix": "Key prefix inside the bucket.",
    "store.profile": "boto3 profile name; empty: boto3's default credential chain.",
    "store.credentials_file": "boto3 shared credentials file; empty: boto3's default.",
    "store.workers": "Parallel chunk transfers; each holds one chunk in memory (the memory bound).",
    "store.timeout_s": "Connect and read timeout of one S3 request.",
    "store.retries": "botocore 'standard' retry attempts per S3 request.",
    "store.fetcher": "The thaw-fetch binary that runs a pull's ranged GETs, hashing and writes "
                     "(go/cmd/thaw-fetch; ~1.2x the in-process fetch here, docs/store.md); empty: fetch "
                     "in-process with boto3. `thaw provision` writes /opt/thaw/bin/thaw-fetch.",
    "store.encrypt": "Encrypt every chunk and manifest with the tenant's key (AES-256-GCM, convergent within "
                     "a tenant); a tenant without a key file then neither publishes nor restores.",
    "store.tenant_keys_dir": "Directory of tenant keys: one file per tenant, named after the tenant id, "
                             "holding 32 random bytes (raw or 64 hex digits), mode 0400 or 0600.",
    "store.manifest_key_file": "The cluster's manifest key (32 random bytes, raw or hex; every node shares "
                               "it): manifests are published with its HMAC-SHA256 tag and refused without a "
                               "valid one. Empty: manifests are neither signed nor checked.",
    "pack.chunker": "The thaw-chunk binary (FastCDC, SHA-256 + BLAKE3, go/cmd/thaw-chunk). "
                    "`thaw provision` writes /opt/thaw/bin/thaw-chunk.",
    "pack.avg_chunk_bytes": "FastCDC average chunk size (min = avg/4, max = avg*4).",
    "cache.lock_timeout_s": "How long a pull waits for another pull of the same key.",
    "cache.verify": "On use: stat (sizes and mtimes) or full (re-hash every chunk).",
    "cache.dir": "Local checkpoint cache (put it on local NVMe).",
    "cache.budget_bytes": "Cache size budget; least recently used entries are evicted above it. "
                          "doctor warns when the file system has less free space.",
    "cache.direct_io": "Write fetched pages with O_DIRECT (whole pages; the file system's refusal falls "
                       "back to buffered writes): no page-cache copy or reclaim, and the node's cached files "
                       "are not evicted; the first restore then reads the image from disk. With thaw-fetch "
                       "it made a 2 GiB fetch ~1.2x faster than buffered writes here (docs/store.md).",
    "cache.min_free_bytes": "provision and doctor fail when the cache file system has less free space.",
    "checkpoint.compression": "runsc checkpoint --compression.",
    "checkpoint.restore_background": "runsc restore --background (the app runs while pages still load).",
}


def env_name(key: str) -> str:
    """THAW_<SECTION>_<NAME> for a dotted key."""
    return "THAW_" + key.replace(".", "_").upper()


def keys() -> list[tuple[str, str, Any]]:
    """(key, env name, default) of every setting, for docs and `thaw config`."""
    return [(k, env_name(k), default()) for k, (_, _, default) in _KEYS.items()]


def field_name(key: str) -> str:
    """The Settings attribute of a dotted key."""
    return _KEYS[key][0]


def describe(key: str) -> tuple[str, str]:
    """(type, one-line help) of a key, for docs."""
    return _kind(_KEYS[key][1]), _HELP.get(key, "")


def render_value(value: Any) -> str:
    """A setting's value as TOML would spell it (docs, `thaw config`)."""
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


def markdown_table() -> str:
    """docs/configuration.md's key table, generated from _KEYS (`thaw config --markdown`)."""
    rows = ["| key | env | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for key, env, default in keys():
        kind, help_ = describe(key)
        if isinstance(default, Path) and default.is_relative_to(REPO_ROOT):
            shown = f"`<repo>/{default.relative_to(REPO_ROOT)}`"  # the same doc in every checkout
        elif key.endswith("_bytes") and default % (1 << 30) == 0:
            shown = f'`"{default >> 30}g"`'
        else:
            shown = f"`{render_value(default)}`"
        rows.append(f"| `{key}` | `{env}` | {kind} | {shown} | {help_} |")
    return "\n".join(rows) + "\n"


def load(overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None,
         config_file: Path | None = None,
         default_file: Path = DEFAULT_CONFIG_FILE) -> Settings:
    """Build Settings from defaults < TOML file < environment < overrides.

    `overrides` are CLI values by dotted key; None values are ignored. The
    file is `config_file`, else $THAW_CONFIG, else `default_file` when it
    exists (`thaw provision --root DIR` passes DIR/etc/thaw/config.toml).
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}

    path = config_file or (Path(environ["THAW_CONFIG"]) if environ.get("THAW_CONFIG") else None)
    if path is None and default_file.is_file():
        path = default_file
    if path is not None:
        for key, raw in _read_toml(path).items():
            values[key] = _parse(key, raw, f"file {path}")

    for key in _KEYS:
        name = env_name(key)
        if name in environ:
            values[key] = _parse(key, environ[name], f"env {name}")

    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        if key not in _KEYS:
            raise ConfigError(key, "unknown key")
        values[key] = _parse(key, raw, "command line")

    kwargs = {}
    for key, (fieldname, _, default) in _KEYS.items():
        kwargs[fieldname] = values[key] if key in values else default()
    return Settings(**kwargs)


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
            key = f"{section}.{name}"
            if key not in _KEYS:
                raise ConfigError(key, f"unknown key in {path}")
            flat[key] = raw
    return flat


def _parse(key: str, raw: Any, source: str) -> Any:
    if key not in _KEYS:
        raise ConfigError(key, "unknown key")
    try:
        return _KEYS[key][1](raw)
    except ValueError as e:
        raise ConfigError(key, f"{e} (from {source})") from None


def replace(settings: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(settings, **changes)
