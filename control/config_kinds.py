"""What a setting accepts: the kinds of value of control/config.py's keys (a size
with k/m/g/t suffixes, seconds, a path, a tenant map, ...), each a parser that
raises ValueError naming what is wrong; config.py turns that into a ConfigError
naming the key and where the value came from."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


# -- kinds: what a key accepts ------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """A parser (raises ValueError on a bad value), the type of the Settings
    field it fills, and what it accepts in words (the docs' type column)."""
    name: str
    parse: Callable[[Any], Any]
    type: Any
    numeric: bool = False   # numeric kinds need a range on every key that uses them


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {v!r}")


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    try:
        return int(v.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _size(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"expected a size in bytes, got {v!r}")
    if isinstance(v, int):
        return v
    s = v.strip().replace("_", "")
    try:
        if s and s[-1].lower() in _SIZE_UNITS:
            return int(float(s[:-1]) * _SIZE_UNITS[s[-1].lower()])
        return int(s)
    except ValueError:
        raise ValueError(f"expected a size in bytes (suffixes k, m, g, t allowed), got {v!r}") from None


def _power_of_two(v: Any) -> int:
    x = _size(v)
    if x <= 0 or x & (x - 1):
        raise ValueError(f"expected a power of two, got {v!r}")
    return x


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a number, got {v!r}")
    try:
        f = float(v)
    except ValueError:
        raise ValueError(f"expected a number, got {v!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {v!r}")
    return f


def _str(v: Any) -> str:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise ValueError(f"expected a string, got {v!r}")
    return str(v)


def _path(v: Any) -> Path:
    if isinstance(v, Path):
        v = str(v)
    s = _str(v)
    if not s:
        raise ValueError("expected a path, got an empty string")
    return Path(s)


def _opt_path(v: Any) -> Path | None:
    if v is None:
        return None
    s = _str(str(v) if isinstance(v, Path) else v)
    return Path(s) if s else None


def _abs_path(v: Any) -> Path:
    p = _path(v)
    if not p.is_absolute():
        raise ValueError(f"expected an absolute path, got {str(p)!r}")
    return p


def _words(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(w for w in v.split() if w)
    if isinstance(v, (list, tuple)) and all(isinstance(w, str) for w in v):
        return tuple(v)
    raise ValueError(f"expected a list of strings, got {v!r}")


def _dns_label(v: Any) -> str:
    # A Kubernetes RuntimeClass handler must be a DNS-1123 label
    # (k8s.io/api node/v1 RuntimeClass.Handler), and CRI looks the handler up
    # by this name in containerd's runtimes table.
    s = _str(v)
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", s):
        raise ValueError(f"expected a DNS label (lower case letters, digits, '-', at most 63), got {s!r}")
    return s


def _ipv4(v: Any) -> str:
    s = _str(v)
    try:
        return str(ipaddress.IPv4Address(s.strip()))
    except ValueError:
        raise ValueError(f"expected an IPv4 address, got {s!r}") from None


def _ipv4_slots(v: Any) -> str:
    """An IPv4 network that holds at least one /30: runsc_hooks/network.py
    slot_addresses gives each sandbox one /30 of it."""
    s = _str(v)
    try:
        net = ipaddress.IPv4Network(s.strip())  # strict: host bits set is an error
    except ValueError as e:
        raise ValueError(f"expected an IPv4 network such as 10.213.0.0/16, got {s!r} ({e})") from None
    if net.prefixlen > 30:
        raise ValueError(f"expected an IPv4 network of /30 or larger (one /30 per sandbox), got {s!r}")
    return str(net)


def _mark(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"expected an integer mark, got {v!r}")
    try:
        return v if isinstance(v, int) else int(v.strip(), 0)
    except ValueError:
        raise ValueError(f"expected an integer mark (decimal or 0x hex), got {v!r}") from None


# A tenant id (issue 13): lower-case letters, digits and '-', at most 48
# characters, no '.' (a workload key's first '.'-separated field is its tenant)
# and no '_' or '%' (the node cache matches a tenant's entries with SQL LIKE).
# control/lifecycle/tenant.py derives ids of this form; tenancy.map values must be.
TENANT_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?"
# What a tenancy.map key names: <origin>:<name>, origin k8s (a Kubernetes
# namespace), ctr (a containerd namespace) or user (a local user).
_TENANT_SOURCE = r"(k8s|ctr|user):[A-Za-z0-9][A-Za-z0-9._-]{0,75}"


class Pairs(tuple):
    """A mapping setting, kept as sorted (key, value) pairs so Settings stays hashable."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self).get(name, default)


def _tenant_map(v: Any) -> Pairs:
    """<origin>:<name> -> tenant. TOML: an inline table; env: "k8s:a=t1,ctr:b=t2"."""
    if isinstance(v, Pairs):
        return v
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


def _socket_address(v: Any) -> str:
    """containerd's gRPC address: a Unix socket path (unix:// optional)."""
    s = _str(v)
    path = s[len("unix://"):] if s.startswith("unix://") else s
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute Unix socket path, got {s!r}")
    return path


BOOL = Kind("boolean", _bool, bool)
INT = Kind("integer", _int, int, numeric=True)
SIZE = Kind("size (k, m, g, t suffixes)", _size, int, numeric=True)
POW2_SIZE = Kind("size, a power of two", _power_of_two, int, numeric=True)
SECONDS = Kind("seconds", _float, float, numeric=True)
STR = Kind("string", _str, str)
PATH = Kind("path", _path, Path)
ABS_PATH = Kind("absolute path", _abs_path, Path)
OPT_PATH = Kind("path or empty", _opt_path, Path | None)
WORDS = Kind("list of strings", _words, tuple[str, ...])
DNS_LABEL = Kind("DNS label", _dns_label, str)
IPV4 = Kind("IPv4 address", _ipv4, str)
IPV4_SLOTS = Kind("IPv4 network, /30 or larger", _ipv4_slots, str)
MARK = Kind("packet mark (decimal or 0x hex)", _mark, int, numeric=True)
TENANT_MAP = Kind("table of <origin>:<name> = tenant", _tenant_map, Pairs)
SOCKET = Kind("Unix socket path", _socket_address, str)


def one_of(*choices: str) -> Kind:
    def parse(v: Any) -> str:
        s = _str(v)
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {s!r}")
        return s
    return Kind("one of " + ", ".join(choices), parse, str)
