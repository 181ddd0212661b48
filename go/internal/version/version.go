// Package version holds thaw's version, stamped into every thaw Go command at
// build time: ci/build-go.sh passes
//
//	-ldflags "-X thaw.dev/thaw/go/internal/version.Version=<control/version.py VERSION>"
//
// so the Go side names the same version as the Python side without a second
// copy of it. Twin: control/version.py VERSION.
package version

// Version is "unknown" in a build that was not stamped (go test, go run).
var Version = "unknown"
