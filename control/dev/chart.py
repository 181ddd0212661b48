"""thaw's Helm chart on a cluster, for the cluster tests and benchmarks (issue 29):
`install(kubeconfig, ...)` runs the whole install, `uninstall(release)` undoes it.

The cluster itself (its nodes, their containerd, the kubeconfig) is the cluster
harness's; what the chart needs from it is passed in:
- `load_image(archive)`: put build/thaw-daemonset.oci.tar into every thaw node's
  containerd (namespace k8s.io): there is no registry, and the DaemonSet's pull
  policy is IfNotPresent (Never: `pull_never=True`);
- `nodes`: the nodes to label thaw.dev/node=true (the DaemonSet's and the
  RuntimeClass's nodeSelector), through kubectl at `kubectl`.
Then `helm upgrade --install --wait`: it returns once every thawd is ready (its
readiness probe is `thaw doctor`), or raises with helm's own words.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from control import config as configmod
from control.errors import PreconditionError, ThawError

BUILD = configmod.REPO_ROOT / "build"
CHART = configmod.REPO_ROOT / "deploy/helm/thaw"
IMAGE_ARCHIVE = BUILD / "thaw-daemonset.oci.tar"
NODE_LABEL = ("thaw.dev/node", "true")    # twin: deploy/helm/thaw/values.yaml nodeSelector


@dataclass(frozen=True)
class Release:
    kubeconfig: Path
    name: str
    namespace: str
    helm: Path


def _run(argv: list[str], what: str, timeout_s: float) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise PreconditionError(f"{what}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ThawError(f"{what}: no answer within {timeout_s:g}s") from None
    if p.returncode != 0:
        raise ThawError(f"{what} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-2000:]}")
    return p.stdout


def install(kubeconfig: Path, *, values: dict | None = None, values_files: Iterable[Path] = (),
            release: str = "thaw", namespace: str = "thaw-system", nodes: Iterable[str] = (),
            load_image: Callable[[Path], None] | None = None, pull_never: bool = False,
            helm: Path = BUILD / "k8s" / "helm", kubectl: Path = BUILD / "k8s" / "kubectl", timeout_s: float = 300) -> Release:
    """Install (or upgrade) the chart as `release` into `namespace` of the cluster
    `kubeconfig` reaches; the release, for `uninstall`."""
    if not helm.is_file():
        raise PreconditionError(f"no helm at {helm} (ci/build-cluster.sh builds helm.sh/helm/v4/cmd/helm@v4.3.2 into build/k8s)")
    if load_image is not None:
        if not IMAGE_ARCHIVE.is_file():
            raise PreconditionError(f"no DaemonSet image at {IMAGE_ARCHIVE} (make setup builds it)")
        load_image(IMAGE_ARCHIVE)
    for node in nodes:
        _run([str(kubectl), "--kubeconfig", str(kubeconfig), "label", "node", node, "--overwrite",
              "=".join(NODE_LABEL)], f"label node {node}", 60)
    merged = dict(values or {})
    if pull_never:
        merged.setdefault("image", {})["pullPolicy"] = "Never"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"{release}-values-") as f:
        json.dump(merged, f)     # JSON is YAML: helm reads it as a values file
        f.flush()
        argv = [str(helm), "upgrade", "--install", release, str(CHART), "--kubeconfig", str(kubeconfig),
                "--namespace", namespace, "--create-namespace", "--wait", "--timeout", f"{int(timeout_s)}s",
                "-f", f.name]
        for extra in values_files:
            argv += ["-f", str(extra)]
        _run(argv, f"helm install {release}", timeout_s + 60)
    return Release(kubeconfig, release, namespace, helm)


def uninstall(r: Release, timeout_s: float = 300) -> str:
    """`helm uninstall --wait`: thawd, the RuntimeClass, the config and RBAC go; the
    nodes keep what provision installed (the chart's NOTES.txt and docs/kubernetes.md
    "Uninstall" say what stays and how it goes). helm's answer."""
    return _run([str(r.helm), "uninstall", r.name, "--kubeconfig", str(r.kubeconfig), "--namespace", r.namespace,
                 "--wait", "--timeout", f"{int(timeout_s)}s"], f"helm uninstall {r.name}", timeout_s + 60)
