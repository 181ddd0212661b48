#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus cmd/promtool) from the Go
# module proxy into the build directory (THAW_BUILD_DIR, default ./build), for
# the unit test of deploy/prometheus/thaw-rules.yaml (tests/unit/test_monitoring.py).
# Cached like the other upstream binaries: rebuilt only when its inputs (the
# version below, this script, the Go version) change (.promtool-stamp).
# Not part of ci/build-go.sh (a test tool no node needs, and the release takes
# that script's outputs): ci/setup.sh runs this after it. On the 2-core development
# machine the first build took minutes (docs/operate.md "promtool"); later runs
# return at once when the stamp matches.
# Built with `go install pkg@version` against Prometheus' own go.mod: its
# dependency graph (every service discovery SDK) stays out of go/go.mod.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${THAW_BUILD_DIR:-"$here/build"}
PROMTOOL_VERSION=v0.316.0   # Prometheus 3.16; twin: tests/unit/test_monitoring.py PROMTOOL_VERSION
mkdir -p "$out"
inputs=$( (echo "$PROMTOOL_VERSION"; cat "$here/ci/build-promtool.sh"; go version) | sha256sum | cut -c1-16)
if [[ -x "$out/promtool" && "$(cat "$out/.promtool-stamp" 2>/dev/null)" == "$inputs" ]]; then
  exit 0
fi
gobin=$(mktemp -d "$out/.gobin-promtool.XXXXXX")
trap 'rm -rf "$gobin"' EXIT
echo "build: promtool <- github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION" >&2
(cd "$gobin" && GOBIN=$gobin CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
  go install -trimpath -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION")
mv -f "$gobin/promtool" "$out/promtool"
echo "$inputs" > "$out/.promtool-stamp"
