"""Sandbox network plumbing for runsc --network=sandbox, through pyroute2.

Each sandbox gets a named network namespace and a veth pair: the host end
(`th<hash>`) keeps the host address, the namespace end (`eth0`) carries the
sandbox address that runsc moves into netstack at create/restore
(docs/notes/gvisor-facts.md, "Network on restore"). The sandbox address is chosen
once, at the first run, and reused for every restore of that checkpoint, so
restored listeners and routes stay valid (google/gvisor#13920).

Reachability on the node (docs/network.md):
- the sandbox address itself is routed on the node (a connected /30 per sandbox);
- published ports: `publish_address:node_port` is DNATed to
  `sandbox_ip:sandbox_port` (nftables, thaw's table; `nft.py`). The default
  publish address is 127.0.0.1, which needs `route_localnet` on the host veth
  and an SNAT of loopback sources to the host address;
- egress: forwarding on the host veth and a masquerade of the sandbox address
  (the node's uplink must forward too: node provisioning, not thaw);
- the whole sandbox subnet has an `unreachable` route, so traffic for a
  sandbox address whose sandbox is between incarnations (saved, not yet
  restored) fails at once on the node instead of following the default route.

Everything thaw creates is named from the sandbox name with fixed prefixes
(netns `thaw-<name>`, veth `th<hash>`, nftables rules tagged `<kind>:<name>`),
so leftovers after a crash are found and removed by name (`cleanup_leftovers`).
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from control.errors import PreconditionError, ThawError, UserError
from control.logfields import fields
from runsc_hooks import nft
from runsc_hooks.netns import NETNS_DIR, NETNS_PREFIX, create, enter, iproute, is_netns

log = logging.getLogger(__name__)

HOST_IF_PREFIX = "th"      # host veth: th<10 hex of sha256(name)>, <= 15 chars (IFNAMSIZ-1)
SANDBOX_IF = "eth0"
NAT_KIND = "nat"           # nftables tag kind of DNAT/SNAT/masquerade rules
SYSCTL_CONF = Path("/proc/sys/net/ipv4/conf")


@dataclass(frozen=True)
class Port:
    """A published port: publish_address:node -> sandbox_ip:sandbox (TCP)."""
    node: int
    sandbox: int

    @classmethod
    def parse(cls, text: str) -> "Port":
        """NODE:SANDBOX, or PORT for the same number on both sides."""
        parts = str(text).split(":")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise UserError(f"port {text!r} must be NODE:SANDBOX or PORT (numbers)", port=str(text)) from None
        if len(nums) == 1:
            nums = nums * 2
        if len(nums) != 2 or not all(0 < n < 65536 for n in nums):
            raise UserError(f"port {text!r} must be NODE:SANDBOX or PORT, each 1-65535", port=str(text))
        return cls(nums[0], nums[1])

    def __str__(self) -> str:
        return f"{self.node}:{self.sandbox}"


@dataclass(frozen=True)
class SandboxNet:
    name: str             # sandbox name the plumbing belongs to
    netns: str            # netns name under /var/run/netns
    host_if: str
    host_ip: str
    sandbox_ip: str
    prefixlen: int
    ports: tuple[Port, ...] = ()
    publish_address: str = "127.0.0.1"

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ports"] = [str(p) for p in self.ports]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SandboxNet":
        return cls(**{k: d[k] for k in ("name", "netns", "host_if", "host_ip", "sandbox_ip", "prefixlen")},
                   ports=tuple(Port.parse(p) for p in d.get("ports", ())),
                   publish_address=d.get("publish_address", "127.0.0.1"))


_TCP_LISTEN = "0A"  # include/net/tcp_states.h TCP_LISTEN, as /proc/net/tcp prints it


def _proc_net_addr(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host byte order."""
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    return ipaddress.ip_address(words)


def listeners(port: int, address: str, proc_net: Path = Path("/proc/net")) -> list[str]:
    """Host sockets listening on TCP `port` that traffic for `address`:`port` reaches
    (`address` itself, or a wildcard), as "addr:port" strings, from the node's own
    network namespace. A published port DNATs `address`:`port` to a sandbox before
    any such listener sees it: thaw refuses the port instead of taking it over."""
    want = ipaddress.ip_address(address)
    hits = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 4 or f[3] != _TCP_LISTEN:
                continue
            hexaddr, hexport = f[1].split(":")
            if int(hexport, 16) != port:
                continue
            local = _proc_net_addr(hexaddr)
            if isinstance(local, ipaddress.IPv6Address) and local.ipv4_mapped is not None:
                local = local.ipv4_mapped
            if local == want or local.is_unspecified:
                hits.append(f"{'[' + str(local) + ']' if local.version == 6 else local}:{port}")
    return sorted(set(hits))


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


def namespace_address(netns_path: str | None) -> tuple[str | None, str | None]:
    """(sandbox address the node reaches, gate name) of a container whose network
    namespace is `netns_path` (its OCI spec's), for probes and the gate of the
    containerd door. A namespace thaw plumbed (/var/run/netns/thaw-<name>, e.g. a
    `ctr run --with-ns network:...` container) has both: its address is the other
    end of the host veth's /30. Any other namespace: its first global IPv4 address
    (read before runsc takes the interface over), and no gate, since thaw does not
    know the host side of someone else's plumbing. No namespace: (None, None),
    and probes run inside the sandbox."""
    if not netns_path:
        return None, None
    path = Path(netns_path)
    if path.parent == NETNS_DIR and path.name.startswith(NETNS_PREFIX):
        name = path.name[len(NETNS_PREFIX):]
        with iproute() as ipr:
            idx = ipr.link_lookup(ifname=host_if_name(name))
            for addr in ipr.get_addr(family=2, index=idx[0]) if idx else []:
                host_ip = ipaddress.IPv4Address(addr.get_attr("IFA_ADDRESS"))
                return str(host_ip + 1), name  # slot_addresses: host .1, sandbox .2 of the /30
        return None, name
    if not is_netns(path):
        log.info("network namespace %s of a spec is not a namespace file; probes go inside", netns_path)
        return None, None
    def first_address(ns) -> str | None:
        for addr in ns.get_addr(family=2):
            ip = addr.get_attr("IFA_ADDRESS")
            if ip and not ipaddress.IPv4Address(ip).is_loopback:
                return ip
        return None

    try:
        ip = enter(str(path), first_address)
        if ip:
            return ip, None
    except Exception as e:  # noqa: BLE001 - an unreadable namespace: probes go inside instead
        log.info("no address in network namespace %s: %s", netns_path, e)
    return None, None


def addresses_in_use(exclude_if: str | None = None) -> set[str]:
    """IPv4 addresses on this node's host-side thaw interfaces (but `exclude_if`)."""
    used = set()
    with iproute() as ipr:
        names = {link.get("index"): link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        for addr in ipr.get_addr(family=2):
            n = names.get(addr["index"]) or ""
            if n.startswith(HOST_IF_PREFIX) and n != exclude_if:
                used.add(addr.get_attr("IFA_ADDRESS"))
    return used


def plumb(name: str, host_ip: str, sandbox_ip: str, prefixlen: int = 30, subnet: str | None = None,
          ports: tuple[Port, ...] = (), publish_address: str = "127.0.0.1", egress: bool = True) -> SandboxNet:
    """Create netns `thaw-<name>`, the veth pair, addresses and routes, the
    published ports and egress NAT. Idempotent for the same arguments:
    leftovers of an earlier attempt are removed first (a closed gate of
    `name` is kept: restore closes it before plumbing)."""
    ns = netns_name(name)
    host_if = host_if_name(name)
    _check_ip(publish_address, "network.publish_address")
    unplumb(name, keep_gate=True)
    try:
        if subnet:
            ensure_subnet_route(subnet)
        create(ns)
        # The node routes the sandbox address through the veth from the moment the
        # host end has its address and is up, so that comes last, once both ends pass
        # traffic: a veth end has a no-op qdisc, which drops what it is handed unseen,
        # until the kernel's linkwatch has seen its carrier come on. A packet routed
        # into that gap (a client already sending to the address) lost its ARP request
        # or reply, and the neighbour entry stayed INCOMPLETE until the kernel asked
        # again 1 s later (neigh retrans_time), with every packet for the sandbox, the
        # health probe's SYN too, queued behind it: the containerd door's first probe
        # waited ~0.6 s under the flood bench (docs/network.md, "The first probe after
        # a restore").
        with iproute() as ipr:
            ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": host_if + "p"})
            peer = ipr.link_lookup(ifname=host_if + "p")[0]
            ipr.link("set", index=peer, net_ns_fd=ns)
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.link("set", index=idx, state="up")   # no address yet: no route, no traffic
        def inside(nsr) -> None:
            lo = nsr.link_lookup(ifname="lo")[0]
            nsr.link("set", index=lo, state="up")
            p = nsr.link_lookup(ifname=host_if + "p")[0]
            nsr.link("set", index=p, ifname=SANDBOX_IF)
            nsr.addr("add", index=p, address=sandbox_ip, prefixlen=prefixlen)
            nsr.link("set", index=p, state="up")     # carrier on both ends; this end's qdisc now
            nsr.route("add", dst="0.0.0.0/0", gateway=host_ip)

        enter(str(NETNS_DIR / ns), inside)
        with iproute() as ipr:
            _wait_operstate_up(ipr, idx, host_if)    # the host end's qdisc: when linkwatch ran
            ipr.addr("add", index=idx, address=host_ip, prefixlen=prefixlen)
        net = SandboxNet(name=name, netns=ns, host_if=host_if, host_ip=host_ip, sandbox_ip=sandbox_ip,
                         prefixlen=prefixlen, ports=tuple(ports), publish_address=publish_address)
        _nat(net, egress)
    except BaseException as e:
        unplumb(name, keep_gate=True)
        if isinstance(e, ThawError) or not isinstance(e, Exception):
            raise
        raise ThawError(f"network plumbing for {name!r} failed: {e}", name=name) from e
    log.info("plumbed %s: netns %s, %s(%s) <-> %s(%s)%s", name, ns, host_if, host_ip, SANDBOX_IF, sandbox_ip,
             "".join(f", {publish_address}:{p.node}->{p.sandbox}" for p in ports),
             extra=fields(container=name, netns=str(ns), address=str(sandbox_ip)))
    return net


OPERSTATE_WAIT_S = 1.0   # at most: past it the gap costs what it always did, one ARP retransmit


def _wait_operstate_up(ipr, index: int, ifname: str) -> None:
    """Until link `index` is operationally up: the kernel sets that in the same
    linkwatch step (under RTNL) that gives the device its real qdisc, so from
    then on what the node sends through it goes out."""
    end = time.monotonic() + OPERSTATE_WAIT_S
    while True:
        links = ipr.get_links(index)
        if links and links[0].get_attr("IFLA_OPERSTATE") == "UP":
            return
        if time.monotonic() > end:
            log.warning("%s not operationally up after %.1f s; plumbing on", ifname, OPERSTATE_WAIT_S)
            return
        time.sleep(0.001)


def _nat(net: SandboxNet, egress: bool) -> None:
    """Published ports (DNAT), loopback-source SNAT, egress masquerade: rules tagged nat:<name>."""
    t = nft.tag(NAT_KIND, net.name)
    if net.ports:
        if ipaddress.ip_address(net.publish_address).is_loopback:
            # A DNATed packet from 127.0.0.1 leaves through the veth: the kernel
            # drops such "martians" unless route_localnet is set on that device;
            # the SNAT below then gives it the host address the sandbox can answer.
            _sysctl(net.host_if, "route_localnet", "1")
            nft.add_rule("snat", t, nft.match_oifname(net.host_if) + nft.match_saddr_loopback()
                         + nft.snat(net.host_ip))
        for p in net.ports:
            m = nft.match_daddr(net.publish_address) + nft.match_tcp_dport(p.node)
            nft.add_rule("dnat-out", t, m + nft.dnat(net.sandbox_ip, p.sandbox))
            nft.add_rule("dnat-pre", t, m + nft.dnat(net.sandbox_ip, p.sandbox))
    if egress:
        _sysctl(net.host_if, "forwarding", "1")
        nft.add_rule("snat", t, nft.match_saddr(net.sandbox_ip) + nft.not_oifname(net.host_if) + nft.masquerade())


def _sysctl(ifname: str, key: str, value: str) -> None:
    p = SYSCTL_CONF / ifname / key
    try:
        p.write_text(value)
    except OSError as e:
        raise ThawError(f"setting {p} = {value} failed: {e}") from e


def _check_ip(addr: str, what: str) -> None:
    try:
        if ipaddress.ip_address(addr).version != 4:
            raise ValueError("not IPv4")
    except ValueError:
        raise UserError(f"{what} {addr!r} must be an IPv4 address") from None


def ensure_subnet_route(subnet: str) -> None:
    """`unreachable <subnet>` in the main table (idempotent): a sandbox address
    with no live sandbox fails fast on the node instead of leaving it."""
    with iproute() as ipr:
        try:
            ipr.route("replace", dst=subnet, type="unreachable")
        except Exception as e:  # noqa: BLE001
            raise ThawError(f"adding route unreachable {subnet} failed: {e}") from e


def subnet_route_present(subnet: str) -> bool:
    net = ipaddress.ip_network(subnet)
    with iproute() as ipr:
        for r in ipr.get_routes(family=2, table=254):
            if r["dst_len"] == net.prefixlen and r.get_attr("RTA_DST") == str(net.network_address) \
                    and r["type"] == 7:  # RTN_UNREACHABLE
                return True
    return False


def remove_subnet_route(subnet: str) -> None:
    net = ipaddress.ip_network(subnet)
    with iproute() as ipr:
        try:
            ipr.route("del", dst=subnet, type="unreachable")
        except Exception as e:  # noqa: BLE001
            if getattr(e, "code", None) not in (errno.ESRCH, errno.ENOENT):
                raise
    log.debug("removed route unreachable %s", net)


def unplumb(name: str, keep_gate: bool = False) -> None:
    """Remove the netns, host veth and nftables rules of `name`, whatever of them exists."""
    from pyroute2 import netns as pnetns

    host_if = host_if_name(name)
    nft.delete_rules(kind=NAT_KIND, sandbox=name)
    if not keep_gate:
        nft.delete_rules(kind="gate", sandbox=name)
    with iproute() as ipr:
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
    """thaw's namespaces, host interfaces and nftables rules on this node, by name."""
    ns = sorted(p.name for p in NETNS_DIR.glob(NETNS_PREFIX + "*")) if NETNS_DIR.is_dir() else []
    with iproute() as ipr:
        ifs = sorted(n for n in (link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
                     if n and n.startswith(HOST_IF_PREFIX))
    return {"netns": ns, "interfaces": ifs, "rules": sorted(r.tag for r in nft.rules() if r.tag)}


def sandbox_leftovers(name: str) -> list[str]:
    """What of `name`'s plumbing exists: netns, host veth, routes via it, nftables rules."""
    found = []
    if (NETNS_DIR / netns_name(name)).exists():
        found.append("netns")
    host_if = host_if_name(name)
    with iproute() as ipr:
        idx = ipr.link_lookup(ifname=host_if) + ipr.link_lookup(ifname=host_if + "p")
        if idx:
            found.append("host veth")
            if any(r.get_attr("RTA_OIF") in idx for r in ipr.get_routes(family=2)):
                found.append("route")
    found += [f"nft rule {r.tag}" for r in nft.rules() if r.sandbox == name]
    return found


def cleanup_leftovers(keep: set[str] = frozenset(), prefix: str = "") -> list[str]:
    """Remove thaw namespaces, interfaces and rules whose sandbox name is not in
    `keep` (only names starting with `prefix`, when given)."""
    removed = []
    keep_ifs = {host_if_name(k) for k in keep}
    for ns in leftovers()["netns"]:
        name = ns[len(NETNS_PREFIX):]
        if name not in keep and name.startswith(prefix):
            unplumb(name)
            removed.append(ns)
    for r in nft.rules():
        if r.tag and r.sandbox not in keep and r.sandbox.startswith(prefix):
            nft.delete_rules(rule_tag=r.tag)
            removed.append(f"nft rule {r.tag}")
    if prefix:  # a host veth's name is a hash: only a full sweep can tell whose it is
        return removed
    with iproute() as ipr:
        for link in ipr.get_links():
            n = link.get_attr("IFLA_IFNAME") or ""
            if n.startswith(HOST_IF_PREFIX) and n.removesuffix("p") not in keep_ifs:
                try:
                    ipr.link("del", index=link["index"])
                except Exception as e:  # noqa: BLE001 - its peer took it along already
                    if getattr(e, "code", None) != errno.ENODEV:
                        raise
                removed.append(n)
    return removed


def require_root() -> None:
    if os.geteuid() != 0:
        raise PreconditionError("network plumbing needs root (netns, veth)")
