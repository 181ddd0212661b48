"""containerd configuration for thaw: the shim's runsc.toml, the CRI runtime
handler drop-in, the one-line `imports` edit of the main config, and a
stand-alone config for a private containerd (tests, demo).

Pure functions: text in, text out; nothing here touches the disk. The keys
are the ones the pinned sources read (paths relative to the module cache,
$(go env GOMODCACHE)):

- gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237/pkg/shim/v1/runsc/options.go:
  `Options` (binary_name, root, log_level, log_path, runsc_config, ...) and
  optionsType "io.containerd.runsc.v1.options".
- .../pkg/shim/v1/runsc/container.go NewContainer: the shim decodes the file at
  the runtime option ConfigPath into `Options` (BurntSushi/toml; unknown keys
  are ignored silently, so a typo here would be lost: unit tests pin the keys).
- .../pkg/shim/v1/proc/init.go NewRunsc: runsc runs with
  --root=<root>/<containerd namespace> and every runsc_config entry as --key=value
  (runsccmd/runsc.go args); root defaults to /run/containerd/runsc.
- github.com/containerd/containerd/v2@v2.4.2/internal/cri/config/config.go:
  `Runtime` (runtime_type, runtime_path, pod_annotations, options) and
  GenerateRuntimeOptions (options decode into runtimeoptions.Options
  {TypeUrl, ConfigPath} for any runtime type other than runc/runhcs).
- .../plugins/cri/runtime/plugin.go: the CRI runtime plugin is
  "io.containerd.cri.v1" + ID "runtime" (config version 3 naming).
- .../cmd/containerd/server/config/config.go LoadConfigWithPlugins /
  resolveImports / mergeConfig: imports are read only from files that are
  loaded (a missing main config loads nothing, drop-ins included); relative
  imports resolve against the importing file's directory; `*` globs with
  filepath.Glob; plugin tables are merged key by key, so a drop-in that adds
  one runtime keeps the user's other runtimes and settings
  (config_test.go TestMergingPluginsWithTwoCriRuntimeDropInConfigs).
- .../version/version.go ConfigVersion = 4 in 2.4; 2.0-2.2 accept at most 3.
  thaw writes version 3, which every 2.x reads (2.3+ migrate it in memory and
  log one warning per file).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from control.config import Settings
from control.errors import ConfigError, UserError

# gVisor's shim is containerd-shim-runsc-v1; containerd derives the binary name
# from the runtime type (core/runtime/v2/shim_load.go BinaryName).
RUNTIME_TYPE = "io.containerd.runsc.v1"
# gvisor pkg/shim/v1/runsc/options.go optionsType.
OPTIONS_TYPE_URL = "io.containerd.runsc.v1.options"
# containerd plugins/cri/runtime/plugin.go: CRIServicePlugin "io.containerd.cri.v1" + ID "runtime".
CRI_RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
CONFIG_VERSION = 3
# The drop-in's file name inside containerd.dropin_dir.
DROPIN_NAME = "thaw.toml"
# Pod annotations CRI copies into the OCI spec of this runtime's sandboxes and
# containers (internal/cri/util/util.go GetPassthroughAnnotations, path.Match):
# thaw's opt-in (thaw.dev/workload) and gVisor's own (dev.gvisor.*).
POD_ANNOTATIONS = ("thaw.dev/*", "dev.gvisor.*")
# Global flags the shim sets itself on every runsc call (runsccmd/runsc.go
# args, proc/init.go NewRunsc); a runsc_config entry for one would repeat it.
_SHIM_OWNED_FLAGS = frozenset({"root", "log", "log-format", "panic-log"})

HEADER = ("# Written by `thaw provision` (control/node/containerd_config.py); re-run it\n"
          "# instead of editing: it rewrites this file whenever it differs.\n")


def _s(value: str | Path) -> str:
    """A TOML basic string. JSON's escapes are a subset of TOML's."""
    return json.dumps(str(value), ensure_ascii=False)


def _key(name: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _s(name)


def _array(values: Iterable[str | Path]) -> str:
    return "[" + ", ".join(_s(v) for v in values) + "]"


def runsc_config_flags(settings: Settings, gpu: bool) -> dict[str, str]:
    """The runsc global flags every call carries, as runsc.toml's [runsc_config].

    Restore needs the same global flags as the run that was saved
    (docs/notes/gvisor-facts.md), so thawd's own runsc calls must use this same map.
    `settings.runsc_flags` words are `--name` (meaning true) or `--name=value`.
    """
    flags = {"platform": settings.runsc_platform}
    if gpu:
        flags["nvproxy"] = "true"
    for word in settings.runsc_flags:
        m = re.fullmatch(r"--?([a-z0-9][a-z0-9-]*)(?:=(.*))?", word)
        if not m:
            raise ConfigError("runsc.flags", f"expected --name or --name=value, got {word!r}")
        name, value = m.group(1), m.group(2)
        if name in _SHIM_OWNED_FLAGS:
            raise ConfigError("runsc.flags", f"--{name} is set by containerd's shim itself; remove it")
        flags[name] = "true" if value is None else value
    return flags


def runsc_toml(settings: Settings, standin_path: Path, *, gpu: bool = False,
               root: Path | None = None, log_path: str | None = None,
               log_level: str | None = None) -> str:
    """The shim's config file (runtime option ConfigPath points at it).

    standin_path: what the shim executes as runsc (`binary_name`): thaw's
    stand-in, or the real runsc when the stand-in is not installed (cold
    starts only). root: runsc state root (default containerd.runsc_root).
    log_path: the shim's log; a value ending in "/" is a directory holding
    runsc-shim-<id>.log (runsccmd/utils.go FormatShimLogPath); default
    <node.log_dir>/shim/.
    """
    root = root or settings.containerd_runsc_root
    log_path = log_path if log_path is not None else f"{settings.log_dir}/shim/"
    lines = [HEADER.rstrip("\n"),
             "# containerd-shim-runsc-v1 options (gvisor pkg/shim/v1/runsc/options.go).",
             f"binary_name = {_s(standin_path)}",
             f"root = {_s(root)}",
             f"log_path = {_s(log_path)}"]
    if log_level:
        lines.append(f"log_level = {_s(log_level)}")
    lines += ["", "# Passed to every runsc call as --key=value.", "[runsc_config]"]
    for name, value in sorted(runsc_config_flags(settings, gpu).items()):
        lines.append(f"{_key(name)} = {_s(value)}")
    return "\n".join(lines) + "\n"


def runtime_table(handler: str, shim_path: Path | None, runsc_toml_path: Path,
                  pod_annotations: Iterable[str] = POD_ANNOTATIONS) -> str:
    """The `[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.<handler>]` tables."""
    base = f"plugins.{_s(CRI_RUNTIME_PLUGIN)}.containerd.runtimes.{_key(handler)}"
    lines = [f"[{base}]", f"  runtime_type = {_s(RUNTIME_TYPE)}"]
    if shim_path is not None:
        # An absolute shim path: containerd need not find containerd-shim-runsc-v1 on PATH.
        lines.append(f"  runtime_path = {_s(shim_path)}")
    lines += [f"  pod_annotations = {_array(pod_annotations)}",
              "",
              f"  [{base}.options]",
              f"    TypeUrl = {_s(OPTIONS_TYPE_URL)}",
              f"    ConfigPath = {_s(runsc_toml_path)}"]
    return "\n".join(lines) + "\n"


def containerd_dropin(handler: str, shim_path: Path | None, runsc_toml_path: Path,
                      pod_annotations: Iterable[str] = POD_ANNOTATIONS) -> str:
    """The drop-in that adds the runtime handler to containerd's CRI plugin."""
    return (HEADER + f"# The `{handler}` CRI runtime handler: gVisor's shim, runsc = thaw's stand-in.\n"
            f"version = {CONFIG_VERSION}\n\n"
            + runtime_table(handler, shim_path, runsc_toml_path, pod_annotations))


def private_containerd_config(root: Path, state: Path, socket: Path, *,
                              handler: str | None = None, shim_path: Path | None = None,
                              runsc_toml_path: Path | None = None,
                              pod_annotations: Iterable[str] = POD_ANNOTATIONS,
                              disabled_plugins: Iterable[str] = (),
                              log_level: str = "info") -> str:
    """A complete config for a private containerd: own root, state and sockets.

    No imports, so the node's /etc/containerd/conf.d is not read; with
    `handler`, the CRI plugin gets that runtime handler (runsc_toml_path
    required). Start it with `containerd --config FILE`.
    """
    lines = [HEADER.rstrip("\n"), "# A private containerd instance (nothing shared with the node's).",
             f"version = {CONFIG_VERSION}",
             f"root = {_s(root)}",
             f"state = {_s(state)}",
             "imports = []"]
    if disabled_plugins:
        lines.append(f"disabled_plugins = {_array(disabled_plugins)}")
    lines += ["", "[grpc]", f"  address = {_s(socket)}",
              "", "[ttrpc]", f"  address = {_s(str(socket) + '.ttrpc')}",
              "", "[debug]", f"  level = {_s(log_level)}", ""]
    text = "\n".join(lines) + "\n"
    if handler is not None:
        if runsc_toml_path is None:
            raise UserError("private_containerd_config: a handler needs runsc_toml_path")
        text += runtime_table(handler, shim_path, runsc_toml_path, pod_annotations)
    return text


# -- the main config's imports ------------------------------------------------

def import_pattern(dropin_dir: Path) -> str:
    """The imports entry that loads every drop-in of `dropin_dir`."""
    return f"{dropin_dir}/*.toml"


def _glob_match(pattern: str, path: str) -> bool:
    """filepath.Match semantics: '*' never crosses '/'."""
    pp, cp = PurePosixPath(pattern).parts, PurePosixPath(path).parts
    return len(pp) == len(cp) and all(fnmatchcase(c, p) for p, c in zip(pp, cp, strict=True))


def _resolve(entry: str, config_path: Path) -> str:
    """containerd's resolveImports for one entry (without the glob)."""
    p = PurePosixPath(entry)
    if not p.is_absolute():
        p = PurePosixPath(config_path).parent / p
    # filepath.Clean: collapse "." and ".." lexically.
    parts: list[str] = []
    for part in p.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def imports_cover(imports: Iterable[str], config_path: Path, dropin: Path) -> bool:
    """Does an `imports` list of the config at `config_path` load `dropin`?"""
    for entry in imports:
        resolved = _resolve(entry, config_path)
        if "*" in resolved:
            if _glob_match(resolved, str(dropin)):
                return True
        elif resolved == str(dropin):
            return True
    return False


def parse_main_config(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"containerd config {path} is not valid TOML ({e}); "
                        "thaw will not edit it: fix it first", path=str(path)) from None


@dataclass(frozen=True)
class ImportsEdit:
    """What `ensure_import` decided: the new text (None: leave the file as is)."""
    text: str | None
    reason: str


def new_main_config(dropin_dir: Path) -> str:
    """The main config thaw writes when a node has none: containerd's defaults
    (a loaded file is merged over them) plus the drop-in directory."""
    return (f"# containerd config written by `thaw provision` because none existed: containerd's\n"
            f"# defaults plus the drop-ins of {dropin_dir} (docs/provision.md).\n"
            f"version = {CONFIG_VERSION}\n"
            f"imports = {_array([import_pattern(dropin_dir)])}\n")


_IMPORTS_LINE = re.compile(r"""^[ \t]*(imports|"imports"|'imports')[ \t]*=""")
_VERSION_LINE = re.compile(r"""^[ \t]*(version|"version"|'version')[ \t]*=""")
MARK = "# added by thaw provision"


def ensure_import(text: str | None, config_path: Path, dropin_dir: Path) -> ImportsEdit:
    """Make the main config import `dropin_dir/*.toml`, changing one line at most.

    - no main config: a new one (new_main_config);
    - already covered (an imports entry matches dropin_dir/thaw.toml): no change;
    - no top-level `imports`: one line `imports = [...]` inserted after the
      top-level `version` line (else first);
    - an `imports` that does not cover it: that key's line(s) replaced by one
      line holding the old entries plus the new one.
    Every other byte stays. The result is re-parsed and must equal the
    original plus the import, or UserError says what to add by hand.
    """
    pattern = import_pattern(dropin_dir)
    if text is None:
        return ImportsEdit(new_main_config(dropin_dir), f"created with imports = [{pattern!r}]")
    data = parse_main_config(text, config_path)
    existing = data.get("imports")
    if existing is not None and (not isinstance(existing, list)
                                 or not all(isinstance(e, str) for e in existing)):
        raise UserError(f"containerd config {config_path}: `imports` is not a list of strings",
                        path=str(config_path))
    existing = existing or []
    if imports_cover(existing, config_path, dropin_dir / DROPIN_NAME):
        return ImportsEdit(None, "imports already cover " + str(dropin_dir))

    lines = text.splitlines(keepends=True)
    new_line = f"imports = {_array([*existing, pattern])}  {MARK}\n"
    want = dict(data, imports=[*existing, pattern])
    candidates: list[str] = []
    if "imports" not in data:
        for i, line in enumerate(lines):
            if _VERSION_LINE.match(line):
                candidates.append("".join(lines[:i + 1]) + _nl(lines[i]) + new_line + "".join(lines[i + 1:]))
                break
        candidates.append(new_line + text)
    else:
        for i, line in enumerate(lines):
            if not _IMPORTS_LINE.match(line):
                continue
            for j in range(i + 1, len(lines) + 1):
                chunk = "".join(lines[i:j])
                try:
                    if tomllib.loads(chunk).get("imports") == data["imports"]:
                        replacement = new_line if lines[j - 1].endswith("\n") else new_line.rstrip("\n")
                        candidates.append("".join(lines[:i]) + replacement + "".join(lines[j:]))
                        break
                except tomllib.TOMLDecodeError:
                    continue
    for candidate in candidates:
        try:
            if tomllib.loads(candidate) == want:
                return ImportsEdit(candidate, f"imports += [{pattern!r}]")
        except tomllib.TOMLDecodeError:
            continue
    raise UserError(f"containerd config {config_path}: could not add the drop-in directory to "
                    f"`imports` safely; add {pattern!r} to its top-level imports by hand",
                    path=str(config_path))


@dataclass(frozen=True)
class ImportsUndo:
    """What `undo_import` decided for the main config: "none" (leave it),
    "delete" (provision wrote the whole file), "write" (`text`: the original, byte
    for byte from `backup` when one matches, else the file with thaw's edit taken out)."""
    action: str
    reason: str
    text: str | None = None
    backup: Path | None = None


def undo_import(text: str | None, config_path: Path, dropin_dir: Path,
                backups: Iterable[tuple[Path, str]] = ()) -> ImportsUndo:
    """Undo `ensure_import` (`thaw uninstall`): the main config as it was before
    provision changed it.

    - provision wrote the file (none existed): delete it;
    - a backup (`<config>.thaw-backup`, `.2`, ...) that `ensure_import` turns
      into exactly this text: that backup's bytes;
    - else (the file changed since): the line provision marked (MARK) taken out
      (an added `imports` line) or given back its old entries (an extended one),
      when the result parses as this file without the drop-in's import;
    - no import of the drop-in directory: nothing to undo. Anything else is a
      UserError saying what to remove by hand.
    """
    if text is None:
        return ImportsUndo("none", "no main config")
    if text == new_main_config(dropin_dir):
        return ImportsUndo("delete", "written by `thaw provision` (none existed)")
    for path, old in backups:
        try:
            if ensure_import(old, config_path, dropin_dir).text == text:
                return ImportsUndo("write", f"restored from {path.name}", old, path)
        except UserError:
            continue
    data = parse_main_config(text, config_path)
    pattern = import_pattern(dropin_dir)
    imports = data.get("imports")
    if not isinstance(imports, list) or pattern not in imports:
        return ImportsUndo("none", f"does not import {pattern}")
    rest = [e for e in imports if e != pattern]
    want = {k: v for k, v in data.items() if k != "imports"} | ({"imports": rest} if rest else {})
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not (_IMPORTS_LINE.match(line) and line.rstrip().endswith(MARK)):
            continue
        nl = "\n" if line.endswith("\n") else ""
        replacement = f"imports = {_array(rest)}{nl}" if rest else ""
        candidate = "".join(lines[:i]) + replacement + "".join(lines[i + 1:])
        try:
            if tomllib.loads(candidate) == want:
                return ImportsUndo("write", "thaw's imports entry taken out (the file changed since provision)",
                                   candidate)
        except tomllib.TOMLDecodeError:
            pass
    raise UserError(f"containerd config {config_path}: cannot take thaw's import out safely; remove "
                    f"{pattern!r} from its top-level imports by hand", path=str(config_path))


def _nl(line: str) -> str:
    """A newline if `line` lacks one (the last line of a file)."""
    return "" if line.endswith("\n") else "\n"


def dropin_path(settings: Settings) -> Path:
    return settings.containerd_dropin_dir / DROPIN_NAME


def runtimes_in(data: Mapping[str, Any]) -> dict[str, Any]:
    """The CRI runtimes table of a parsed (version 3) config, for checks."""
    plugins = data.get("plugins", {})
    return plugins.get(CRI_RUNTIME_PLUGIN, {}).get("containerd", {}).get("runtimes", {})
