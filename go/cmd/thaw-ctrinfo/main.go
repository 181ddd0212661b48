// Command thaw-ctrinfo prints what containerd's own records say about one
// container, as one JSON object on stdout: the facts thawd builds a
// container's tenant and image identity from (control/thawd/ctrinfo.py is
// its caller and twin; issue 13). Nothing here comes from the container's
// OCI spec or annotations, which the workload's author writes.
//
//	thaw-ctrinfo -address /run/containerd/containerd.sock -namespace NS -timeout 2s ID
//
// Output (success, exit 0):
//
//	{"namespace":NS, "id":ID, "image":NAME, "image_digest":"sha256:..",
//	 "config_digest":"sha256:..", "chain_id":"sha256:..", "snapshotter":S,
//	 "snapshot_parent":"sha256:..", "labels":{...},
//	 "cri":{"sandbox_id":..,"pod_namespace":..,"pod_name":..,"pod_uid":..,
//	        "label_namespace":..,"image_digest":..,"image_ref":..,"image_name":..}}
//
// image_digest is the target digest of the image record named by the
// container (index or manifest), as the image store holds it now; chain_id
// is that image's rootfs chain for this platform, and snapshot_parent the
// parent of the container's rootfs snapshot: they differ when the name was
// moved to other content after the container was made (a re-pushed tag).
// "cri" is present only for a container carrying the CRI plugin's metadata
// extension (internal/cri/store/container.Metadata, written by the CRI
// plugin alone; a client cannot set it through the CRI API): pod_namespace
// is the pod sandbox's namespace from the sandbox's own metadata extension
// (the kubelet's RunPodSandbox request), image_digest the target digest the
// plugin resolved when it created the container. A pod's sandbox (pause)
// container carries the sandbox extension itself: "cri" names its pod, with
// no image digest (the plugin records none for it).
//
// Failure: exit 1 and {"error":{"kind":"not-found"|"unavailable"|"deadline"|"other","detail":..}}.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Extension names of containerd's CRI plugin (internal/cri/labels, pinned
// containerd v2.4.2: ContainerMetadataExtension, SandboxMetadataExtension).
const (
	criContainerExt = "io.cri-containerd.container.metadata"
	criSandboxExt   = "io.cri-containerd.sandbox.metadata"
	criNamespaceLbl = "io.kubernetes.pod.namespace"
)

type criInfo struct {
	SandboxID      string `json:"sandbox_id"`
	PodNamespace   string `json:"pod_namespace"`
	PodName        string `json:"pod_name"`
	PodUID         string `json:"pod_uid"`
	LabelNamespace string `json:"label_namespace"`
	ImageDigest    string `json:"image_digest"`
	ImageRef       string `json:"image_ref"`
	ImageName      string `json:"image_name"`
}

type info struct {
	Namespace      string            `json:"namespace"`
	ID             string            `json:"id"`
	Image          string            `json:"image"`
	ImageDigest    string            `json:"image_digest"`
	ConfigDigest   string            `json:"config_digest"`
	ChainID        string            `json:"chain_id"`
	Snapshotter    string            `json:"snapshotter"`
	SnapshotParent string            `json:"snapshot_parent"`
	Labels         map[string]string `json:"labels"`
	CRI            *criInfo          `json:"cri,omitempty"`
}

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd's socket")
	ns := flag.String("namespace", "", "containerd namespace of the container")
	timeout := flag.Duration("timeout", 2*time.Second, "deadline of the whole lookup")
	flag.Parse()
	if flag.NArg() != 1 || *ns == "" {
		fmt.Fprintln(os.Stderr, "usage: thaw-ctrinfo -address SOCK -namespace NS [-timeout D] CONTAINER_ID")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), *ns), *timeout)
	defer cancel()
	out, err := lookup(ctx, *address, *ns, flag.Arg(0), *timeout)
	enc := json.NewEncoder(os.Stdout)
	if err != nil {
		enc.Encode(map[string]any{"error": map[string]string{"kind": kind(ctx, err), "detail": err.Error()}})
		os.Exit(1)
	}
	enc.Encode(out)
}

func kind(ctx context.Context, err error) string {
	switch {
	case errdefs.IsNotFound(err):
		return "not-found"
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errdefs.IsUnavailable(err):
		return "unavailable"
	}
	return "other"
}

func lookup(ctx context.Context, address, ns, id string, timeout time.Duration) (*info, error) {
	c, err := client.New(address, client.WithDefaultNamespace(ns), client.WithTimeout(timeout))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctr, err := c.ContainerService().Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("container %s in namespace %s: %w", id, ns, err)
	}
	out := &info{Namespace: ns, ID: id, Image: ctr.Image, Labels: ctr.Labels, Snapshotter: ctr.Snapshotter}
	if ctr.SnapshotKey != "" && ctr.Snapshotter != "" {
		st, err := c.SnapshotService(ctr.Snapshotter).Stat(ctx, ctr.SnapshotKey)
		if err != nil {
			return nil, fmt.Errorf("rootfs snapshot %s of %s: %w", ctr.SnapshotKey, id, err)
		}
		out.SnapshotParent = st.Parent
	}
	if out.CRI, err = criOf(ctx, c, ctr); err != nil {
		return nil, err
	}
	if ctr.Image != "" {
		rec, err := c.ImageService().Get(ctx, ctr.Image)
		if err != nil {
			return nil, fmt.Errorf("image %s of %s: %w", ctr.Image, id, err)
		}
		out.ImageDigest = rec.Target.Digest.String()
		img := client.NewImage(c, rec)
		cfg, err := img.Config(ctx)
		if err != nil {
			return nil, fmt.Errorf("config of image %s: %w", ctr.Image, err)
		}
		out.ConfigDigest = cfg.Digest.String()
		diffs, err := img.RootFS(ctx)
		if err != nil {
			return nil, fmt.Errorf("rootfs of image %s: %w", ctr.Image, err)
		}
		out.ChainID = identity.ChainID(diffs).String()
	}
	return out, nil
}

// criOf reads the CRI plugin's metadata of a container and of its pod
// sandbox; nil for a container the CRI plugin did not make.
func criOf(ctx context.Context, c *client.Client, ctr containers.Container) (*criInfo, error) {
	ext, ok := ctr.Extensions[criContainerExt]
	if !ok || ext == nil {
		if sb, isSandbox := ctr.Extensions[criSandboxExt]; isSandbox && sb != nil {
			// A pod's sandbox (pause) container: its own metadata names the pod;
			// the CRI plugin records no image digest for it.
			out := &criInfo{SandboxID: ctr.ID}
			return out, sandboxInto(ctr, out)
		}
		return nil, nil
	}
	out, err := containerMeta(ctr.ID, ext.GetValue())
	if err != nil || out.SandboxID == "" {
		return out, err
	}
	sb, err := c.ContainerService().Get(ctx, out.SandboxID)
	if err != nil {
		return nil, fmt.Errorf("pod sandbox %s of %s: %w", out.SandboxID, ctr.ID, err)
	}
	return out, sandboxInto(sb, out)
}

// containerMeta reads the CRI plugin's container metadata
// (internal/cri/store/container.Metadata, JSON: {"Version":"v1","Metadata":{...}}).
func containerMeta(id string, value []byte) (*criInfo, error) {
	var cm struct {
		Version  string
		Metadata struct {
			SandboxID   string
			Config      *runtimeapi.ContainerConfig
			ImageRef    string
			ImageDigest string
			ImageName   string
		}
	}
	if err := json.Unmarshal(value, &cm); err != nil || cm.Version != "v1" {
		return nil, fmt.Errorf("CRI container metadata of %s: version %q: %v", id, cm.Version, err)
	}
	out := &criInfo{SandboxID: cm.Metadata.SandboxID, ImageDigest: cm.Metadata.ImageDigest,
		ImageRef: cm.Metadata.ImageRef, ImageName: cm.Metadata.ImageName}
	if cm.Metadata.Config != nil {
		out.LabelNamespace = cm.Metadata.Config.GetLabels()[criNamespaceLbl]
	}
	return out, nil
}

// sandboxInto fills the pod's identity from the sandbox's CRI metadata
// (internal/cri/store/sandbox.Metadata: {"Version":"v1","Metadata":{"Config":PodSandboxConfig,...}}).
func sandboxInto(sb containers.Container, out *criInfo) error {
	ext, ok := sb.Extensions[criSandboxExt]
	if !ok || ext == nil {
		return fmt.Errorf("pod sandbox %s has no CRI metadata", sb.ID)
	}
	var sm struct {
		Version  string
		Metadata struct {
			Config *runtimeapi.PodSandboxConfig
		}
	}
	if err := json.Unmarshal(ext.GetValue(), &sm); err != nil || sm.Version != "v1" || sm.Metadata.Config == nil {
		return fmt.Errorf("CRI sandbox metadata of %s: version %q: %v", sb.ID, sm.Version, err)
	}
	md := sm.Metadata.Config.GetMetadata()
	out.PodNamespace, out.PodName, out.PodUID = md.GetNamespace(), md.GetName(), md.GetUid()
	return nil
}
