"""The keys thaw writes exist in the pinned sources that read them (Go module
cache): gVisor's shim Options and containerd's CRI Runtime / server Config."""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from control import config
from control.node import containerd_config as cc
from tests.conftest import REPO, require

GVISOR = "gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237"
CONTAINERD = "github.com/containerd/containerd/v2@v2.4.2"


@pytest.fixture(scope="module")
def modcache() -> Path:
    go = shutil.which("go")
    require(go is not None, "go on PATH")
    out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, cwd=REPO / "go").stdout.strip()
    for m in (GVISOR, CONTAINERD):
        require((Path(out) / m).is_dir(), f"{m} in the Go module cache (make setup)")
    # The pins in go/go.mod are the ones checked here.
    gomod = (REPO / "go/go.mod").read_text()
    assert "gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237" in gomod
    assert "github.com/containerd/containerd/v2 v2.4.2" in gomod
    return Path(out)


def toml_tags(source: Path, struct: str) -> set[str]:
    text = source.read_text()
    body = re.search(r"type %s struct \{(.*?)\n\}" % struct, text, re.S)
    assert body, f"{struct} not in {source}"
    return set(re.findall(r'toml:"([^",]+)', body.group(1)))


def test_runsc_toml_keys_are_read_by_the_shim(modcache, tmp_path):
    options = modcache / GVISOR / "pkg/shim/v1/runsc/options.go"
    tags = toml_tags(options, "Options")
    s = config.load(environ={}, default_file=tmp_path / "absent")
    data = tomllib.loads(cc.runsc_toml(s, Path("/x"), gpu=True, log_level="debug"))
    assert set(data) <= tags, set(data) - tags
    assert f'optionsType = "{cc.OPTIONS_TYPE_URL}"' in options.read_text()


def test_runsc_config_flags_are_runsc_flags(modcache, tmp_path):
    flags = (modcache / GVISOR / "runsc/config/flags.go").read_text()
    s = config.load(environ={}, default_file=tmp_path / "absent")
    for name in cc.runsc_config_flags(s, gpu=True):
        assert f'"{name}"' in flags, name


def test_dropin_keys_are_read_by_containerd(modcache):
    cri = modcache / CONTAINERD / "internal/cri/config/config.go"
    runtime_tags = toml_tags(cri, "Runtime")
    data = tomllib.loads(cc.containerd_dropin("runsc-thaw", Path("/s"), Path("/c")))
    rt = cc.runtimes_in(data)["runsc-thaw"]
    assert set(rt) <= runtime_tags, set(rt) - runtime_tags
    # options decode into runtimeoptions.Options {TypeUrl, ConfigPath} (api types/runtimeoptions/v1).
    assert set(rt["options"]) == {"TypeUrl", "ConfigPath"}
    plugin = (modcache / CONTAINERD / "plugins/cri/runtime/plugin.go").read_text()
    assert 'Type:   plugins.CRIServicePlugin,\n\t\tID:     "runtime"' in plugin
    types_go = (modcache / CONTAINERD / "plugins/types.go").read_text()
    assert 'CRIServicePlugin plugin.Type = "io.containerd.cri.v1"' in types_go


def test_private_config_keys_are_read_by_containerd(modcache):
    server = modcache / CONTAINERD / "cmd/containerd/server/config/config.go"
    top = toml_tags(server, "Config")
    data = tomllib.loads(cc.private_containerd_config(Path("/r"), Path("/s"), Path("/c.sock"),
                                                      disabled_plugins=["x.y"]))
    assert set(data) <= top, set(data) - top
    assert "address" in toml_tags(server, "GRPCConfig") and "address" in toml_tags(server, "TTRPCConfig")
    assert 'DefaultConfigIncludePattern = "/etc/containerd/conf.d/*.toml"' in \
        (modcache / CONTAINERD / "defaults/defaults_unix.go").read_text()


def test_private_config_starts_a_real_containerd_config(build, node_root):
    """`containerd config dump` accepts the private config and keeps its sockets."""
    cfg = node_root / "containerd.toml"
    cfg.write_text(cc.private_containerd_config(node_root / "root", node_root / "state", node_root / "c.sock",
                                                handler="runsc-thaw", shim_path=build / "containerd-shim-runsc-v1",
                                                runsc_toml_path=node_root / "runsc.toml"))
    p = subprocess.run([str(build / "containerd"), "--config", str(cfg), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    d = tomllib.loads(p.stdout)
    assert d["root"] == str(node_root / "root") and d["state"] == str(node_root / "state")
    assert d["plugins"]["io.containerd.server.v1.grpc"]["address"] == str(node_root / "c.sock")
    assert d["plugins"]["io.containerd.server.v1.ttrpc"]["address"] == str(node_root / "c.sock.ttrpc")
    assert "runsc-thaw" in d["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]


def test_private_containerd_starts_and_serves(build, node_root):
    """A containerd started from private_containerd_config answers on its own
    socket with the CRI runtime plugin loaded (what other tests build on)."""
    import time
    sock = node_root / "c.sock"
    (node_root / "runsc.toml").write_text(cc.runsc_toml(config.load(environ={}, default_file=node_root / "x"),
                                                        build / "runsc", root=node_root / "runsc"))
    cfg = node_root / "containerd.toml"
    cfg.write_text(cc.private_containerd_config(node_root / "root", node_root / "state", sock,
                                                handler="runsc-thaw", shim_path=build / "containerd-shim-runsc-v1",
                                                runsc_toml_path=node_root / "runsc.toml"))
    log = open(node_root / "containerd.log", "wb")
    proc = subprocess.Popen([str(build / "containerd"), "--config", str(cfg)], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.exists(), (node_root / "containerd.log").read_text()[-3000:]
        ctr = [str(build / "ctr"), "--address", str(sock)]
        v = subprocess.run([*ctr, "version"], capture_output=True, text=True, timeout=30)
        assert v.returncode == 0 and "2.4.2" in v.stdout, v.stderr
        plugins = subprocess.run([*ctr, "plugins", "ls"], capture_output=True, text=True, timeout=30).stdout
        assert any(line.split()[:2] == ["io.containerd.cri.v1", "runtime"] and line.split()[-1] == "ok"
                   for line in plugins.splitlines()), plugins
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
