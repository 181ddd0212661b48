package standin

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupDirsV1ListsEachHierarchyThatHasThePath(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, filepath.Join(root, "cpuset/thaw/k20"), filepath.Join(root, "memory/thaw/k20"),
		filepath.Join(root, "cpu,cpuacct/thaw/k20"), filepath.Join(root, "pids/thaw"))
	// cgroup v1 co-mounts show up twice: a symlink per controller name.
	if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
		t.Fatal(err)
	}
	got := cgroupDirs(root, "/thaw/k20")
	want := []string{filepath.Join(root, "cpu,cpuacct/thaw/k20"), filepath.Join(root, "cpuset/thaw/k20"),
		filepath.Join(root, "memory/thaw/k20")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cgroupDirs = %v, want %v", got, want)
	}
}

func TestCgroupDirsV2IsTheOneUnifiedDirectory(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, filepath.Join(root, "thaw/k20"), filepath.Join(root, "cpuset/thaw/k20"))
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu memory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := cgroupDirs(root, "/thaw/k20"), []string{filepath.Join(root, "thaw/k20")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cgroupDirs = %v, want %v", got, want)
	}
}

func TestCgroupDirsLeavesRelativeSystemdAndRootPathsAlone(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, filepath.Join(root, "cpuset/thaw/k20"))
	for _, p := range []string{"thaw/k20", "system.slice:thaw:k20", "/", "", "/thaw/../"} {
		if got := cgroupDirs(root, p); got != nil {
			t.Errorf("cgroupDirs(%q) = %v, want none", p, got)
		}
	}
}

func TestRemoveCgroupDirsRemovesEmptyOnesAndKeepsOnesInUse(t *testing.T) {
	root := t.TempDir()
	empty, used := filepath.Join(root, "a/k1"), filepath.Join(root, "b/k1")
	// On a cgroup filesystem a directory with processes or children cannot be
	// removed; a plain directory with an entry stands in for one here.
	mkdirs(t, empty, filepath.Join(used, "child"))
	removed, errs := removeCgroupDirs([]string{empty, used, filepath.Join(root, "gone")}, 0)
	if !reflect.DeepEqual(removed, []string{empty}) {
		t.Fatalf("removed = %v, want %v", removed, []string{empty})
	}
	if len(errs) != 1 {
		t.Fatalf("errs = %v, want one (the directory in use)", errs)
	}
	if _, err := os.Stat(used); err != nil {
		t.Fatalf("the directory in use must stay: %v", err)
	}
}

func TestCgroupsPathsReadsTheSpecAndTheOriginalTheRestoreReplaced(t *testing.T) {
	bundle := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(bundle, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("config.json", `{"linux":{"cgroupsPath":"/thaw/k1-restore"}}`)
	write(origConfigName, `{"linux":{"cgroupsPath":"/thaw/k1"}}`)
	if got, want := cgroupsPaths(bundle), []string{"/thaw/k1-restore", "/thaw/k1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cgroupsPaths = %v, want %v", got, want)
	}
	write("config.json", `{"linux":{"cgroupsPath":"/thaw/k1"}}`)
	if got, want := cgroupsPaths(bundle), []string{"/thaw/k1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cgroupsPaths = %v, want %v", got, want)
	}
	if got := cgroupsPaths(t.TempDir()); got != nil {
		t.Fatalf("no spec: cgroupsPaths = %v, want none", got)
	}
}
