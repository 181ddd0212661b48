//go:build tools

// Package tools pins the upstream binaries thaw builds from the Go module
// proxy: gVisor's runsc and containerd shim, containerd with ctr, crictl
// (the kubelet's view of containerd's CRI plugin, for the pod tests) and the
// CNI plugins a CRI pod network needs (ci/cri.sh).
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
