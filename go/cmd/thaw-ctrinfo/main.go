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
// Two subcommands make and remove the root filesystem of a parked sandbox
// (rootfs.go): one thawd restores a checkpoint into ahead of demand, before
// containerd makes any container. runsc needs the same rootfs the
// checkpointed container had, so it is made the way containerd makes a
// container's: an active (writable) snapshot of the image's layers in
// containerd's own snapshotter, mounted with containerd's mount package. No
// file of the image is copied, and containerd's garbage collector keeps the
// layers (the snapshot is a GC root and references its parent chain).
//
//	thaw-ctrinfo -address SOCK -namespace NS -timeout 30s rootfs-prepare -snapshotter S -parent CHAIN_ID -target DIR KEY
//	thaw-ctrinfo -address SOCK -namespace NS -timeout 30s rootfs-remove -snapshotter S -target DIR KEY
//
// rootfs-prepare: Prepare(KEY, CHAIN_ID) in snapshotter S (CHAIN_ID: the
// snapshot_parent this command prints for a container of the image) with the
// labels containerd.io/gc.root=<RFC3339 time> and dev.thaw.parked=KEY, then
// mount it at DIR (an absolute path; made 0700 if missing, its parent is the
// caller's). DIR must be an empty directory and no mount point. If anything
// after the Prepare fails, the snapshot is removed again (and DIR, if this
// made it); that cleanup may run up to 2 s past -timeout. Output (exit 0):
//
//	{"key":KEY, "target":DIR, "snapshotter":S,
//	 "mounts":[{"type":"overlay","source":"overlay","options":["workdir=..","upperdir=..","lowerdir=.."]}]}
//
// rootfs-remove: unmount DIR and everything under it (a DIR that is not
// mounted, or does not exist, is fine), then remove snapshot KEY (one that
// does not exist is fine: thawd calls this to clean up after a crash), then
// remove DIR if it is now an empty directory. A snapshot without the label
// dev.thaw.parked=KEY (a container's, say) is refused, and nothing is
// unmounted. Output (exit 0; removed is false when there was no snapshot):
//
//	{"key":KEY, "removed":true}
//
// A lone positional word is always a container id, even one spelled like a
// subcommand; global flags come before the subcommand, its own after it.
//
// Failure: exit 1 and {"error":{"kind":K,"detail":..}}, K one of
// "not-found" (no such container; rootfs-prepare: "image layers CHAIN_ID not
// unpacked for snapshotter S"), "exists" (rootfs-prepare: KEY is taken, or DIR
// is not an empty directory or is a mount point), "unavailable", "deadline",
// "other". Bad arguments: exit 2 and the usage on stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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

const usage = `usage: thaw-ctrinfo -address SOCK -namespace NS [-timeout D] CONTAINER_ID
       thaw-ctrinfo -address SOCK -namespace NS [-timeout D] rootfs-prepare -snapshotter S -parent CHAIN_ID -target DIR KEY
       thaw-ctrinfo -address SOCK -namespace NS [-timeout D] rootfs-remove -snapshotter S -target DIR KEY
`

// globals are the flags before any subcommand.
type globals struct {
	address   string
	namespace string
	timeout   time.Duration
}

// command is one parsed invocation: a container lookup (id) or a rootfs
// subcommand (rootfs non-nil).
type command struct {
	globals
	id     string
	rootfs *rootfsArgs
}

// parse reads argv (without the program name). flag.ErrHelp: -h or -help;
// any other error is a usage error.
func parse(args []string) (command, error) {
	var cmd command
	fs := flag.NewFlagSet("thaw-ctrinfo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cmd.address, "address", "/run/containerd/containerd.sock", "containerd's socket")
	fs.StringVar(&cmd.namespace, "namespace", "", "containerd namespace of the container")
	fs.DurationVar(&cmd.timeout, "timeout", 2*time.Second, "deadline of the whole command")
	if err := fs.Parse(args); err != nil {
		return cmd, err
	}
	if cmd.namespace == "" {
		return cmd, errors.New("-namespace is required")
	}
	rest := fs.Args()
	switch {
	case len(rest) == 1:
		cmd.id = rest[0]
		return cmd, nil
	case len(rest) > 1 && (rest[0] == opPrepare || rest[0] == opRemove):
		a, err := parseRootfs(rest[0], rest[1:])
		cmd.rootfs = a
		return cmd, err
	case len(rest) == 0:
		return cmd, errors.New("no container id or subcommand")
	}
	return cmd, fmt.Errorf("one container id expected, got %q", rest)
}

func main() {
	cmd, err := parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "thaw-ctrinfo: %v\n%s", err, usage)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), cmd.namespace), cmd.timeout)
	defer cancel()
	var out any
	if cmd.rootfs != nil {
		out, err = runRootfs(ctx, cmd.globals, *cmd.rootfs)
	} else {
		out, err = lookup(ctx, cmd.address, cmd.namespace, cmd.id, cmd.timeout)
	}
	if rc := emit(os.Stdout, ctx, out, err); rc != 0 {
		os.Exit(rc)
	}
}

// emit writes a command's result, or its error as {"error":{"kind","detail"}},
// as one JSON line; it returns the exit status.
func emit(w io.Writer, ctx context.Context, out any, err error) int {
	enc := json.NewEncoder(w)
	if err != nil {
		enc.Encode(map[string]any{"error": map[string]string{"kind": kind(ctx, err), "detail": err.Error()}})
		return 1
	}
	enc.Encode(out)
	return 0
}

func kind(ctx context.Context, err error) string {
	switch {
	case errdefs.IsNotFound(err):
		return "not-found"
	case errdefs.IsAlreadyExists(err):
		return "exists"
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
