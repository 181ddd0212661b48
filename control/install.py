"""Where this thaw runs from: a developer checkout, a release install
(deploy/install.sh of dist/thaw-<version>/), or anything else (the DaemonSet
image, a plain pip install). It decides the defaults of control/config.py's
binary keys and of node.install_dir."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_INSTALL_DIR = Path("/opt/thaw")
# In the virtualenv of a release install (ci/install.sh writes it): {"prefix", "version"}.
# Twin: ci/install.sh RELEASE_MARKER.
RELEASE_MARKER = "thaw-release.json"


@dataclass(frozen=True)
class Install:
    """Where this thaw runs from, which decides the defaults of the binary keys
    (runsc.path, pack.chunker, ...: `bin_dir`), of node.install_dir (`prefix`)
    and of `thaw provision --from` (`source_bin`):

    - "checkout": a developer checkout (`make setup`, an editable install): the
      binaries `make setup` built in <repo>/build, provision installs from there
      into /opt/thaw;
    - "release": a release install (`install.sh` of dist/thaw-<version>/): its
      virtualenv is <prefix>/releases/<version>/venv, the node's binaries
      <prefix>/bin, installed by provision from <prefix>/releases/<version>/bin;
    - "other" (the DaemonSet image, a plain `pip install`): /opt/thaw/bin, and
      provision needs --from (the image's ConfigMap names every path).
    """
    kind: str
    prefix: Path
    bin_dir: Path
    source_bin: Path | None
    error: str = ""    # an unreadable marker: `load` raises it, naming the file


def install_of(repo: Path, prefix: str = sys.prefix) -> Install:
    if (repo / "go" / "go.mod").is_file() and (repo / "pyproject.toml").is_file():
        return Install("checkout", DEFAULT_INSTALL_DIR, repo / "build", repo / "build")
    marker = Path(prefix) / RELEASE_MARKER
    try:
        root = Path(json.loads(marker.read_text())["prefix"])
    except FileNotFoundError:
        return Install("other", DEFAULT_INSTALL_DIR, DEFAULT_INSTALL_DIR / "bin", None)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Install("other", DEFAULT_INSTALL_DIR, DEFAULT_INSTALL_DIR / "bin", None,
                       f"{marker} (written by install.sh) is unreadable: {e}")
    return Install("release", root, root / "bin", Path(prefix).parent / "bin")
