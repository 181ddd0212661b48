"""A local user reads nothing of an image thaw wrote (issue 30): real runsc, the real CLI, SeaweedFS,
and a real non-root user made for the test (useradd, named after it, removed after).

With the default umask (022) `thaw checkpoint --out DIR` wrote DIR 0755 and its files 0644, so any
local user read the workload's secrets out of pages.img; a path through a symbolic link another
user owns in a sticky world-writable directory wrote the image where that user pointed. Now every
directory and file of an image (the --out directory, the node cache's entries, partials, views),
thaw.json (which holds the spec and its environment) and the credentials file thaw writes are
owner-only whatever the umask, and an --out whose parent another user can change is refused."""
from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import THAW, cli_env, leftovers, settings_for, thaw_env

# Run as the test's user: every path given that it can open for reading, one a line.
_PROBE = """
import os, sys
for p in sys.argv[1:]:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        continue
    try:
        os.read(fd, 1)
        print(p)
    except OSError:
        pass
    finally:
        os.close(fd)
"""


@pytest.fixture
def user(name):
    """A real local user named after the test (useradd: at most 32 characters), removed after."""
    uname = ("u" + name.removeprefix("t-"))[:31].rstrip("-")
    subprocess.run(["userdel", uname], capture_output=True)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", uname], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(uname)
    finally:
        subprocess.run(["userdel", uname], check=True, capture_output=True)


def as_user(pw, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], capture_output=True,
                          text=True, timeout=60, cwd="/")


def readable_by(pw, paths: list[Path]) -> list[str]:
    # The node's own python3: thaw's virtualenv lives under a directory that user cannot enter.
    r = as_user(pw, "/usr/bin/python3", "-c", _PROBE, *map(str, paths))
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def thaw022(env: dict, *args: str) -> subprocess.CompletedProcess:
    """The CLI as root under the default umask 022 (what the issue reproduced with)."""
    return subprocess.run([str(THAW), *args], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, umask=0o022)


def tree(*roots: Path) -> list[Path]:
    out = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            out += [Path(d) / x for x in dirs + files]
        out.append(root)
    return out


def test_a_local_user_reads_nothing_of_an_image_the_cache_or_the_credentials(base, name, settings, user):
    env = thaw_env(base) | cli_env(settings)
    secret = f"thaw-secret-{name}"
    r = thaw022(env, "run", "--id", name, "--no-network", "--env", f"SECRET={secret}", "--", "/bin/sleep", "3600")
    assert r.returncode == 0, r.stderr
    os.chmod(base, 0o755)   # the user may walk to the image; only its own modes may stop it
    img = base / "img"
    r = thaw022(env, "checkpoint", name, "--out", str(img))
    assert r.returncode == 0, r.stderr
    assert secret in (img / "thaw.json").read_text()   # the spec keeps the environment: as secret as memory
    r = thaw022(env, "push", str(img), "--key", f"user-root.{name}", "--json")
    assert r.returncode == 0, r.stderr
    r = thaw022(env, "pull", f"user-root.{name}", "--json")
    assert r.returncode == 0, r.stderr
    entry = Path(json.loads(r.stdout)["path"])

    paths = tree(img, settings.cache_dir) + [settings.store_credentials_file]
    assert entry in paths and any(p.name == "pages.img" for p in paths)
    loose = [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in paths
             if p.lstat().st_mode & 0o077 and not p.is_symlink()]
    assert loose == [], "readable or writable by others"
    # Opened for reading as that user, one by one, the parents made walkable: nothing.
    for d in (settings.cache_dir.parent, settings.store_credentials_file.parent):
        os.chmod(d, 0o755)
    assert readable_by(user, [p for p in paths if not p.is_dir()]) == []
    assert leftovers(settings_for(base), [name]) == {}   # the checkpoint stopped and removed the sandbox


def test_an_out_another_user_can_redirect_is_refused(base, name, user):
    env = thaw_env(base)
    r = thaw022(env, "run", "--id", name, "--no-network", "--", "/bin/sleep", "3600")
    assert r.returncode == 0, r.stderr
    os.chmod(base, 0o755)
    sticky = base / "sticky"
    sticky.mkdir(mode=0o1777)
    os.chmod(sticky, 0o1777)
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, user.pw_uid, user.pw_gid)
    r = as_user(user, "ln", "-s", str(theirs), str(sticky / "link"))   # the user's own link in /tmp-like dir
    assert r.returncode == 0, r.stderr

    for out, why in ((sticky / "link" / "img", f"{sticky / 'link'} is a symbolic link owned by uid {user.pw_uid}"),
                     (theirs / "img", f"{theirs} is owned by uid {user.pw_uid}")):
        r = thaw022(env, "checkpoint", name, "--out", str(out))
        assert r.returncode == 2, r.stderr
        [line] = [x for x in r.stderr.splitlines() if x.startswith("thaw: error: ")]
        assert why in line, line
        assert list(theirs.iterdir()) == [], "an image reached the other user's directory"
    group = base / "group-writable"
    group.mkdir()
    os.chmod(group, 0o775)
    r = thaw022(env, "checkpoint", name, "--out", str(group / "img"))
    assert r.returncode == 2 and "writable by group" in r.stderr, r.stderr

    # A sticky directory root owns is fine (entries there are their owners'): the image is root's, 0700.
    r = thaw022(env, "checkpoint", name, "--out", str(sticky / "img"), "--leave-running")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((sticky / "img").stat().st_mode) == 0o700
    assert readable_by(user, [p for p in tree(sticky / "img") if p.is_file()]) == []
    assert thaw022(env, "delete", name, "--force").returncode == 0
