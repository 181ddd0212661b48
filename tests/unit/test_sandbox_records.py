"""Sandbox records, mitigations and the network settings (no runsc)."""
import pytest

from control import config as configmod
from control.errors import ConfigError, UnhealthyRestore, exit_code
from control.lifecycle.sandbox import TRANSITIONAL, Mitigations, Record, State


def test_mitigations_on_by_default_and_all_off():
    assert Mitigations() == Mitigations(gate=True, stable_address=True, health_check=True)
    assert Mitigations.off() == Mitigations(gate=False, stable_address=False, health_check=False)


def test_record_round_trip_and_old_records():
    r = Record(id="a", state=State.RESTORING, bundle="/b", net={"x": 1}, probes=["tcp:80"],
               health={"healthy": True}, owner={"pid": 1, "start": 2})
    assert Record.from_dict(r.to_dict()) == r
    old = Record.from_dict({"id": "a", "state": "running", "bundle": "/b"})
    assert old.probes == [] and old.health is None and old.owner is None
    assert State.RUNNING not in TRANSITIONAL and State.RESTORING in TRANSITIONAL


def test_network_settings_parse_and_name_their_key():
    s = configmod.load(environ={"THAW_NETWORK_PROBE_MARK": "0x10", "THAW_NETWORK_PUBLISH_ADDRESS": "10.0.0.5",
                                "THAW_NETWORK_EGRESS": "false", "THAW_THAWD_HEALTH_TIMEOUT_S": "7.5"},
                       config_file=None)
    assert (s.network_probe_mark, s.network_publish_address, s.network_egress, s.thawd_health_timeout_s) == \
        (16, "10.0.0.5", False, 7.5)
    d = configmod.load(environ={}, config_file=None)
    assert (d.network_probe_mark, d.network_publish_address, d.network_egress) == (0x7468, "127.0.0.1", True)
    for key, bad in (("NETWORK_PROBE_MARK", "0"), ("NETWORK_PROBE_MARK", "0x100000000"),
                     ("NETWORK_PUBLISH_ADDRESS", "::1"), ("NETWORK_PUBLISH_ADDRESS", "localhost")):
        with pytest.raises(ConfigError) as e:
            configmod.load(environ={f"THAW_{key}": bad}, config_file=None)
        assert e.value.key == key.lower().replace("_", ".", 1)


def test_unhealthy_restore_error_carries_the_result():
    e = UnhealthyRestore("r1", "/img", {"healthy": False, "probes": []}, "tcp:80: FAILED")
    assert "unhealthy" in str(e) and e.health["healthy"] is False
    assert e.to_dict()["sandbox"] == "r1" and exit_code(e) == 1
