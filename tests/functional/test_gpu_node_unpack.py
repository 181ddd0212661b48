"""bench/gpu/node_unpack.py: the first thing the GPU machine runs of the node
run (bench/gpu/node.sh), on parts as ci/carry-node.sh stages them, one device
call at a time. Real xz, real pip (offline) on a wheel made here."""
from __future__ import annotations

import hashlib
import io
import lzma
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu" / "node_unpack.py"

LIST = """# part kind name
a bin  tool-a
a wheel fake-pkg
b bin  tool-b
b bin  cni-bin/tool-c
"""


def _wheel(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    w = d / "fake_pkg-1.0-py3-none-any.whl"
    files = {"fake_pkg/__init__.py": "ANSWER = 42\n",
             "fake_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: fake-pkg\nVersion: 1.0\n",
             "fake_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    files["fake_pkg-1.0.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + \
        "fake_pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(w, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return w


def _part(root: Path, part: str, bins: dict[str, bytes], wheel: bool = False, bad: str = "") -> None:
    d = root / part
    d.mkdir(parents=True)
    sums = []
    for name, data in bins.items():
        (d / f"{name}.xz").parent.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.xz").write_bytes(lzma.compress(data))
        digest = hashlib.sha256(data if name != bad else b"other").hexdigest()
        sums.append(f"{digest} {name}\n")
    (d / "SHA256SUMS").write_text("".join(sums))
    if wheel:
        _wheel(d / "wheels")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"# generated\n"
        ti = tarfile.TarInfo("./thawd_pb2.py")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    (d / "rpc.tar").write_bytes(buf.getvalue())


def _run(tmp: Path, parts: Path) -> tuple[int, str]:
    (tmp / "list.txt").write_text(LIST)
    p = subprocess.run([sys.executable, str(SCRIPT), "--parts", str(parts), "--bin", str(tmp / "bin"),
                        "--list", str(tmp / "list.txt"), "--rpc", str(tmp / "rpc")],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def test_parts_arrive_one_call_at_a_time(tmp_path):
    call1, call2 = tmp_path / "call1", tmp_path / "call2"
    _part(call1, "a", {"tool-a": b"#!/bin/sh\necho a\n"}, wheel=True)
    rc, out = _run(tmp_path, call1)
    assert rc == 3 and "b: tool-b" in out and "a: tool-a" not in out, out
    assert (tmp_path / "bin" / "tool-a").read_bytes() == b"#!/bin/sh\necho a\n"
    assert (tmp_path / "bin" / "tool-a").stat().st_mode & 0o111
    assert (tmp_path / "rpc" / "thawd_pb2.py").is_file()
    site = tmp_path / "bin" / "site"
    probe = subprocess.run([sys.executable, "-c", "import fake_pkg; print(fake_pkg.ANSWER)"],
                           env={"PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert probe.stdout.strip() == "42", probe.stderr

    # The next call carries only part b; part a's files are still on the machine.
    _part(call2, "b", {"tool-b": b"b-binary", "cni-bin/tool-c": b"c-binary"})   # a binary below a directory
    rc, out = _run(tmp_path, call2)
    assert rc == 0 and '"missing": []' in out, out
    assert (tmp_path / "bin" / "tool-b").read_bytes() == b"b-binary"
    assert (tmp_path / "bin" / "cni-bin" / "tool-c").read_bytes() == b"c-binary"
    rc, out = _run(tmp_path, call2)      # a third call: nothing to do, still complete
    assert rc == 0 and '"unpacked": []' in out, out


def test_a_binary_that_does_not_match_its_sum_is_refused(tmp_path):
    parts = tmp_path / "parts"
    _part(parts, "a", {"tool-a": b"good"}, wheel=True, bad="tool-a")
    rc, out = _run(tmp_path, parts)
    assert rc == 2 and "tool-a: sha256" in out, out
    assert not (tmp_path / "bin" / "tool-a").exists()
