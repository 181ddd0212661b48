"""Sandbox network plumbing for runsc --network=sandbox, through pyroute2.

Each sandbox gets a named network namespace and a veth pair: the host end
(`th<hash>`) keeps the host address, the namespace end (`eth0`) carries the
sandbox address that runsc moves into netstack at create/restore
(docs/gvisor-facts.md, "Network on restore"). The sandbox address is chosen
once, at the first run, and reused for every restore of that checkpoint, so
restored listeners and routes stay valid (google/gvisor#13920).

Everything thaw creates is named from the sandbox name with fixed prefixes,
so leftovers after a crash are found and removed by name (`cleanup_leftovers`).
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from control.errors import PreconditionError, ThawError, UserError

log = logging.getLogger(__name__)

NETNS_DIR = Path("/var/run/netns")
NETNS_PREFIX = "thaw-"     # netns name: thaw-<sandbox name>
HOST_IF_PREFIX = "th"      # host veth: th<10 hex of sha256(name)>, <= 15 chars (IFNAMSIZ-1)
SANDBOX_IF = "eth0"


@dataclass(frozen=True)
class SandboxNet:
    name: str             # sandbox name the plumbing belongs to
    netns: str            # netns name under /var/run/netns
    host_if: str
    host_ip: str
    sandbox_ip: str
    prefixlen: int

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SandboxNet":
        return cls(**{k: d[k] for k in ("name", "netns", "host_if", "host_ip", "sandbox_ip", "prefixlen")})


def host_if_name(name: str) -> str:
    return HOST_IF_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:10]


def netns_name(name: str) -> str:
    if not name or len(name) > 200 or "/" in name or name in (".", ".."):
        raise UserError(f"sandbox name {name!r} cannot name a network namespace", name=name)
    return NETNS_PREFIX + name


def slot_addresses(subnet: str, slot: int) -> tuple[str, str, int]:
    """(host ip, sandbox ip, prefixlen) of /30 number `slot` in `subnet`."""
    net = ipaddress.ip_network(subnet)
    if net.version != 4 or net.prefixlen > 30:
        raise UserError(f"network.subnet {subnet} must be an IPv4 network of /30 or larger", subnet=subnet)
    n_slots = 1 << (30 - net.prefixlen)
    if not 0 <= slot < n_slots:
        raise UserError(f"slot {slot} outside {subnet} ({n_slots} slots)")
    base = int(net.network_address) + slot * 4
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2)), 30


def slot_of(subnet: str, sandbox_ip: str) -> int:
    net = ipaddress.ip_network(subnet)
    ip = ipaddress.ip_address(sandbox_ip)
    if ip not in net:
        raise UserError(f"sandbox address {sandbox_ip} is outside network.subnet {subnet}")
    return (int(ip) - int(net.network_address)) // 4


def _ipr():
    try:
        from pyroute2 import IPRoute
    except ImportError as e:  # pragma: no cover - a broken install
        raise PreconditionError(f"pyroute2 is not importable: {e}") from None
    return IPRoute()


def addresses_in_use() -> set[str]:
    """IPv4 addresses on this node's host-side thaw interfaces."""
    used = set()
    with _ipr() as ipr:
        names = {link.get("index"): link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for addr in ipr.get_addr(family=2):
            if (names.get(addr["index"]) or "").startswith(HOST_IF_PREFIX):
                used.add(addr.get_attr("IFA_ADDRESS"))
    return used


def plumb(name: str, host_ip: str, sandbox_ip: str, prefixlen: int = 30) -> SandboxNet:
    """Create netns `thaw-<name>`, the veth pair, addresses and routes. Idempotent
    for the same arguments: leftovers of an earlier attempt are removed first."""
    from pyroute2 import NetNS, netns as pnetns

    ns = netns_name(name)
    host_if = host_if_name(name)
    unplumb(name)
    try:
        pnetns.create(ns)
        with _ipr() as ipr:
            ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": host_if + "p"})
            peer = ipr.link_lookup(ifname=host_if + "p")[0]
            ipr.link("set", index=peer, net_ns_fd=ns)
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.addr("add", index=idx, address=host_ip, prefixlen=prefixlen)
            ipr.link("set", index=idx, state="up")
        with NetNS(ns) as nsr:
            lo = nsr.link_lookup(ifname="lo")[0]
            nsr.link("set", index=lo, state="up")
            p = nsr.link_lookup(ifname=host_if + "p")[0]
            nsr.link("set", index=p, ifname=SANDBOX_IF)
            nsr.addr("add", index=p, address=sandbox_ip, prefixlen=prefixlen)
            nsr.link("set", index=p, state="up")
            nsr.route("add", dst="0.0.0.0/0", gateway=host_ip)
    except Exception as e:
        unplumb(name)
        if isinstance(e, ThawError):
            raise
        raise ThawError(f"network plumbing for {name!r} failed: {e}", name=name) from e
    net = SandboxNet(name=name, netns=ns, host_if=host_if, host_ip=host_ip, sandbox_ip=sandbox_ip,
                     prefixlen=prefixlen)
    log.info("plumbed %s: netns %s, %s(%s) <-> %s(%s)", name, ns, host_if, host_ip, SANDBOX_IF, sandbox_ip)
    return net


def unplumb(name: str) -> None:
    """Remove the netns and host veth of `name`, whatever of them exists."""
    from pyroute2 import netns as pnetns

    host_if = host_if_name(name)
    with _ipr() as ipr:
        for ifname in (host_if, host_if + "p"):
            for idx in ipr.link_lookup(ifname=ifname):
                try:
                    ipr.link("del", index=idx)
                except Exception as e:  # noqa: BLE001 - gone already is fine
                    if getattr(e, "code", None) not in (errno.ENODEV, None):
                        raise
    ns = netns_name(name)
    if (NETNS_DIR / ns).exists():
        try:
            pnetns.remove(ns)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
    log.debug("unplumbed %s", name)


def leftovers() -> dict[str, list[str]]:
    """thaw's namespaces and host interfaces present on this node, by name."""
    ns = sorted(p.name for p in NETNS_DIR.glob(NETNS_PREFIX + "*")) if NETNS_DIR.is_dir() else []
    with _ipr() as ipr:
        ifs = sorted(n for n in (link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
                     if n and n.startswith(HOST_IF_PREFIX))
    return {"netns": ns, "interfaces": ifs}


def cleanup_leftovers(keep: set[str] = frozenset()) -> list[str]:
    """Remove thaw namespaces/interfaces whose sandbox name is not in `keep`."""
    removed = []
    keep_ifs = {host_if_name(k) for k in keep}
    for ns in leftovers()["netns"]:
        name = ns[len(NETNS_PREFIX):]
        if name not in keep:
            unplumb(name)
            removed.append(ns)
    with _ipr() as ipr:
        for link in ipr.get_links():
            n = link.get_attr("IFLA_IFNAME") or ""
            if n.startswith(HOST_IF_PREFIX) and n.removesuffix("p") not in keep_ifs:
                ipr.link("del", index=link["index"])
                removed.append(n)
    return removed


def require_root() -> None:
    if os.geteuid() != 0:
        raise PreconditionError("network plumbing needs root (netns, veth)")
