#!/usr/bin/env python3
"""Render deploy/kubernetes/*.yaml from the Helm chart (deploy/helm/thaw), so the
plain manifests and the chart are one source: `helm template` with the values of
deploy/helm/thaw/ci/manifests-values.yaml, each template's documents into the
numbered file below. deploy/kubernetes/examples/ is not generated.

    python3 ci/update-manifests.py           # rewrite the files
    python3 ci/update-manifests.py --check   # exit 1 naming the stale ones

It needs build/k8s/helm (or $THAW_BUILD_DIR/k8s/helm, built by ci/build-cluster.sh);
tests/unit/test_chart.py fails when a file is not this rendering."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy/helm/thaw"
VALUES = CHART / "ci/manifests-values.yaml"
OUT = REPO / "deploy/kubernetes"
RELEASE, NAMESPACE = "thaw", "thaw-system"
# template -> the file its documents go to (kubectl apply -f reads them in this order)
FILES = {
    "namespace.yaml": "00-namespace.yaml",
    "runtimeclass.yaml": "10-runtimeclass.yaml",
    "serviceaccount.yaml": "20-serviceaccount.yaml",
    "rbac.yaml": "21-rbac.yaml",
    "admissionpolicy.yaml": "22-admissionpolicy.yaml",
    "configmap.yaml": "30-configmap.yaml",
    "secret-store.yaml": "31-secret-s3-example.yaml",
    "secret-keys.yaml": "32-secret-keys-example.yaml",
    "daemonset.yaml": "40-daemonset.yaml",
    "service.yaml": "41-service.yaml",
}
HEADER = "# Generated from deploy/helm/thaw by ci/update-manifests.py: edit the chart, not this file.\n"


def helm() -> Path:
    return Path(os.environ.get("THAW_BUILD_DIR") or REPO / "build") / "k8s" / "helm"


def render(helm_bin: Path | None = None) -> dict[str, str]:
    """{file name: text} of the manifests as the chart renders them."""
    out = subprocess.run([str(helm_bin or helm()), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                          "-f", str(VALUES)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"update-manifests: helm template failed: {out.stderr.strip()}")
    files: dict[str, list[str]] = {}
    for doc in re.split(r"^---\n", out.stdout, flags=re.M):
        m = re.match(r"# Source: thaw/templates/(\S+)\n", doc)
        if not m:
            if doc.strip():
                raise SystemExit(f"update-manifests: a document without its template's name: {doc[:80]!r}")
            continue
        name = FILES.get(m.group(1))
        if name is None:
            raise SystemExit(f"update-manifests: template {m.group(1)} has no file in FILES")
        files.setdefault(name, []).append(doc[m.end():].rstrip("\n") + "\n")
    return {name: HEADER + "---\n".join(docs) for name, docs in sorted(files.items())}


def main(argv: list[str]) -> int:
    want = render()
    stale = sorted(n for n, t in want.items() if not (OUT / n).is_file() or (OUT / n).read_text() != t)
    extra = sorted(p.name for p in OUT.glob("*.yaml") if p.name not in want)
    if "--check" in argv:
        for n in stale + extra:
            print(f"update-manifests: deploy/kubernetes/{n} is not the chart's rendering", file=sys.stderr)
        return 1 if stale or extra else 0
    for n in extra:
        (OUT / n).unlink()
    for n in stale:
        tmp = OUT / f".{n}.partial"
        tmp.write_text(want[n])
        tmp.replace(OUT / n)
        print(f"update-manifests: wrote deploy/kubernetes/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
