package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sizes(t *testing.T, path string) (int64, int64) {
	t.Helper()
	var a, b int64
	if st, err := os.Stat(path); err == nil {
		a = st.Size()
	}
	if st, err := os.Stat(path + ".1"); err == nil {
		b = st.Size()
	}
	return a, b
}

func TestRotatingNeverExceedsTheBoundAndKeepsLinesWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workload.log")
	w, err := openRotating(path, minMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 99) + "\n") // 100 bytes
	for i := 0; i < 5000; i++ {                   // 500 kB through a 64 KiB bound
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		if a, b := sizes(t, path); a > minMaxBytes || b > minMaxBytes {
			t.Fatalf("after %d lines: %d and %d bytes, bound %d", i, a, b, minMaxBytes)
		}
	}
	w.Close()
	for _, p := range []string{path, path + ".1"} {
		data, _ := os.ReadFile(p)
		if len(data) == 0 || len(data)%100 != 0 || data[len(data)-1] != '\n' {
			t.Fatalf("%s: %d bytes, not whole lines", p, len(data))
		}
	}
}

func TestALineLongerThanTheBoundIsCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workload.log")
	w, _ := openRotating(path, minMaxBytes)
	big := bytes.Repeat([]byte("y"), 3*minMaxBytes)
	if n, err := w.Write(big); err != nil || n != len(big) {
		t.Fatalf("wrote %d, %v", n, err)
	}
	w.Close()
	if a, b := sizes(t, path); a > minMaxBytes || b != minMaxBytes {
		t.Fatalf("sizes %d, %d", a, b)
	}
}

func TestRunPumpsWaitsAndWritesTheExitFile(t *testing.T) {
	dir := t.TempDir()
	logR, logW, _ := os.Pipe()
	startR, startW, _ := os.Pipe()
	c := config{logPath: filepath.Join(dir, "workload.log"), maxBytes: minMaxBytes,
		exitPath: filepath.Join(dir, "exit.json"),
		wait:     []string{"/bin/sh", "-c", `echo '{"id":"web+","exitStatus":3}'`}}
	done := make(chan int)
	go func() { done <- run(c, logR, startR) }()
	logW.Write([]byte("hello\n"))
	startW.Write([]byte{1})
	startW.Close()
	logW.Close()
	if rc := <-done; rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	if data, _ := os.ReadFile(c.logPath); string(data) != "hello\n" {
		t.Fatalf("log %q", data)
	}
	var rec exitRecord
	data, _ := os.ReadFile(c.exitPath)
	if err := json.Unmarshal(data, &rec); err != nil || rec.ExitStatus == nil || *rec.ExitStatus != 3 || rec.Error != "" {
		t.Fatalf("exit file %q", data)
	}
	if rec.FinishedAt < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("finished_at %v", rec.FinishedAt)
	}
}

func TestAFailedWaitRecordsWhyAndNoStatus(t *testing.T) {
	dir := t.TempDir()
	logR, logW, _ := os.Pipe()
	startR, startW, _ := os.Pipe()
	c := config{logPath: filepath.Join(dir, "l"), maxBytes: minMaxBytes, exitPath: filepath.Join(dir, "exit.json"),
		wait: []string{"/bin/sh", "-c", "echo 'sandbox no longer running' >&2; exit 128"}}
	startW.Write([]byte{1})
	startW.Close()
	logW.Close()
	if rc := run(c, logR, startR); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	var rec exitRecord
	data, _ := os.ReadFile(c.exitPath)
	if err := json.Unmarshal(data, &rec); err != nil || rec.ExitStatus != nil ||
		!strings.Contains(rec.Error, "sandbox no longer running") {
		t.Fatalf("exit file %q", data)
	}
}

func TestNoStartByteMeansNoWaitAndNoExitFile(t *testing.T) {
	dir := t.TempDir()
	logR, logW, _ := os.Pipe()
	startR, startW, _ := os.Pipe()
	marker := filepath.Join(dir, "waited")
	c := config{logPath: filepath.Join(dir, "l"), maxBytes: minMaxBytes, exitPath: filepath.Join(dir, "exit.json"),
		wait: []string{"/bin/sh", "-c", "touch " + marker}}
	startW.Close() // the thaw command failed before the workload started
	logW.Write([]byte("runsc: create failed\n"))
	logW.Close()
	if rc := run(c, logR, startR); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	for _, p := range []string{marker, c.exitPath} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s exists", p)
		}
	}
}

func TestAPipeHeldOpenAfterTheExitDoesNotKeepTheMonitor(t *testing.T) {
	if testing.Short() {
		t.Skip("waits drainAfterExit")
	}
	dir := t.TempDir()
	logR, logW, _ := os.Pipe()
	defer logW.Close()
	startR, startW, _ := os.Pipe()
	c := config{logPath: filepath.Join(dir, "l"), maxBytes: minMaxBytes, exitPath: filepath.Join(dir, "exit.json"),
		wait: []string{"/bin/sh", "-c", `echo '{"exitStatus":0}'`}}
	startW.Write([]byte{1})
	startW.Close()
	t0 := time.Now()
	run(c, logR, startR)
	if d := time.Since(t0); d < drainAfterExit || d > drainAfterExit+3*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

func TestBadArguments(t *testing.T) {
	for _, c := range []config{
		{exitPath: "e", maxBytes: minMaxBytes, wait: []string{"x"}},
		{logPath: "l", maxBytes: minMaxBytes, wait: []string{"x"}},
		{logPath: "l", exitPath: "e", maxBytes: 10, wait: []string{"x"}},
		{logPath: "l", exitPath: "e", maxBytes: minMaxBytes},
	} {
		if c.validate() == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
}
