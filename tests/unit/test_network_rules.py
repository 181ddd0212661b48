"""Network naming, ports, nftables expressions and the gate, with nftables faked."""
import logging
import socket
import struct

import pytest

from control.errors import UserError
from runsc_hooks import gate as gatemod
from runsc_hooks import netns as netnsmod
from runsc_hooks import network as netmod
from runsc_hooks import nft


def _data(expr):
    return dict(expr["attrs"][1][1]["attrs"])


def _value(expr, key):
    return _data(expr)[key]["attrs"][0][1]


@pytest.mark.parametrize("text, port", [("8080", netmod.Port(8080, 8080)), ("18080:8080", netmod.Port(18080, 8080))])
def test_port_parse(text, port):
    assert netmod.Port.parse(text) == port
    assert netmod.Port.parse(str(port)) == port


@pytest.mark.parametrize("text", ["0", "70000", "x:1", "1:2:3", "", "80:"])
def test_port_parse_rejects(text):
    with pytest.raises(UserError, match="port"):
        netmod.Port.parse(text)


def test_sandbox_net_round_trip_and_old_records():
    n = netmod.SandboxNet("s", "thaw-s", "th1", "10.0.0.1", "10.0.0.2", 30, (netmod.Port(1, 2),), "127.0.0.1")
    assert netmod.SandboxNet.from_dict(n.to_dict()) == n
    assert n.to_dict()["ports"] == ["1:2"]
    old = {k: v for k, v in n.to_dict().items() if k not in ("ports", "publish_address")}
    assert netmod.SandboxNet.from_dict(old).ports == ()


def test_slots_are_disjoint_slash30s():
    assert netmod.slot_addresses("10.215.0.0/20", 0) == ("10.215.0.1", "10.215.0.2", 30)
    assert netmod.slot_addresses("10.215.0.0/20", 3) == ("10.215.0.13", "10.215.0.14", 30)
    assert netmod.slot_of("10.215.0.0/20", "10.215.0.14") == 3
    with pytest.raises(UserError):
        netmod.slot_addresses("10.215.0.0/20", 1024)


def test_expressions_encode_what_the_kernel_compares():
    oif = nft.match_oifname("th0123456789")
    assert _data(oif[0])["NFTA_META_KEY"] == 7                       # NFT_META_OIFNAME
    assert _value(oif[1], "NFTA_CMP_DATA") == b"th0123456789".ljust(16, b"\0")  # IFNAMSIZ, NUL padded
    mark = nft.match_mark_not(0x7468)
    assert _data(mark[1])["NFTA_CMP_OP"] == 1                        # NFT_CMP_NEQ
    assert _value(mark[1], "NFTA_CMP_DATA") == struct.pack("=I", 0x7468)  # host endian, like the register
    dport = nft.match_tcp_dport(18080)
    assert _value(dport[1], "NFTA_CMP_DATA") == bytes([socket.IPPROTO_TCP])
    assert _value(dport[3], "NFTA_CMP_DATA") == struct.pack(">H", 18080)   # network order
    d = nft.dnat("10.215.0.2", 8080)
    assert _value(d[0], "NFTA_IMMEDIATE_DATA") == socket.inet_aton("10.215.0.2")
    assert _data(d[2])["NFTA_NAT_TYPE"] == 1                          # NFT_NAT_DNAT
    assert _data(nft.drop()[0])["NFTA_IMMEDIATE_DATA"]["attrs"][0][1]["attrs"] == [("NFTA_VERDICT_CODE", 0)]


def test_rule_tags_name_kind_and_sandbox():
    r = nft.Rule("gate", 4, nft.tag("gate", "t-x-1"))
    assert (r.kind, r.sandbox) == ("gate", "t-x-1")
    assert nft.Rule("snat", 5, "nat:a:b").sandbox == "a:b"


class FakeNft:
    """nft's table in memory: what gate.py adds and deletes."""

    def __init__(self):
        self.table: list[tuple[str, int, str, list]] = []
        self.next = 1

    def add_rule(self, chain, rule_tag, expressions):
        self.table.append((chain, self.next, rule_tag, expressions))
        self.next += 1

    def rules(self, chain=None):
        return [nft.Rule(c, hnd, t, packets=7) for c, hnd, t, _ in self.table if chain in (None, c)]

    def delete_rules(self, rule_tag=None, kind=None, sandbox=None):
        gone = [r for r in self.rules() if r.tag == rule_tag]
        self.table = [x for x in self.table if x[2] != rule_tag]
        return gone


@pytest.fixture
def fake(monkeypatch):
    f = FakeNft()
    for fn in ("add_rule", "rules", "delete_rules"):
        monkeypatch.setattr(nft, fn, getattr(f, fn))
    return f


def test_gate_close_open_are_idempotent_and_logged(fake, caplog):
    caplog.set_level(logging.INFO, logger="runsc_hooks.gate")
    assert gatemod.close("sb1", 0x7468, "checkpoint") is True
    assert gatemod.close("sb1", 0x7468, "checkpoint") is False
    assert len(fake.table) == 1
    chain, _, tag, exprs = fake.table[0]
    assert (chain, tag) == ("gate", "gate:sb1")
    assert _value(exprs[1], "NFTA_CMP_DATA").rstrip(b"\0").decode() == netmod.host_if_name("sb1")
    assert [e["attrs"][0][1] for e in exprs][-2:] == ["counter", "immediate"]  # counted, then dropped
    assert gatemod.is_closed("sb1") and gatemod.closed_gates() == ["sb1"]
    assert gatemod.state("sb1") == gatemod.GateState("sb1", True, 7)
    assert gatemod.open("sb1", "healthy") == 7
    assert gatemod.open("sb1", "healthy") is None
    assert not gatemod.is_closed("sb1") and fake.table == []
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["gate sb1 closed (checkpoint)", "gate sb1 already closed (checkpoint)",
                    "gate sb1 opened (healthy); it dropped 7 packets while closed", "gate sb1 already open (healthy)"]


def test_gates_are_per_sandbox(fake):
    gatemod.close("a", 1)
    gatemod.close("b", 1)
    gatemod.open("a")
    assert gatemod.closed_gates() == ["b"]


def test_listeners_reads_both_families_and_wildcards(tmp_path):
    """A published port DNATs traffic away from a host listener on it: such listeners are found
    in /proc/net/tcp{,6} (LISTEN = 0A; addresses as host-order 32-bit words)."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "tcp").write_text(head
        + "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n"   # 127.0.0.1:8080
        + "   1: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2\n"   # 0.0.0.0:8081
        + "   2: 0100007F:1F92 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3\n")  # established
    (tmp_path / "tcp6").write_text(head
        + "   0: 00000000000000000000000000000000:1F93 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 4\n"  # [::]:8083
        + "   1: 0000000000000000FFFF00000100007F:1F94 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 5\n"  # ::ffff:127.0.0.1
        + "   2: 00000000000000000000000001000000:1F95 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 6\n")  # ::1
    ls = lambda port, addr="127.0.0.1": netmod.listeners(port, addr, proc_net=tmp_path)  # noqa: E731
    assert ls(8080) == ["127.0.0.1:8080"] and ls(8080, "10.0.0.1") == []
    assert ls(8081) == ["0.0.0.0:8081"] and ls(8081, "10.0.0.1") == ["0.0.0.0:8081"]
    assert ls(8082) == []                      # not listening
    assert ls(8083) == ["[::]:8083"]
    assert ls(8084) == ["127.0.0.1:8084"]
    assert ls(8085) == []                      # ::1 alone does not take 127.0.0.1's traffic


def test_listeners_finds_a_real_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert netmod.listeners(port, "127.0.0.1") == [f"127.0.0.1:{port}"]
    assert netmod.listeners(port, "127.0.0.1") == []


def test_a_fifo_is_not_a_network_namespace(tmp_path):
    import os
    os.mkfifo(tmp_path / "ns")
    assert netnsmod.is_netns(tmp_path / "ns") is False
    assert netmod.namespace_address(str(tmp_path / "ns")) == (None, None)   # returns: no open of the FIFO
    assert netnsmod.is_netns("/proc/self/ns/net") is True
