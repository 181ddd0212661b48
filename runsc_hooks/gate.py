"""The per-sandbox ingress gate: no packet reaches a sandbox while it is saved,
and none reaches a restored sandbox until its health check has passed.

A closed gate is one nftables rule in thaw's `gate` chain (postrouting, so it
sees locally generated and forwarded packets after DNAT picked the sandbox):

    oifname "th<hash>" meta mark != <probe mark> counter drop   # comment "gate:<name>"

It matches the host end of the sandbox's veth by name, so a gate can be closed
before the interface exists (restore closes it before plumbing) and stays
correct when the veth is re-created. Packets marked with the probe mark (thaw's
own health probes set SO_MARK) pass, so the health check runs through a closed
gate. Dropping on the host side is deliberate: runsc reads the sandbox NIC with
an AF_PACKET socket, and packet taps see a frame before tc or netfilter ingress
hooks in the sandbox's namespace do, so a drop there would be too late.

Why (docs/notes/gvisor-facts.md, "Network on restore"): packets arriving while the
sandbox is saved (google/gvisor#12072: in-flight buffers saved mid-receive),
and connections arriving while the listener is restored (#13554) break
restores. The counter tells how many packets the gate held off.

close/open are idempotent and logged (INFO: name, reason, packets dropped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runsc_hooks import network as netmod
from runsc_hooks import nft
from control.logfields import fields

log = logging.getLogger(__name__)

KIND = "gate"
CHAIN = "gate"


@dataclass(frozen=True)
class GateState:
    name: str
    closed: bool
    dropped_packets: int   # while closed (the rule's counter); 0 when open


def _rules(name: str) -> list[nft.Rule]:
    return [r for r in nft.rules(CHAIN) if r.tag == nft.tag(KIND, name)]


def close(name: str, probe_mark: int, reason: str = "") -> bool:
    """Close the gate of sandbox `name`; True when this call closed it."""
    if _rules(name):
        log.info("gate %s already closed%s", name, f" ({reason})" if reason else "", extra=fields(gate=name, reason=reason or None))
        return False
    exprs = nft.match_oifname(netmod.host_if_name(name)) + nft.match_mark_not(probe_mark) + nft.counter() + nft.drop()
    nft.add_rule(CHAIN, nft.tag(KIND, name), exprs)
    log.info("gate %s closed%s", name, f" ({reason})" if reason else "", extra=fields(gate=name, reason=reason or None))
    return True


def open(name: str, reason: str = "") -> int | None:  # noqa: A001 - the gate's verb
    """Open the gate of sandbox `name`; packets it dropped while closed, None when it was open."""
    gone = nft.delete_rules(rule_tag=nft.tag(KIND, name))
    if not gone:
        log.info("gate %s already open%s", name, f" ({reason})" if reason else "", extra=fields(gate=name, reason=reason or None))
        return None
    # The count is read just before the delete: packets in the last instant may be missed.
    dropped = sum(r.packets for r in gone)
    log.info("gate %s opened%s; it dropped %d packets while closed", name, f" ({reason})" if reason else "", dropped,
             extra=fields(gate=name, reason=reason or None, dropped=dropped))
    return dropped


def is_closed(name: str) -> bool:
    return bool(_rules(name))


def state(name: str) -> GateState:
    rs = _rules(name)
    return GateState(name, bool(rs), sum(r.packets for r in rs))


def closed_gates() -> list[str]:
    return sorted({r.sandbox for r in nft.rules(CHAIN) if r.kind == KIND})
