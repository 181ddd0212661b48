package standin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Bounded logs (issue 33): standin.log and the shim's per-container logs used
// to grow forever. Settings: standin.log_max_bytes, standin.log_keep,
// standin.shim_logs_keep, standin.shim_log_max_bytes (control/config.py).
//
// standin.log: every stand-in process opens it to append a few lines; the one
// that finds it at or over the limit rotates it (standin.log -> .1 -> .2 ...,
// the oldest beyond log_keep removed) under an flock of standin.log.lock (never
// deleted), looking again under the lock so two processes rotate once. A log
// is then at most the limit plus the lines of processes that opened it just
// before the rotation.
//
// The shim's logs (<node.log_dir>/shim/runsc-shim-<id>.log, gVisor
// pkg/shim/v1/runsc/container.go: os.Create, written by the shim for the
// container's life): a running container's is never touched here (thawd frees
// its bytes before the last shim_log_max_bytes in place, control/thawd/shimlogs.py:
// the shim holds the file open without O_APPEND, so rename would bound nothing,
// and the stand-in runs only for create, start, kill and delete). At a container's
// delete the stand-in adds the id to shim/.deleted (one id a line), cuts that
// container's log to its last shim_log_max_bytes, and removes the logs of the
// oldest deleted ids beyond shim_logs_keep, all under an flock of
// shim/.deleted.lock.

// rotateLog rotates path if it is at least max bytes. Best effort: a log that
// cannot be rotated is appended to as before (logging never stops a container).
func rotateLog(path string, max int64, keep int) {
	if st, err := os.Stat(path); err != nil || st.Size() < max {
		return
	}
	unlock, err := flock(path + ".lock")
	if err != nil {
		return
	}
	defer unlock()
	if st, err := os.Stat(path); err != nil || st.Size() < max {
		return // another process rotated it meanwhile
	}
	os.Remove(fmt.Sprintf("%s.%d", path, keep))
	for i := keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", path, i), fmt.Sprintf("%s.%d", path, i+1))
	}
	os.Rename(path, path+".1")
}

// shimLogName is the shim's log of container id (runsccmd.FormatShimLogPath
// with a log_path ending in "/"; control/node/containerd_config.py writes that).
// Twin: control/thawd/shimlogs.py PATTERN.
func shimLogName(dir, id string) string {
	return filepath.Join(dir, "runsc-shim-"+id+".log")
}

// boundShimLogs records that container id was deleted and bounds the deleted
// containers' shim logs. What it removed, for the decision log.
func boundShimLogs(dir, id string, keep int, max int64) ([]string, error) {
	if dir == "" || id == "" || strings.ContainsAny(id, "/\n") {
		return nil, nil
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, nil // no shim logs on this node (the shim's log_path is elsewhere)
	}
	index := filepath.Join(dir, ".deleted")
	unlock, err := flock(index + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	ids := readLines(index)
	seen := map[string]bool{}
	var order []string
	for _, x := range append(ids, id) { // a retried delete keeps its first place
		if !seen[x] {
			seen[x] = true
			order = append(order, x)
		}
	}
	if err := cutToTail(shimLogName(dir, id), max); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var removed []string
	if len(order) > keep {
		for _, old := range order[:len(order)-keep] {
			p := shimLogName(dir, old)
			if err := os.Remove(p); err == nil {
				removed = append(removed, p)
			}
		}
		order = order[len(order)-keep:]
	}
	return removed, writeLinesAtomic(index, order)
}

// cutToTail keeps the last max bytes of path (from a line start), by rename:
// a shim still writing its last lines writes into the old file, which goes.
func cutToTail(path string, max int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= max {
		return err
	}
	if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReader(f)
	if _, err := r.ReadString('\n'); err != nil { // drop the partial first line
		return nil
	}
	tmp := path + ".cut"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "[thaw: the first %d bytes of this log were cut (standin.shim_log_max_bytes)]\n", st.Size()-max)
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func readLines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func writeLinesAtomic(path string, lines []string) error {
	tmp := path + ".tmp"
	body := strings.Join(lines, "\n")
	if body != "" {
		body += "\n"
	}
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// lockTimeout bounds the wait for a log's lock: the holder only renames files,
// so a longer wait means it hangs, and this process then leaves the logs be.
const lockTimeout = 2 * time.Second

// flock takes an exclusive lock of path within lockTimeout (the file is created,
// never deleted: deleting a lock file breaks mutual exclusion); the unlock.
func flock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(lockTimeout)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sortedShimLogs lists the shim logs in dir (tests).
func sortedShimLogs(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "runsc-shim-*.log"))
	sort.Strings(m)
	return m
}
