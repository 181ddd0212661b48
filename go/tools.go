//go:build tools

// Package tools pins the upstream binaries thaw builds from the Go module
// proxy: gVisor's runsc and containerd shim, and containerd with ctr.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
