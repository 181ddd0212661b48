package runscargv

import (
	"reflect"
	"testing"
)

func TestParseShimStyle(t *testing.T) {
	a := Parse([]string{"--root=/run/containerd/runsc/k8s.io", "--log=/l.json", "--log-format=json",
		"--platform=systrap", "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "c1"})
	if a.Command != "create" || a.ContainerID() != "c1" || a.Flag("bundle") != "/b" || a.Flag("pid-file") != "/b/init.pid" {
		t.Fatalf("bad parse: %+v", a)
	}
	if a.GlobalValue("root") != "/run/containerd/runsc/k8s.io" || a.GlobalValue("log") != "/l.json" {
		t.Fatalf("bad globals: %+v", a.Global)
	}
}

func TestParseSeparateValuesAndBools(t *testing.T) {
	a := Parse([]string{"--root", "/r", "--debug", "-nvproxy", "--debug-log", "/d/", "delete", "--force", "c2"})
	if a.Command != "delete" || a.ContainerID() != "c2" {
		t.Fatalf("bad parse: %+v", a)
	}
	want := []string{"--root", "/r", "--debug", "-nvproxy", "--debug-log", "/d/"}
	if !reflect.DeepEqual(a.Global, want) || a.GlobalValue("root") != "/r" || a.GlobalValue("debug-log") != "/d/" {
		t.Fatalf("globals %v", a.Global)
	}
}

func TestParseUnknownFlagBeforeSubcommand(t *testing.T) {
	// An unknown flag directly followed by a subcommand name takes no value.
	a := Parse([]string{"--some-future-bool", "state", "c3"})
	if a.Command != "state" || a.ContainerID() != "c3" {
		t.Fatalf("bad parse: %+v", a)
	}
	if a := Parse([]string{"--version"}); a.Command != "" {
		t.Fatalf("--version has no subcommand: %+v", a)
	}
}
