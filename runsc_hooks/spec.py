"""OCI bundles: load, validate and write runtime specs; build specs for thaw's
rootfs layouts.

Validation happens at the edge: a bad spec raises SpecError naming the dotted
field (e.g. `process.args`), never a KeyError deep inside thaw. Only the parts
runsc and thaw depend on are checked; unknown fields pass through untouched.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from control.errors import SpecError
from control.files import write_json_atomic

OCI_VERSION = "1.0.2"
# The largest config.json thaw reads, bytes. A container's spec is a few KiB;
# Kubernetes caps a pod's annotations at 256 KiB (apimachinery
# TotalAnnotationSizeLimitB) and CDI adds some mounts: 4 MiB is far above any
# real spec and still cheap to parse. A larger one is refused, not read.
MAX_CONFIG_BYTES = 4 << 20
_NAMESPACES = {"pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time"}

# Capabilities a default container keeps (runc's / containerd's default set).
DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]


def validate(spec: Any, path: str | None = None) -> dict:
    """Check the fields runsc and thaw rely on; return the spec."""
    def need(cond: bool, fld: str, problem: str) -> None:
        if not cond:
            raise SpecError(fld, problem, path)

    need(isinstance(spec, dict), "(root)", "expected a JSON object")
    need(isinstance(spec.get("ociVersion"), str) and spec["ociVersion"] != "", "ociVersion",
         "missing or not a string")
    proc = spec.get("process")
    need(isinstance(proc, dict), "process", "missing or not an object")
    args = proc.get("args")
    need(isinstance(args, list) and len(args) > 0 and all(isinstance(a, str) for a in args),
         "process.args", "must be a non-empty list of strings")
    need(args[0] != "", "process.args[0]", "must not be empty")
    cwd = proc.get("cwd", "/")
    need(isinstance(cwd, str) and cwd.startswith("/"), "process.cwd", "must be an absolute path")
    env = proc.get("env", [])
    need(isinstance(env, list) and all(isinstance(e, str) and "=" in e for e in env), "process.env",
         "must be a list of KEY=VALUE strings")
    user = proc.get("user", {})
    need(isinstance(user, dict), "process.user", "must be an object")
    for k in ("uid", "gid"):
        if k in user:
            need(isinstance(user[k], int) and user[k] >= 0, f"process.user.{k}", "must be a non-negative integer")
    root = spec.get("root")
    need(isinstance(root, dict) and isinstance(root.get("path"), str) and root["path"] != "", "root.path",
         "missing or empty")
    mounts = spec.get("mounts", [])
    need(isinstance(mounts, list), "mounts", "must be a list")
    for i, m in enumerate(mounts):
        need(isinstance(m, dict), f"mounts[{i}]", "must be an object")
        dest = m.get("destination")
        need(isinstance(dest, str) and dest.startswith("/"), f"mounts[{i}].destination", "must be an absolute path")
        need(".." not in Path(dest).parts, f"mounts[{i}].destination", "must not contain '..'")
        opts = m.get("options", [])
        need(isinstance(opts, list) and all(isinstance(o, str) for o in opts), f"mounts[{i}].options",
             "must be a list of strings")
    linux = spec.get("linux", {})
    need(isinstance(linux, dict), "linux", "must be an object")
    for i, ns in enumerate(linux.get("namespaces", []) or []):
        need(isinstance(ns, dict) and ns.get("type") in _NAMESPACES, f"linux.namespaces[{i}].type",
             f"must be one of {sorted(_NAMESPACES)}")
        if "path" in ns:
            need(isinstance(ns["path"], str) and ns["path"].startswith("/"), f"linux.namespaces[{i}].path",
                 "must be an absolute path")
    for i, d in enumerate(linux.get("devices", []) or []):
        need(isinstance(d, dict) and isinstance(d.get("path"), str) and d["path"].startswith("/dev/"),
             f"linux.devices[{i}].path", "must be a path under /dev/")
        need(d.get("type") in ("c", "b", "u", "p"), f"linux.devices[{i}].type", "must be c, b, u or p")
    ann = spec.get("annotations", {})
    need(isinstance(ann, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()),
         "annotations", "must map strings to strings")
    return spec


@dataclass
class Bundle:
    """An OCI bundle directory: config.json plus (usually) a rootfs."""
    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def load(self) -> dict:
        """config.json, validated. Only a regular file of at most MAX_CONFIG_BYTES
        is read: a FIFO there would block the reader forever (issue 14: twenty
        such PrepareRestore calls wedged thawd), a device or a huge file would
        never end; each is a SpecError at once."""
        text = read_regular(self.config_path, MAX_CONFIG_BYTES, "(file)")
        try:
            spec = json.loads(text)
        except ValueError as e:
            raise SpecError("(file)", f"not valid JSON: {e}", str(self.config_path)) from None
        return validate(spec, str(self.config_path))

    def write(self, spec: dict) -> None:
        """Validate, then atomically replace config.json."""
        validate(spec, str(self.config_path))
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.config_path, spec)

    def rootfs(self, spec: dict) -> Path:
        p = Path(spec["root"]["path"])
        return p if p.is_absolute() else self.path / p


def read_regular(path: Path, max_bytes: int, field: str = "(file)") -> bytes:
    """The bytes of `path` if it is a regular file of at most `max_bytes`; else
    SpecError naming `field`. O_NONBLOCK makes the open of a FIFO return at
    once (it is then refused by its type): nothing but a regular file is read,
    and never more than `max_bytes` of it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise SpecError(field, f"{Path(path).name} does not exist", str(path)) from None
    except OSError as e:
        raise SpecError(field, f"cannot open {Path(path).name}: {e.strerror}", str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                    stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}.get(stat.S_IFMT(st.st_mode), "not a file")
            raise SpecError(field, f"{Path(path).name} is {kind}, not a regular file", str(path))
        if st.st_size > max_bytes:
            raise SpecError(field, f"{Path(path).name} is {st.st_size} bytes, more than the {max_bytes} thaw reads",
                            str(path))
        os.set_blocking(fd, True)
        chunks, n = [], 0
        while n <= max_bytes:
            b = os.read(fd, min(1 << 20, max_bytes + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > max_bytes:  # it grew while being read
            raise SpecError(field, f"{Path(path).name} is more than the {max_bytes} bytes thaw reads", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


# The end of a command sandbox's PATH (sandbox_path), unless its env sets one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A command sandbox's HOME: a private tmpfs (the root filesystem is read-only;
# a workload that writes ~/.cache at import died there, issue 31).
HOME = "/root"

# Host directories the "host" rootfs layout binds read-only: enough for the
# node's own interpreters and libraries to run inside the sandbox.
HOST_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt")


def sandbox_path(caller_path: str, binds: tuple[str, ...] | list[str] = ()) -> str:
    """A command sandbox's PATH: the directories of the caller's PATH (`thaw
    run`'s own) that the sandbox sees (below a host system directory of the host
    layout, or a --bind), in their order, then DEFAULT_PATH's others. So a
    command found by the node's shell is found by the sandbox's, as long as the
    sandbox can see it: a PATH entry outside those (a home directory's virtualenv)
    needs a --bind, or the command's absolute path."""
    seen: list[str] = []
    visible = [d for d in HOST_SYSTEM_DIRS if os.path.isdir(d)] + [b for b in binds if os.path.isdir(b)]
    for d in caller_path.split(":"):
        d = d.rstrip("/") or "/"
        if d.startswith("/") and d not in seen and os.path.isdir(d) and \
                any(d == v or d.startswith(v.rstrip("/") + "/") for v in visible):
            seen.append(d)
    seen += [d for d in DEFAULT_PATH.split(":") if d not in seen]
    return ":".join(seen)


def bind_mount(source: str, destination: str | None = None, readonly: bool = True) -> dict:
    return {"destination": destination or source, "type": "bind", "source": source,
            "options": ["rbind", "ro" if readonly else "rw"]}


def host_layout(extra_paths: list[str] | tuple[str, ...] = ()) -> list[dict]:
    """Read-only bind mounts of the host's system directories plus `extra_paths`.

    Used with an empty rootfs directory. Sharing the host's "/" itself as the
    rootfs does not work: the gofer serves the root from a bind of "/" taken
    before it mounts the spec's bind mounts, so a bind mount below it shows the
    empty mount point (seen at the pin; docs/gvisor-notes.md), and runsc would
    create mount points in the host's real root.
    """
    mounts = [bind_mount(d) for d in HOST_SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    # Sandbox-side duplicates of usr-merged links (/lib -> usr/lib, ...) are
    # made by prepare_host_rootfs; a bind of a link would follow it.
    covered = [m["destination"] for m in mounts]
    for p in extra_paths:
        # A path reached through symlinks needs every hop visible: bind the
        # directory of each link on the chain and the final target.
        for q in _symlink_chain(p):
            if not any(q == c or q.startswith(c.rstrip("/") + "/") for c in covered):
                mounts.append(bind_mount(q))
                covered.append(q)
    return mounts


def _symlink_chain(path: str) -> list[str]:
    """Directories holding each symlink hop of `path`, then its real path."""
    out: list[str] = []
    p = os.path.abspath(path)
    for _ in range(40):  # ELOOP bound, like the kernel's
        parent = os.path.realpath(os.path.dirname(p))
        p = os.path.join(parent, os.path.basename(p))
        if not os.path.islink(p):
            break
        out.append(parent)
        p = os.path.join(parent, os.readlink(p))
    out.append(os.path.realpath(p))
    return out


def prepare_host_rootfs(rootfs: Path) -> Path:
    """Create an empty rootfs directory for the host layout.

    Top-level host directories that are symlinks (usr-merged /lib, /lib64,
    /bin, /sbin) become the same symlinks here, so the ELF interpreter and
    #! paths resolve inside the sandbox.
    """
    rootfs.mkdir(parents=True, exist_ok=True)
    for d in HOST_SYSTEM_DIRS:
        if os.path.islink(d):
            link = rootfs / d.lstrip("/")
            target = os.readlink(d)
            if not link.is_symlink():
                link.symlink_to(target)
            elif os.readlink(link) != target:
                raise SpecError("root.path", f"{link} points to {os.readlink(link)}, host {d} to {target}")
    return rootfs


def command_spec(args: list[str], *, rootfs: str, readonly_root: bool = True,
                 env: dict[str, str] | None = None, cwd: str = "/", hostname: str = "thaw",
                 netns: str | None = None, annotations: dict[str, str] | None = None,
                 extra_mounts: list[dict] | None = None) -> dict:
    """A spec that runs `args` as root in a sandbox whose root is `rootfs`.

    With the "host" layout the caller passes an empty directory as `rootfs`
    and `host_layout()` in `extra_mounts`. /tmp, /dev/shm and HOME (/root) are
    private tmpfs.
    """
    base_env = {"PATH": DEFAULT_PATH, "HOME": HOME}
    base_env.update(env or {})
    namespaces: list[dict] = [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]
    if netns:
        namespaces.append({"type": "network", "path": netns})
    spec = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            "env": [f"{k}={v}" for k, v in base_env.items()],
            "cwd": cwd,
            "capabilities": {k: list(DEFAULT_CAPS) for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": readonly_root},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            {"destination": HOME, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=700"]},
            *(extra_mounts or []),
        ],
        "annotations": dict(annotations or {}),
        "linux": {"namespaces": namespaces},
    }
    return validate(spec)


def netns_path(spec: dict) -> str | None:
    """The network namespace path a spec joins; None when it names none."""
    for ns in (spec.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network":
            return ns.get("path") or None
    return None


def with_netns(spec: dict, netns_path: str | None) -> dict:
    """A copy of spec whose network namespace is `netns_path` (None: none given)."""
    out = copy.deepcopy(spec)
    nss = [ns for ns in out.setdefault("linux", {}).get("namespaces", []) if ns.get("type") != "network"]
    if netns_path:
        nss.append({"type": "network", "path": netns_path})
    out["linux"]["namespaces"] = nss
    return out
