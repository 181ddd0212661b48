"""control/dev/chart.py, the cluster tests' hook: the helm and kubectl calls it makes
(recorded by stand-in binaries; the integration tier runs the real ones on a cluster)."""
from __future__ import annotations

import json

import pytest

from control.dev import chart
from control.errors import PreconditionError, ThawError

RECORD = """#!/bin/sh
echo "$(basename "$0") $*" >> "$(dirname "$0")/argv.log"
for a in "$@"; do case "$prev" in -f) cp "$a" "$(dirname "$0")/values-$(basename "$a")";; esac; prev=$a; done
[ -e "$(dirname "$0")/fail" ] && { echo "Error: INSTALLATION FAILED: timed out waiting for the condition" >&2; exit 1; }
exit 0
"""


@pytest.fixture
def bins(tmp_path):
    for name in ("helm", "kubectl"):
        f = tmp_path / name
        f.write_text(RECORD)
        f.chmod(0o755)
    return tmp_path


def test_install_loads_the_image_labels_the_nodes_and_waits_for_thawd(bins, tmp_path):
    loaded = []
    r = chart.install(tmp_path / "kubeconfig", values={"kubernetes": {"events": True}}, nodes=["node-a", "node-b"],
                      load_image=loaded.append, pull_never=True, helm=bins / "helm", kubectl=bins / "kubectl")
    assert loaded == [chart.IMAGE_ARCHIVE]
    lines = (bins / "argv.log").read_text().splitlines()
    assert lines[:2] == [f"kubectl --kubeconfig {tmp_path / 'kubeconfig'} label node {n} --overwrite thaw.dev/node=true"
                         for n in ("node-a", "node-b")]
    assert lines[2].startswith(f"helm upgrade --install thaw {chart.CHART} --kubeconfig {tmp_path / 'kubeconfig'} "
                               "--namespace thaw-system --create-namespace --wait --timeout 300s -f ")
    [values] = [json.loads(p.read_text()) for p in bins.glob("values-*")]
    assert values == {"kubernetes": {"events": True}, "image": {"pullPolicy": "Never"}}
    chart.uninstall(r)
    assert (bins / "argv.log").read_text().splitlines()[-1] == (
        f"helm uninstall thaw --kubeconfig {tmp_path / 'kubeconfig'} --namespace thaw-system --wait --timeout 300s")


def test_a_failed_install_says_helms_words_and_a_missing_helm_fails_first(bins, tmp_path):
    (bins / "fail").write_text("")
    with pytest.raises(ThawError, match="helm install thaw failed .*timed out waiting for the condition"):
        chart.install(tmp_path / "kc", helm=bins / "helm", kubectl=bins / "kubectl")
    with pytest.raises(PreconditionError, match="no helm at"):
        chart.install(tmp_path / "kc", helm=tmp_path / "none")
