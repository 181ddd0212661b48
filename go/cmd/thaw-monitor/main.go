// Command thaw-monitor watches one sandbox that `thaw run` or `thaw restore`
// started: it copies the workload's stdout and stderr (a pipe on its stdin)
// into a log file of bounded size, and records the workload's exit status,
// so that `thaw logs` and `thaw ps` can tell what happened after the thaw
// command that started the sandbox has exited. It is the CLI door's conmon
// (CRI-O's container monitor does the same two jobs for runc); under
// containerd the shim does both.
//
//	thaw-monitor -log FILE -max-bytes N -exit-file FILE [-start-fd 3] -- RUNSC [FLAGS] wait ID
//
// stdin is the read end of the pipe that runsc create/restore gave the
// workload as its stdout and stderr. The log file is rotated to FILE.1 (one
// old file kept) whenever the next write would make it larger than
// -max-bytes, so the two files never hold more than 2 x max-bytes: a
// workload that prints forever cannot fill the disk.
//
// The command after the flags is `runsc wait`, started once the caller writes
// one byte on -start-fd (after `runsc start` or `runsc restore` returned: runsc
// refuses to wait for a container that is not started). Its JSON answer
// {"id":..,"exitStatus":N} becomes the exit file, written atomically
// (temporary file, fsync, rename):
//
//	{"exit_status": N, "finished_at": UNIX_SECONDS, "error": ""}
//
// exit_status is null (and error says why) when runsc could not tell it
// (the sandbox was killed from outside before `runsc wait` asked). When the
// start pipe closes without a byte (the thaw command failed or died before
// the workload started), no runsc wait runs and no exit file is written;
// the monitor ends when the log pipe closes. Twin of the exit file's reader:
// control/lifecycle/logs.py (EXIT_FILE, read_exit).
//
// Exit status: 0 after the pipe closed, 2 for bad arguments.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// After runsc wait returned, how long the pump may still drain the pipe: the
// sandbox's copies of the write end close when it exits, but a process that
// escaped it (none should) must not keep the monitor forever.
const drainAfterExit = 5 * time.Second

type config struct {
	logPath  string
	maxBytes int64
	exitPath string
	wait     []string
}

func main() {
	logPath := flag.String("log", "", "the workload's log file (rotated to FILE.1)")
	maxBytes := flag.Int64("max-bytes", 10<<20, "largest size of the log file before it is rotated")
	exitPath := flag.String("exit-file", "", "where the exit status is written (JSON, atomically)")
	startFD := flag.Int("start-fd", 3, "a byte on this descriptor starts the wait command")
	flag.Parse()
	cfg := config{logPath: *logPath, maxBytes: *maxBytes, exitPath: *exitPath, wait: flag.Args()}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "thaw-monitor:", err)
		os.Exit(2)
	}
	// The monitor outlives the thaw command that started it (its own session);
	// a terminal hang-up or a broken stderr must not end it.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	os.Exit(run(cfg, os.Stdin, os.NewFile(uintptr(*startFD), "start")))
}

func (c config) validate() error {
	switch {
	case c.logPath == "":
		return fmt.Errorf("-log is required")
	case c.exitPath == "":
		return fmt.Errorf("-exit-file is required")
	case c.maxBytes < minMaxBytes:
		return fmt.Errorf("-max-bytes %d is below %d", c.maxBytes, minMaxBytes)
	case len(c.wait) == 0:
		return fmt.Errorf("usage: thaw-monitor -log FILE -max-bytes N -exit-file FILE -- RUNSC [FLAGS] wait ID")
	}
	return nil
}

// run pumps `in` into the log until it closes; once a byte arrives on
// `start`, it runs the wait command and writes the exit file.
func run(c config, in *os.File, start *os.File) int {
	w, err := openRotating(c.logPath, c.maxBytes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-monitor:", err)
		return 1
	}
	defer w.Close()
	pumped := make(chan error, 1)
	go func() { pumped <- pump(in, w) }()

	waited := make(chan struct{})
	go func() {
		defer close(waited)
		if start == nil || !startSignalled(start) {
			return
		}
		status, werr := waitFor(c.wait)
		if err := writeExit(c.exitPath, status, werr, time.Now()); err != nil {
			fmt.Fprintln(os.Stderr, "thaw-monitor: exit file:", err)
		}
	}()

	select {
	case err = <-pumped:
		<-waited // the sandbox is gone or never started: runsc wait returns now
	case <-waited:
		select {
		case err = <-pumped:
		case <-time.After(drainAfterExit):
			fmt.Fprintln(os.Stderr, "thaw-monitor: the log pipe is still open after the workload exited; stopping")
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-monitor: log:", err)
		return 1
	}
	return 0
}

// startSignalled reports whether the caller wrote a byte before closing.
func startSignalled(f *os.File) bool {
	defer f.Close()
	var b [1]byte
	n, _ := f.Read(b[:])
	return n == 1
}
