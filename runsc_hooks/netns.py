"""A network namespace as thaw handles one: entered on a thread of its own (setns(2)
moves only the calling thread), created, a loopback-only one made or recognised,
and the IPv4 addresses and routes of its interfaces snapshotted before runsc
takes them over and put back after a failed restore. runsc_hooks/network.py
plumbs thaw's own namespaces (thaw-<name>, a veth, NAT) on top of this.

pyroute2 is imported inside the calls that use it, so importing this costs
nothing for a command that never touches a namespace.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from control.errors import PreconditionError

NETNS_DIR = Path("/var/run/netns")
NETNS_PREFIX = "thaw-"     # netns name: thaw-<sandbox name> (runsc_hooks/network.py plumbs those)


def iproute():
    try:
        from pyroute2 import IPRoute
    except ImportError as e:  # pragma: no cover - a broken install
        raise PreconditionError(f"pyroute2 is not importable: {e}") from None
    return IPRoute()


_CLONE_NEWNET = 0x40000000   # <sched.h>


def on_thread(work):
    """work() on a thread of its own, its result or exception handed back to the
    caller: setns(2) and unshare(2) move only the calling thread, and that thread
    ends with the call, so no namespace change leaks into the caller's threads."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="thaw-netns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _ns_call(name: str, *args: int, what: str) -> None:
    """setns(2) or unshare(2) for the calling thread: os.setns / os.unshare where
    Python has them (3.12), else libc's, with errno in the OSError."""
    call = getattr(os, name, None)
    if call is not None:
        call(*args)
        return
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter(netns_path: str, fn):
    """fn(ipr) with an IPRoute inside the network namespace at `netns_path`, run on
    a thread of its own that setns(2) moves there (`on_thread`). pyroute2's NetNS
    forks a child to open each socket instead; in thawd's multi-threaded gRPC
    server that child died of SIGSEGV in 13-17 % of the flood bench's
    PrepareRestore calls ("network of on0004 not recorded: child process is dead,
    status: -11"), and a cold start after a failed restore then had no network
    (docs/network.md)."""
    def work():
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _ns_call("setns", fd, _CLONE_NEWNET, what=f"setns {netns_path}")
        finally:
            os.close(fd)
        with iproute() as ipr:
            return fn(ipr)
    return on_thread(work)


def create(ns: str) -> None:
    """pyroute2's `netns.create` on a thread instead of a forked child (see
    `enter`): the thread unshares a new network namespace and pyroute2 binds
    it, by the thread's id, to /var/run/netns/<ns>; it outlives the thread."""
    from pyroute2 import netns as pnetns

    def work() -> None:
        _ns_call("unshare", _CLONE_NEWNET, what=f"unshare(CLONE_NEWNET) for {ns}")
        pnetns.attach(ns, threading.get_native_id())
    on_thread(work)


def loopback_only(netns_path: str) -> bool:
    """Is the network namespace at `netns_path` one with a loopback interface that
    is up and no other interface (what `ctr run` callers without CNI make so that a
    sandbox has 127.0.0.1: bench/gpu/node.py netns)? Such a namespace gives a
    sandbox nothing but its loopback, so another one like it is the same network
    to the workload (control/thawd/parking.py adopts across them)."""
    if not is_netns(Path(netns_path)):
        return False

    def check(ns) -> bool:
        links = ns.get_links()
        return len(links) == 1 and links[0].get_attr("IFLA_IFNAME") == "lo" and bool(links[0]["flags"] & 1)
    return enter(netns_path, check)


def create_loopback(name: str) -> str:
    """A new named network namespace (/var/run/netns/<name>) with its loopback up and
    nothing else; its path. Not named thaw-<...>: that prefix means a namespace thaw
    plumbed with a veth and a gate (namespace_address)."""
    if name.startswith(NETNS_PREFIX):
        raise ValueError(f"{name}: the {NETNS_PREFIX} prefix is for namespaces thaw plumbs")
    create(name)
    path = str(NETNS_DIR / name)
    enter(path, lambda ns: ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up"))
    return path


def remove(name: str) -> None:
    """Remove the named network namespace (gone already: nothing to do)."""
    from pyroute2 import netns as pnetns
    if (NETNS_DIR / name).exists():
        pnetns.remove(name)


def snapshot(netns_path: str) -> list[dict]:
    """The IPv4 addresses and routes of a network namespace's interfaces, before
    runsc takes them over: runsc removes the addresses from the host side of the
    namespace it runs in (runsc/sandbox/network.go removeLinkAddresses, so the
    host stack does not answer too), and the kernel drops the routes through
    them. A restore that fails leaves the namespace without them, and the cold
    start that follows in the same namespace would have no network:
    `reapply` puts them back first."""
    if not is_netns(Path(netns_path)):   # a spec may name any path: never open a FIFO
        return []
    return enter(netns_path, _snapshot)


def _snapshot(ns) -> list[dict]:
    out = []
    names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ns.get_links()}
    for addr in ns.get_addr(family=2):
        name = names.get(addr["index"], "")
        if name and name != "lo":
            out.append({"kind": "addr", "ifname": name, "address": addr.get_attr("IFA_ADDRESS"),
                        "prefixlen": addr["prefixlen"]})
    for r in ns.get_routes(family=2, table=254):
        oif = names.get(r.get_attr("RTA_OIF"), "")
        if oif and oif != "lo":
            out.append({"kind": "route", "ifname": oif, "dst": r.get_attr("RTA_DST"), "dst_len": r["dst_len"],
                        "gateway": r.get_attr("RTA_GATEWAY"), "scope": r["scope"],
                        "proto": r["proto"]})
    return out


def reapply(netns_path: str, snap: list[dict]) -> None:
    """Put a `snapshot`'s addresses, then its routes, back (what exists is kept)."""
    enter(netns_path, lambda ns: _reapply(ns, snap))


def _reapply(ns, snap: list[dict]) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    idx = {link.get_attr("IFLA_IFNAME"): link["index"] for link in ns.get_links()}
    for kind in ("addr", "route"):
        for e in (x for x in snap if x["kind"] == kind and x["ifname"] in idx):
            try:
                if kind == "addr":
                    ns.addr("add", index=idx[e["ifname"]], address=e["address"], prefixlen=e["prefixlen"])
                elif e["proto"] != 2:   # RTPROT_KERNEL: the kernel adds the prefix route with the address
                    kw = {"dst": f"{e['dst']}/{e['dst_len']}"} if e["dst"] else {"dst": "0.0.0.0/0"}
                    ns.route("add", oif=idx[e["ifname"]], gateway=e["gateway"], scope=e["scope"], **kw)
            except NetlinkError as err:
                if err.code != errno.EEXIST:
                    raise


def is_netns(path: Path) -> bool:
    """Is `path` a namespace file (nsfs)? A spec may name any path; opening a
    FIFO there would block forever. stat never blocks, and every namespace
    file lives on the one nsfs superblock, so its device is that of our own."""
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False
