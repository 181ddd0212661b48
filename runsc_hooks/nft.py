"""thaw's nftables table, through pyroute2's netfilter netlink socket.

One table, `ip thaw`, holds every netfilter rule thaw makes; its base chains
are created on first use and kept (they are empty and accept by default when
no sandbox runs). Every rule carries a tag in its comment (nftables rule
userdata) of the form `<kind>:<sandbox name>`, which is how rules are found,
listed and removed by name, after a crash too.

Rules are built from a few expression helpers (meta/payload loads into a
register, cmp, immediate, nat, counter, verdict): the kernel's nftables VM,
without the `nft` binary (no shelling out, ARCHITECTURE.md).
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from control.errors import PreconditionError, ThawError

log = logging.getLogger(__name__)

TABLE = "thaw"
IFNAMSIZ = 16

# name -> (hook, type, priority). Priorities follow nft's names: dstnat -100,
# filter 0, srcnat 100. The gate filters at postrouting so that it sees both
# locally generated and forwarded packets, after DNAT chose the sandbox.
CHAINS: dict[str, tuple[str, str, int]] = {
    "gate": ("postrouting", "filter", 0),
    "dnat-out": ("output", "nat", -100),
    "dnat-pre": ("prerouting", "nat", -100),
    "snat": ("postrouting", "nat", 100),
}

# include/uapi/linux/netfilter/nf_tables.h
_NFT_REG_1, _NFT_REG_2 = 1, 2
_PAYLOAD_NETWORK, _PAYLOAD_TRANSPORT = 1, 2
_META_MARK, _META_OIFNAME, _META_L4PROTO = 3, 7, 16
_CMP_EQ, _CMP_NEQ = 0, 1
_NAT_SNAT, _NAT_DNAT = 0, 1
_NF_DROP = 0
_NFPROTO_IPV4 = 2


@dataclass(frozen=True)
class Rule:
    chain: str
    handle: int
    tag: str
    packets: int = 0   # from the rule's counter, when it has one

    @property
    def kind(self) -> str:
        return self.tag.split(":", 1)[0]

    @property
    def sandbox(self) -> str:
        return self.tag.split(":", 1)[1] if ":" in self.tag else ""


def tag(kind: str, name: str) -> str:
    return f"{kind}:{name}"


# -- expressions -----------------------------------------------------------------

def _expr(name: str, **data: object) -> dict:
    attrs = [(f"NFTA_{name.upper()}_{k.upper()}", v) for k, v in data.items()]
    return {"attrs": [("NFTA_EXPR_NAME", name), ("NFTA_EXPR_DATA", {"attrs": attrs})]}


def _value(b: bytes) -> dict:
    return {"attrs": [("NFTA_DATA_VALUE", b)]}


def _cmp(op: int, b: bytes, reg: int = _NFT_REG_1) -> dict:
    return _expr("cmp", sreg=reg, op=op, data=_value(b))


def match_oifname(ifname: str) -> list[dict]:
    return [_expr("meta", dreg=_NFT_REG_1, key=_META_OIFNAME),
            _cmp(_CMP_EQ, ifname.encode().ljust(IFNAMSIZ, b"\0"))]


def match_mark_not(mark: int) -> list[dict]:
    # meta mark is a host-endian u32 in the register.
    return [_expr("meta", dreg=_NFT_REG_1, key=_META_MARK), _cmp(_CMP_NEQ, struct.pack("=I", mark))]


def match_daddr(addr: str) -> list[dict]:
    return [_expr("payload", dreg=_NFT_REG_1, base=_PAYLOAD_NETWORK, offset=16, len=4),
            _cmp(_CMP_EQ, socket.inet_aton(addr))]


def match_saddr(addr: str) -> list[dict]:
    return [_expr("payload", dreg=_NFT_REG_1, base=_PAYLOAD_NETWORK, offset=12, len=4),
            _cmp(_CMP_EQ, socket.inet_aton(addr))]


def match_saddr_loopback() -> list[dict]:
    """ip saddr 127.0.0.0/8: the first byte of the source address is 127."""
    return [_expr("payload", dreg=_NFT_REG_1, base=_PAYLOAD_NETWORK, offset=12, len=1),
            _cmp(_CMP_EQ, b"\x7f")]


def match_tcp_dport(port: int) -> list[dict]:
    return [_expr("meta", dreg=_NFT_REG_1, key=_META_L4PROTO), _cmp(_CMP_EQ, bytes([socket.IPPROTO_TCP])),
            _expr("payload", dreg=_NFT_REG_1, base=_PAYLOAD_TRANSPORT, offset=2, len=2),
            _cmp(_CMP_EQ, struct.pack(">H", port))]


def counter() -> list[dict]:
    return [_expr("counter")]


def drop() -> list[dict]:
    return [_expr("immediate", dreg=0, data={"attrs": [("NFTA_DATA_VERDICT",
                                                       {"attrs": [("NFTA_VERDICT_CODE", _NF_DROP)]})]})]


def dnat(addr: str, port: int) -> list[dict]:
    return [_expr("immediate", dreg=_NFT_REG_1, data=_value(socket.inet_aton(addr))),
            _expr("immediate", dreg=_NFT_REG_2, data=_value(struct.pack(">H", port))),
            _expr("nat", type=_NAT_DNAT, family=_NFPROTO_IPV4, reg_addr_min=_NFT_REG_1,
                  reg_proto_min=_NFT_REG_2, flags={"NF_NAT_RANGE_MAP_IPS", "NF_NAT_RANGE_PROTO_SPECIFIED"})]


def snat(addr: str) -> list[dict]:
    return [_expr("immediate", dreg=_NFT_REG_1, data=_value(socket.inet_aton(addr))),
            _expr("nat", type=_NAT_SNAT, family=_NFPROTO_IPV4, reg_addr_min=_NFT_REG_1,
                  flags={"NF_NAT_RANGE_MAP_IPS"})]


def masquerade() -> list[dict]:
    return [_expr("masq")]


def not_oifname(ifname: str) -> list[dict]:
    return [_expr("meta", dreg=_NFT_REG_1, key=_META_OIFNAME),
            _cmp(_CMP_NEQ, ifname.encode().ljust(IFNAMSIZ, b"\0"))]


# -- the table ------------------------------------------------------------------------

@contextmanager
def _socket() -> Iterator[object]:
    try:
        from pyroute2.nftables.main import NFTables
    except ImportError as e:  # pragma: no cover - a broken install
        raise PreconditionError(f"pyroute2 nftables is not importable: {e}") from None
    try:
        nft = NFTables(nfgen_family=_NFPROTO_IPV4)
    except OSError as e:
        raise PreconditionError(f"cannot open a netfilter netlink socket (nf_tables in the kernel?): {e}") from None
    try:
        yield nft
    finally:
        nft.close()


def _code(e: BaseException) -> int | None:
    return getattr(e, "code", None)


def ensure_table() -> None:
    """Create table `ip thaw` and its base chains if missing (idempotent)."""
    with _socket() as nft:
        _ensure(nft)


def _ensure(nft) -> None:
    have = {c.get_attr("NFTA_CHAIN_NAME") for c in nft.get_chains() if c.get_attr("NFTA_CHAIN_TABLE") == TABLE}
    if len(have) == len(CHAINS):
        return
    try:
        nft.table("add", name=TABLE)
        for name, (hook, typ, prio) in CHAINS.items():
            if name not in have:
                nft.chain("add", table=TABLE, name=name, hook=hook, type=typ, priority=prio)
    except Exception as e:  # noqa: BLE001 - a NetlinkError names the errno only
        raise ThawError(f"creating nftables table {TABLE} failed: {e} (kernel without nf_tables nat?)") from e


def add_rule(chain: str, rule_tag: str, expressions: list[dict]) -> None:
    """Append a rule tagged `rule_tag` to one of thaw's chains."""
    if chain not in CHAINS:
        raise ValueError(f"unknown chain {chain!r}")
    with _socket() as nft:
        _ensure(nft)
        try:
            nft.rule("add", table=TABLE, chain=chain, expressions=[[e] for e in expressions], userdata=rule_tag)
        except Exception as e:  # noqa: BLE001
            raise ThawError(f"adding nftables rule {rule_tag} to {TABLE}/{chain} failed: {e}",
                            tag=rule_tag) from e
    log.debug("nft add %s/%s %s", TABLE, chain, rule_tag)


def rules(chain: str | None = None) -> list[Rule]:
    """thaw's tagged rules (all chains, or one)."""
    with _socket() as nft:
        return [r for r in _list(nft) if chain is None or r.chain == chain]


def _list(nft) -> list[Rule]:
    out = []
    for r in nft.get_rules():
        if r.get_attr("NFTA_RULE_TABLE") != TABLE:
            continue
        t = r.get_attr("NFTA_RULE_USERDATA")
        packets = 0
        for e in r.get_attr("NFTA_RULE_EXPRESSIONS") or []:
            if e.get_attr("NFTA_EXPR_NAME") == "counter":
                packets = e.get_attr("NFTA_EXPR_DATA").get_attr("NFTA_COUNTER_PACKETS") or 0
        out.append(Rule(r.get_attr("NFTA_RULE_CHAIN"), r.get_attr("NFTA_RULE_HANDLE"),
                        t if isinstance(t, str) else "", packets))
    return out


def delete_rules(rule_tag: str | None = None, kind: str | None = None, sandbox: str | None = None) -> list[Rule]:
    """Delete the rules matching a tag, or a kind and/or sandbox name; gone already is fine."""
    gone = []
    with _socket() as nft:
        for r in _list_matching(nft, rule_tag, kind, sandbox):
            try:
                nft.rule("del", table=TABLE, chain=r.chain, handle=r.handle)
            except Exception as e:  # noqa: BLE001
                if _code(e) != errno.ENOENT:
                    raise ThawError(f"deleting nftables rule {r.tag} failed: {e}", tag=r.tag) from e
            gone.append(r)
    for r in gone:
        log.debug("nft del %s/%s %s", TABLE, r.chain, r.tag)
    return gone


def _list_matching(nft, rule_tag: str | None, kind: str | None, sandbox: str | None) -> list[Rule]:
    return [r for r in _list(nft) if r.tag and (rule_tag is None or r.tag == rule_tag)
            and (kind is None or r.kind == kind) and (sandbox is None or r.sandbox == sandbox)]


def delete_table() -> None:
    """Remove thaw's table with everything in it (tests, `thaw sandbox-gc --orphans` on an empty node)."""
    with _socket() as nft:
        try:
            nft.table("del", name=TABLE)
        except Exception as e:  # noqa: BLE001
            if _code(e) != errno.ENOENT:
                raise ThawError(f"deleting nftables table {TABLE} failed: {e}") from e
