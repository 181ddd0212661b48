package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// waitFor runs the wait command (`runsc ... wait ID`) and returns the exit
// status it printed ({"id":..,"exitStatus":N}; runsc reports a workload
// killed by signal S as 128+S, runsc/cmd/wait.go exitStatus).
func waitFor(argv []string) (*int, error) {
	// The wait dies with the monitor (PR_SET_PDEATHSIG applies to the thread
	// that started it, so that thread stays ours until the wait returns).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(argv[0], argv[1:]...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, lastLine(errOut.String()))
	}
	var res struct {
		ExitStatus *int `json:"exitStatus"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &res); err != nil || res.ExitStatus == nil {
		return nil, fmt.Errorf("%s printed no exit status: %q", strings.Join(argv, " "), out.String())
	}
	return res.ExitStatus, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// exitRecord is the exit file. Twin: control/lifecycle/logs.py read_exit.
type exitRecord struct {
	ExitStatus *int    `json:"exit_status"`
	FinishedAt float64 `json:"finished_at"`
	Error      string  `json:"error"`
}

// writeExit writes the exit file atomically: readers see all of it or none.
func writeExit(path string, status *int, werr error, at time.Time) error {
	rec := exitRecord{ExitStatus: status, FinishedAt: float64(at.UnixNano()) / 1e9}
	if werr != nil {
		rec.Error = werr.Error()
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
