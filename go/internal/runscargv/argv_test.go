package runscargv

import (
	"os"
	"path/filepath"
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

func TestTargetIndex(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		id   string
	}{
		{[]string{"--root=/r", "state", "c1"}, "c1"},
		{[]string{"--root", "/r", "wait", "--pid", "3", "c1"}, "c1"},
		{[]string{"--root=/r", "kill", "--all", "c1", "9"}, "c1"},
		{[]string{"--root=/r", "kill", "--pid", "7", "c1", "TERM"}, "c1"},
		{[]string{"--root=/r", "exec", "--process", "/tmp/p.json", "--detach", "--pid-file", "/p", "c1"}, "c1"},
		{[]string{"--root=/r", "exec", "--cwd", "/", "-env", "A=B", "c1", "ls", "-l", "/"}, "c1"},
		{[]string{"--root=/r", "exec", "--", "c1", "ls"}, "c1"},
		{[]string{"--root=/r", "events", "--stats", "c1"}, "c1"},
		{[]string{"--root=/r", "ps", "--format", "json", "c1"}, "c1"},
		{[]string{"--root=/r", "list"}, ""},
		{[]string{"--version"}, ""},
	} {
		a := Parse(tc.argv)
		got := ""
		if i := a.TargetIndex(); i >= 0 {
			got = a.Args[i]
		}
		if got != tc.id {
			t.Errorf("%v: target %q, want %q", tc.argv, got, tc.id)
		}
	}
}

func TestWithTargetRewritesOnlyTheId(t *testing.T) {
	a := Parse([]string{"--root=/r", "--log", "/l", "exec", "--cwd", "c1", "c1", "echo", "c1"})
	got := a.WithTarget("p9").Words()
	want := []string{"--root=/r", "--log", "/l", "exec", "--cwd", "c1", "p9", "echo", "c1"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if !reflect.DeepEqual(a.Args, []string{"--cwd", "c1", "c1", "echo", "c1"}) {
		t.Fatalf("WithTarget changed its receiver: %v", a.Args)
	}
}

func TestAlias(t *testing.T) {
	root := t.TempDir()
	if Alias(root, "c1") != "" {
		t.Fatal("alias without a link")
	}
	if err := os.Symlink("thaw-parked-1", filepath.Join(root, AliasPrefix+"c1")); err != nil {
		t.Fatal(err)
	}
	if got := Alias(root, "c1"); got != "thaw-parked-1" {
		t.Fatalf("alias %q", got)
	}
	if Alias(root, "../c1") != "" || Alias(root, "") != "" {
		t.Fatal("an id with a slash or none has no alias")
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, AliasPrefix+"c2")); err != nil {
		t.Fatal(err)
	}
	if Alias(root, "c2") != "" {
		t.Fatal("a link to a path is no alias")
	}
	if Parse([]string{"state", "x"}).Root() != DefaultRoot {
		t.Fatal("default root")
	}
}
