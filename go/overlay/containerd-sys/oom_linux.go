// thaw's replacement for containerd's pkg/sys/oom_linux.go in the build of
// gVisor's containerd shim (ci/build-go.sh applies it with `go build -overlay`).
//
// Why: the shim's bootstrap sets the daemonized shim's oom_score_adj to -999
// (gvisor pkg/shim/v1/manager.go, oomScoreMax) and refuses to start when that
// write fails. Lowering oom_score_adj needs CAP_SYS_RESOURCE; containerd's own
// SetOOMScore ignores the EACCES only for non-root or user-namespaced callers,
// so a root without CAP_SYS_RESOURCE (a container or VM that drops it, as
// thaw's CI machine does) cannot start any runsc container. This version
// behaves the same whenever the write succeeds, and when it is refused for
// lack of CAP_SYS_RESOURCE it leaves the score as it is (the shim stays as
// killable as its parent) instead of failing the container. See
// docs/gvisor-notes.md, "The shim and CAP_SYS_RESOURCE".
package sys

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

const (
	// OOMScoreAdjMin is the kernel's OOM_SCORE_ADJ_MIN (include/uapi/linux/oom.h).
	OOMScoreAdjMin = -1000
	// OOMScoreAdjMax is the kernel's OOM_SCORE_ADJ_MAX.
	OOMScoreAdjMax = 1000
)

const capSysResource = 24 // include/uapi/linux/capability.h

// AdjustOOMScore clamps score into the kernel's range and sets it for pid.
func AdjustOOMScore(pid, score int) error {
	score = min(max(score, OOMScoreAdjMin), OOMScoreAdjMax)
	return SetOOMScore(pid, score)
}

// SetOOMScore writes pid's oom_score_adj.
func SetOOMScore(pid, score int) error {
	if score < OOMScoreAdjMin || score > OOMScoreAdjMax {
		return fmt.Errorf("OOM score %d out of range [%d, %d]", score, OOMScoreAdjMin, OOMScoreAdjMax)
	}
	path := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	err := os.WriteFile(path, []byte(strconv.Itoa(score)), 0)
	if err == nil || !os.IsPermission(err) {
		return err
	}
	if os.Geteuid() != 0 || !hasCapability(capSysResource) {
		// Silently: containerd parses the combined output of `shim start`
		// as the bootstrap parameters, so nothing may be printed here.
		return nil
	}
	return err
}

// GetOOMScoreAdj reads pid's oom_score_adj.
func GetOOMScoreAdj(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// hasCapability reads CapEff of this process.
func hasCapability(bit uint) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<bit) != 0
		}
	}
	return false
}
