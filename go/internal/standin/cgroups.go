package standin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A `runsc create` killed inside its cgroup set-up (runsc/cgroup/cgroup.go
// cgroupV1.Install: mkdir of each controller's directory, then its values;
// the clean-up that undoes a failed Install never runs under SIGKILL) leaves
// the container's cgroup directories behind, the cpuset one with empty
// cpuset.cpus and cpuset.mems. Install takes a directory that exists for one
// the caller made ("Using pre-created cgroup") and writes nothing into it, so
// the next create of the same id fails to join it: `write
// /sys/fs/cgroup/cpuset/<path>/cgroup.procs: no space left on device`. Found
// by tests/integration/faults/test_standin_kills.py (CI of stop 24). delete
// removes them when runsc has no state for the container, as it kills the
// sandbox processes of such a create (orphans.go): then nothing of runsc's
// owns them.

// cgroupRmdirWait bounds how long delete retries a directory the kernel says
// is busy: the processes reapOrphans just killed leave it as they exit (runsc
// retries its own Uninstall for 5 s for the same reason).
const cgroupRmdirWait = 2 * time.Second

// cgroupFS is where the host mounts its cgroups, as runsc assumes
// (runsc/cgroup/cgroup.go cgroupRoot).
const cgroupFS = "/sys/fs/cgroup"

// cgroupsPaths reads linux.cgroupsPath from the bundle's config.json and, if
// the stand-in put thawd's restore spec in its place, from the original: the
// paths a killed create of this container may have made.
func cgroupsPaths(bundle string) []string {
	var out []string
	for _, name := range []string{"config.json", origConfigName} {
		b, err := os.ReadFile(filepath.Join(bundle, name))
		if err != nil {
			continue
		}
		var spec struct {
			Linux *struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		}
		if json.Unmarshal(b, &spec) != nil || spec.Linux == nil || spec.Linux.CgroupsPath == "" {
			continue
		}
		if !contains(out, spec.Linux.CgroupsPath) {
			out = append(out, spec.Linux.CgroupsPath)
		}
	}
	return out
}

// cgroupDirs lists the directories runsc's Install makes for cgroupsPath
// under the cgroup filesystem at root (/sys/fs/cgroup) that exist: the one
// directory on a cgroup v2 host, else one per v1 hierarchy (twin:
// runsc_hooks/runsc.py cgroup_dirs, for thawd's parked sandboxes). Only absolute
// cgroupfs paths: a relative one hangs below the cgroup of the runsc process
// that made it (gone, so unknown), and a systemd one (slice:prefix:name) is
// a unit systemd removes.
func cgroupDirs(root, cgroupsPath string) []string {
	if !filepath.IsAbs(cgroupsPath) || strings.Contains(cgroupsPath, ":") {
		return nil
	}
	clean := filepath.Clean(cgroupsPath)
	if clean == "/" {
		return nil
	}
	var cands []string
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		cands = []string{filepath.Join(root, clean)}
	} else {
		entries, err := os.ReadDir(root)
		if err != nil {
			return nil
		}
		for _, e := range entries {
			// Co-mounted controllers (cpu,cpuacct) have symlinks too (cpu ->
			// cpu,cpuacct): the directory is listed once, by its real name.
			if e.IsDir() {
				cands = append(cands, filepath.Join(root, e.Name(), clean))
			}
		}
	}
	var out []string
	for _, d := range cands {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// removeCgroupDirs removes each directory with rmdir, which the kernel
// allows only for a cgroup without processes or children: one in use stays.
// A busy one is retried until wait has passed. It returns the directories
// removed and the errors of those that stayed.
func removeCgroupDirs(dirs []string, wait time.Duration) (removed []string, errs []error) {
	end := time.Now().Add(wait)
	for _, d := range dirs {
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				if err == nil {
					removed = append(removed, d)
				}
				break
			}
			if errors.Is(err, syscall.EBUSY) && time.Now().Before(end) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			errs = append(errs, &os.PathError{Op: "rmdir", Path: d, Err: err})
			break
		}
	}
	return removed, errs
}
