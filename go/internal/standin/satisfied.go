package standin

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"thaw.dev/thaw/go/internal/runscargv"
)

// An init container of a pod being restored (thawd's decision SATISFIED,
// control/thawd/pods.py): the kubelet runs a new pod's init containers before
// any app container (kuberuntime SyncPod), the pod's image was saved after
// they had ended (containerd's CRI deletes an exited container's task, so no
// image holds one), and at the pin runsc cannot run a container in a sandbox
// that is restoring (boot/controller.go StartSubcontainer turns a start there
// into a restore). So the stand-in runs nothing for it: create writes the
// shim's pid file (the pod's sandbox process) and the alias
// runscargv.Satisfied, and every later call for the id comes here (thaw-runsc
// sends it) and is answered as for a container that exited 0 as soon as it
// started: state says created until its start and stopped after it, wait says
// exit status 0, delete releases it.

// annotationSandboxID names a pod app container's sandbox (CRI; twin:
// control/lifecycle/pod.py CRI_SANDBOX_ID).
const annotationSandboxID = "io.kubernetes.cri.sandbox-id"

// satisfy is create of such a container: no runsc create runs.
func (s *Standin) satisfy(m *marker, ann map[string]string, t0 time.Time) int {
	pid, err := s.sandboxPid(ann[annotationSandboxID])
	if err == nil && m.PidFile != "" {
		err = writeFileAtomic(m.PidFile, []byte(fmt.Sprint(pid)), 0o644)
	}
	if err == nil {
		m.Pid = pid
		err = s.saveMarker(m)
	}
	if err == nil {
		err = s.writeAlias(m.ID, runscargv.Satisfied)
	}
	if err != nil {
		// Nothing ran and nothing was promised: runsc's own create (it fails in a
		// restoring sandbox, and thawd's pod then starts again, cold).
		s.log.Write("create", m, "satisfy-failed", err.Error(), t0)
		s.removeAlias(m.ID)
		return s.execRunsc(s.argv[1:])
	}
	return 0
}

// sandboxPid is the pid of pod sandbox sid's sandbox process (runsc state).
func (s *Standin) sandboxPid(sid string) (int, error) {
	if sid == "" {
		return 0, fmt.Errorf("no %s annotation", annotationSandboxID)
	}
	out, err := s.runscCmd("state", sid).Output()
	if err != nil {
		return 0, fmt.Errorf("runsc state %s: %w", sid, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		return 0, fmt.Errorf("runsc state %s: no pid in %q", sid, out)
	}
	return st.Pid, nil
}

// satisfiedCall answers the shim's runsc call for a satisfied container id.
func (s *Standin) satisfiedCall(id string) int {
	m := s.loadMarker(id)
	if m == nil {
		m = &marker{ID: id, Root: s.a.Root(), Decision: "satisfied"}
	}
	switch s.a.Command {
	case "create", "kill":
		return 0
	case "start":
		// From here on it has exited: gVisor's shim takes a container that reads
		// "stopped" before its start for one whose start failed (proc/init_state.go
		// createdState.State), and never starts it.
		m.Started = true
		if err := s.saveMarker(m); err != nil {
			return s.fail(fmt.Sprintf("thaw: start of %s: %v", id, err))
		}
		s.log.Write("start", m, "satisfied", "answered as exited 0: nothing runs", time.Now())
		return 0
	case "wait":
		return printJSON(map[string]any{"id": id, "exitStatus": 0})
	case "state":
		status := "created"
		if m.Started {
			status = "stopped"
		}
		return printJSON(map[string]any{"ociVersion": "1.0.2", "id": id, "pid": m.Pid, "status": status,
			"bundle": m.Bundle, "created": time.Unix(0, int64(m.Created*1e9)).UTC().Format(time.RFC3339Nano)})
	case "events":
		return printJSON(map[string]any{"type": "stats", "id": id, "data": map[string]any{}})
	case "ps":
		return printJSON([]int{})
	case "delete":
		t0 := time.Now()
		s.removeAlias(id)
		s.release(id, m.Root)
		os.Remove(s.markerPath(id))
		s.log.Write("delete", m, "released", "an init container answered as done", t0)
		return 0
	default:
		return s.fail(fmt.Sprintf("thaw: container %s has exited (an init container of a restored pod, "+
			"answered as done): %s is not possible", id, s.a.Command))
	}
}

// target is the container id the call names (kill's is not its last word).
func (s *Standin) target() string {
	if s.a.Command == "kill" {
		return s.a.KillContainerID()
	}
	if i := s.a.TargetIndex(); i >= 0 {
		return s.a.Args[i]
	}
	return ""
}

func printJSON(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 128
	}
	os.Stdout.Write(append(b, '\n'))
	return 0
}

// writeAlias points <root>/<AliasPrefix><id> at target, atomically.
func (s *Standin) writeAlias(id, target string) error {
	link := s.aliasPath(id)
	os.Remove(link + ".tmp")
	if err := os.Symlink(target, link+".tmp"); err != nil {
		return fmt.Errorf("alias %s: %w", link, err)
	}
	if err := os.Rename(link+".tmp", link); err != nil {
		os.Remove(link + ".tmp")
		return fmt.Errorf("alias %s: %w", link, err)
	}
	return nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".thaw-tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
