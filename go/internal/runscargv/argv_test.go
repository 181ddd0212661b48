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

// The shim sends `kill <id> <signal>` and `kill --all <id> <signal>`: the id is
// the first positional word, not the last (the stand-in's kill looked up a
// marker named after the signal and never routed a restoring pod's kill).
func TestKillContainerIDIsTheFirstPositional(t *testing.T) {
	for _, argv := range [][]string{
		{"--root=/r", "--log-format=json", "kill", "c1", "9"},
		{"--root=/r", "kill", "--all", "c1", "9"},
		{"--root=/r", "kill", "--pid", "7", "c1", "15"},
		{"--root=/r", "kill", "--pid=7", "c1"},
	} {
		if got := Parse(argv).KillContainerID(); got != "c1" {
			t.Errorf("%v: KillContainerID = %q, want c1", argv, got)
		}
	}
	if got := Parse([]string{"kill", "--all"}).KillContainerID(); got != "" {
		t.Errorf("no id: %q", got)
	}
}
