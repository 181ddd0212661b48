"""thaw's settings: one frozen dataclass, read once.

Precedence, highest first: CLI flag > environment (THAW_<SECTION>_<KEY>) >
TOML file (THAW_CONFIG, else /etc/thaw/config.toml when it exists) > default.
Every key is declared once in `_KEYS`; a bad value raises ConfigError naming
the key and where the value came from. No other module reads os.environ.
"""

from __future__ import annotations

import dataclasses
import os
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
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    s = str(v).strip().replace("_", "")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if s and s[-1].lower() in units:
        return int(float(s[:-1]) * units[s[-1].lower()])
    return int(s)


def _parse_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


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


def _parse_words(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(w for w in v.split() if w)
    if isinstance(v, (list, tuple)) and all(isinstance(w, str) for w in v):
        return tuple(v)
    raise ValueError(f"expected a list of strings, got {v!r}")


def _one_of(*choices: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = _parse_str(v)
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {s!r}")
        return s
    return parse


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        x = parse(v)
        if x <= 0:
            raise ValueError(f"must be positive, got {v!r}")
        return x
    return check


def _power_of_two(v: Any) -> int:
    x = _parse_int(v)
    if x < 4096 or x & (x - 1):
        raise ValueError(f"must be a power of two >= 4096, got {v!r}")
    return x


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
    # [network]
    network_subnet: str         # sandbox addresses come from here (one /30 per sandbox)
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
    # [pack]
    pack_chunker: Path          # the thaw-chunk binary (go/cmd/thaw-chunk)
    pack_avg_chunk_bytes: int   # FastCDC average chunk size; min = avg/4, max = avg*4
    # [cache]
    cache_dir: Path
    cache_budget_bytes: int
    cache_lock_timeout_s: float  # how long a pull waits for another pull of the same key
    cache_verify: str           # on use: "stat" (sizes and mtimes) or "full" (re-hash every chunk)
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
    "runsc.timeout_s": ("runsc_timeout_s", _parse_float, lambda: 120.0),
    "node.state_dir": ("state_dir", _parse_path, lambda: Path("/var/lib/thaw")),
    "node.log_dir": ("log_dir", _parse_path, lambda: Path("/var/log/thaw")),
    "node.machine_type": ("machine_type", _parse_str, lambda: "unknown"),
    "network.subnet": ("network_subnet", _parse_str, lambda: "10.213.0.0/16"),
    "store.endpoint": ("store_endpoint", _parse_str, lambda: ""),
    "store.bucket": ("store_bucket", _parse_str, lambda: "thaw"),
    "store.region": ("store_region", _parse_str, lambda: "us-east-1"),
    "store.prefix": ("store_prefix", _parse_str, lambda: ""),
    "store.profile": ("store_profile", _parse_str, lambda: ""),
    "store.credentials_file": ("store_credentials_file", _parse_opt_path, lambda: None),
    "store.workers": ("store_workers", _positive(_parse_int), lambda: 8),
    "store.timeout_s": ("store_timeout_s", _positive(_parse_float), lambda: 30.0),
    "store.retries": ("store_retries", _positive(_parse_int), lambda: 3),
    "pack.chunker": ("pack_chunker", _parse_path, lambda: _default_build_dir() / "thaw-chunk"),
    "pack.avg_chunk_bytes": ("pack_avg_chunk_bytes", _power_of_two, lambda: 256 << 10),
    "cache.dir": ("cache_dir", _parse_path, lambda: Path("/var/lib/thaw/cache")),
    "cache.budget_bytes": ("cache_budget_bytes", _positive(_parse_int), lambda: 100 << 30),
    "cache.lock_timeout_s": ("cache_lock_timeout_s", _positive(_parse_float), lambda: 900.0),
    "cache.verify": ("cache_verify", _one_of("stat", "full"), lambda: "stat"),
    "checkpoint.compression": ("checkpoint_compression", _one_of("none", "flate-best-speed"), lambda: "none"),
    "checkpoint.restore_background": ("restore_background", _parse_bool, lambda: False),
}


def env_name(key: str) -> str:
    """THAW_<SECTION>_<NAME> for a dotted key."""
    return "THAW_" + key.replace(".", "_").upper()


def keys() -> list[tuple[str, str, Any]]:
    """(key, env name, default) of every setting, for docs and `thaw config`."""
    return [(k, env_name(k), default()) for k, (_, _, default) in _KEYS.items()]


def load(overrides: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None,
         config_file: Path | None = None) -> Settings:
    """Build Settings from defaults < TOML file < environment < overrides.

    `overrides` are CLI values by dotted key; None values are ignored.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}

    path = config_file or (Path(environ["THAW_CONFIG"]) if environ.get("THAW_CONFIG") else None)
    if path is None and DEFAULT_CONFIG_FILE.is_file():
        path = DEFAULT_CONFIG_FILE
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
