package standin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
)

// marker carries create's decision to start and delete of the same container.
type marker struct {
	ID     string `json:"id"`
	Root   string `json:"root"`
	Bundle string `json:"bundle"`
	Key    string `json:"workload_key"`
	// preparing | restore | adopt | restored | cold | cold-fallback | satisfied: the
	// words of thawd's record of the container, which adds restoring and released
	// (Twin: control/thawd/containers.py State).
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
	// How long start may wait for thawd's Restore: thawd's own settings bound
	// it (PrepareRestoreResponse.restore_timeout_ms), so no stand-in constant
	// can drift from them.
	RestoreTimeoutMs uint32 `json:"restore_timeout_ms,omitempty"`
	PidFile          string `json:"pid_file,omitempty"`
	// A pod's app container (CRI): restored by its own `runsc restore`, which
	// the stand-in runs with the shim's stdio (control/thawd/pods.py).
	Member    bool   `json:"member,omitempty"`
	ImagePath string `json:"image_path,omitempty"`
	// A pod's sandbox (pause) container (CRI).
	PodSandbox bool    `json:"pod_sandbox,omitempty"`
	Created    float64 `json:"created"`
	// The parked sandbox this container adopted (decision "adopt"): its runsc id.
	AdoptID string `json:"adopt_id,omitempty"`
	// Decision "satisfied": the pid its pid file names (its pod's sandbox process),
	// and whether the shim has started it (from then on it has exited).
	Pid     int  `json:"pid,omitempty"`
	Started bool `json:"started,omitempty"`
}

func (s *Standin) markerPath(id string) string {
	h := sha256.Sum256([]byte(s.a.GlobalValue("root")))
	return filepath.Join(s.cfg.StateDir, hex.EncodeToString(h[:6])+"-"+id+".json")
}

func (s *Standin) saveMarker(m *marker) error {
	if err := os.MkdirAll(s.cfg.StateDir, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(m)
	tmp := s.markerPath(m.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.markerPath(m.ID))
}

func (s *Standin) loadMarker(id string) *marker {
	b, err := os.ReadFile(s.markerPath(id))
	if err != nil {
		return nil
	}
	var m marker
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return &m
}

// commitRestored is the commit, and the last thing before a restored start
// exits 0: thawd keeps the restore once this process has exited with the
// marker saying so (Restore's standin_pid). A SIGKILL before this rename ends
// in thawd removing the restore (for a pod's container, its pod), matching
// the failed start containerd then reports. kill still routes a pod's container
// that has committed (kill).
func (s *Standin) commitRestored(m *marker) {
	m.Decision = "restored"
	s.saveMarker(m)
}
