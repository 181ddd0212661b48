package standin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"thaw.dev/thaw/go/internal/version"
)

// decisionLog appends one JSON line per decision ("Every decision is logged").
// A log that cannot be opened is skipped: logging never stops a container.
type decisionLog struct{ f *os.File }

func openDecisionLog(path string, max int64, keep int) *decisionLog {
	if path == "" {
		return &decisionLog{}
	}
	os.MkdirAll(filepath.Dir(path), 0o755)
	if max > 0 {
		rotateLog(path, max, keep) // bounded: logrotate.go
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return &decisionLog{}
	}
	return &decisionLog{f: f}
}

func (l *decisionLog) Write(cmd string, m *marker, decision, reason string, t0 time.Time) {
	if l.f == nil {
		return
	}
	b, _ := json.Marshal(map[string]any{
		"time": time.Now().UTC().Format(time.RFC3339Nano), "cmd": cmd, "id": m.ID, "root": m.Root,
		"workload_key": m.Key, "decision": decision, "reason": reason,
		"ms": float64(time.Since(t0).Microseconds()) / 1000, "thaw": version.Version,
	})
	l.f.Write(append(b, '\n'))
}

func (l *decisionLog) Close() {
	if l.f != nil {
		l.f.Close()
	}
}
