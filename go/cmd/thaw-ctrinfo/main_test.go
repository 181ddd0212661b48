package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The CRI plugin stores its metadata as encoding/json of
// {"Version":"v1","Metadata":{...}} with the CRI API's own config types
// (containerd internal/cri/store/{container,sandbox}/metadata.go MarshalJSON).
// Built here the same way, read back by thaw-ctrinfo's parser.
func criJSON(t *testing.T, md any) []byte {
	b, err := json.Marshal(map[string]any{"Version": "v1", "Metadata": md})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCRIMetadataNamesThePodNamespaceAndImageDigest(t *testing.T) {
	cfg := &runtimeapi.ContainerConfig{Labels: map[string]string{"io.kubernetes.pod.namespace": "team-a"},
		Annotations: map[string]string{"thaw.dev/tenant": "forged"}}
	out, err := containerMeta("c1", criJSON(t, map[string]any{"ID": "c1", "SandboxID": "s1", "Config": cfg,
		"ImageRef": "sha256:cfg", "ImageDigest": "sha256:target", "ImageName": "example/app:1"}))
	if err != nil {
		t.Fatal(err)
	}
	if out.SandboxID != "s1" || out.ImageDigest != "sha256:target" || out.LabelNamespace != "team-a" {
		t.Fatalf("container metadata: %+v", out)
	}
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u",
		Namespace: "team-a"}, Annotations: map[string]string{"io.kubernetes.pod.namespace": "victim"}}
	sb := containers.Container{ID: "s1", Extensions: map[string]typeurl.Any{
		criSandboxExt: &anypb.Any{TypeUrl: "x", Value: criJSON(t, map[string]any{"ID": "s1", "Config": sbCfg})}}}
	if err := sandboxInto(sb, out); err != nil {
		t.Fatal(err)
	}
	if out.PodNamespace != "team-a" || out.PodName != "p" || out.PodUID != "u" {
		t.Fatalf("sandbox metadata: %+v", out)
	}
}

func TestUnknownOrMissingCRIMetadataIsAnError(t *testing.T) {
	if _, err := containerMeta("c1", []byte(`{"Version":"v2","Metadata":{}}`)); err == nil {
		t.Fatal("an unknown metadata version must not be read as v1")
	}
	if err := sandboxInto(containers.Container{ID: "s1"}, &criInfo{}); err == nil {
		t.Fatal("a sandbox without CRI metadata names no pod")
	}
}

// A pod's sandbox (pause) container carries the sandbox extension itself: its
// pod is named from it, and no image digest (the CRI plugin records none).
func TestSandboxContainerNamesItsOwnPod(t *testing.T) {
	sbCfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "team-b"}}
	sb := containers.Container{ID: "s1", Extensions: map[string]typeurl.Any{
		criSandboxExt: &anypb.Any{TypeUrl: "x", Value: criJSON(t, map[string]any{"ID": "s1", "Config": sbCfg})}}}
	out, err := criOf(context.Background(), nil, sb)
	if err != nil || out == nil || out.PodNamespace != "team-b" || out.SandboxID != "s1" || out.ImageDigest != "" {
		t.Fatalf("%+v %v", out, err)
	}
	if out, err := criOf(context.Background(), nil, containers.Container{ID: "plain"}); out != nil || err != nil {
		t.Fatalf("a container without CRI metadata: %+v %v", out, err)
	}
}
