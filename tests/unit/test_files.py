"""The ground: atomic writes leave either the old or the new file, and process
identity tells a recycled pid from its owner."""
import json
import os

import pytest

from control.files import Owner, process_start, write_bytes_atomic, write_file_atomic, write_json_atomic


def test_atomic_write_replaces_whole_file_and_sets_mode(tmp_path):
    p = tmp_path / "f.json"
    write_json_atomic(p, {"a": 1})
    write_bytes_atomic(p, b"new", mode=0o640, durable_rename=True)
    assert p.read_bytes() == b"new" and (p.stat().st_mode & 0o777) == 0o640
    write_json_atomic(p, {"b": 2})
    assert json.loads(p.read_text()) == {"b": 2}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]


def test_failed_fill_keeps_the_old_file_and_no_temp(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"old")

    def fill(f):
        f.write(b"half")
        raise OSError("disk full")
    with pytest.raises(OSError):
        write_file_atomic(p, fill)
    assert p.read_bytes() == b"old" and sorted(x.name for x in tmp_path.iterdir()) == ["f"]


def test_owner_is_this_process_until_it_is_gone():
    me = Owner.me()
    assert me.pid == os.getpid() and me.alive() and me.start.isdigit()
    assert not Owner(me.pid, str(int(me.start) + 1)).alive()  # a recycled pid is not the owner
    assert Owner.from_dict(me.to_dict()) == me
    assert Owner.from_dict({"pid": me.pid, "start": int(me.start)}) == me  # records from before: int start
    assert Owner.from_dict(None) is None and Owner.from_dict({"pid": "x"}) is None
    assert Owner.from_dict({"pid": True, "start": "1"}) is None
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert process_start(pid) == "" and not Owner(pid, "1").alive() and not Owner(pid, "").alive()


def test_untrusted_names_a_directory_others_can_change(tmp_path):
    """Issue 30: an --out whose parent another user can change is refused (the owner and the
    symbolic-link rules need other users: tests/integration/test_confidentiality.py)."""
    from control.files import untrusted
    os.chmod(tmp_path, 0o755)
    ok = tmp_path / "ok"
    ok.mkdir(mode=0o755)
    assert untrusted(ok) == (ok, None)
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    assert "writable by group" in untrusted(loose / ".")[1] and untrusted(loose)[0] == loose
    os.chmod(loose, 0o757)
    assert "writable by others" in untrusted(loose)[1]
    os.chmod(loose, 0o1777)                          # sticky: entries are their owners'
    assert untrusted(loose)[1] is None
    inner = loose / "x"
    inner.mkdir(mode=0o700)
    assert untrusted(inner)[1] is None
    (tmp_path / "link").symlink_to(ok)               # a link of ours is followed to what it names
    assert untrusted(tmp_path / "link") == (ok, None)
    (tmp_path / "rel").symlink_to("loose/x")
    assert untrusted(tmp_path / "rel") == (inner, None)
    (tmp_path / "file").write_text("")
    assert "not a directory" in untrusted(tmp_path / "file")[1]
    assert "does not exist" in untrusted(tmp_path / "nope" / "deeper")[1]
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert "too many levels" in untrusted(tmp_path / "loop")[1]
    assert untrusted(tmp_path / "ok" / ".." / "ok") == (ok, None)
