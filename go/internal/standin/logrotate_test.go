package standin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTheDecisionLogRotatesOnceAtItsLimitAndKeepsN(t *testing.T) {
	p := filepath.Join(t.TempDir(), "standin.log")
	for round := 0; round < 5; round++ {
		os.WriteFile(p, []byte(strings.Repeat("x", 100)+fmt.Sprint(round)), 0o644)
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ { // eight stand-ins open it at once: one rotation
			wg.Add(1)
			go func() { defer wg.Done(); rotateLog(p, 100, 3) }()
		}
		wg.Wait()
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("round %d: %s still there", round, p)
		}
	}
	for i, want := range map[int]string{1: "4", 2: "3", 3: "2"} {
		b, err := os.ReadFile(fmt.Sprintf("%s.%d", p, i))
		if err != nil || !strings.HasSuffix(string(b), want) {
			t.Fatalf(".%d: %q %v", i, b, err)
		}
	}
	if _, err := os.Stat(p + ".4"); !os.IsNotExist(err) {
		t.Fatal("more than keep rotated logs")
	}
	os.WriteFile(p, []byte("short"), 0o644)
	rotateLog(p, 100, 3)
	if b, _ := os.ReadFile(p); string(b) != "short" {
		t.Fatal("a log under its limit was rotated")
	}
	l := openDecisionLog(p, 100, 3)
	l.Write("create", &marker{ID: "c1"}, "cold", "not-opted-in", time.Now())
	l.Close()
	if b, _ := os.ReadFile(p); !strings.Contains(string(b), `"decision":"cold"`) {
		t.Fatalf("%q", b)
	}
}

func TestDeletedContainersShimLogsAreBoundedAndRunningOnesUntouched(t *testing.T) {
	dir := t.TempDir()
	write := func(id string, n int) {
		os.WriteFile(shimLogName(dir, id), []byte(strings.Repeat("line of the shim\n", n)), 0o644)
	}
	write("running", 10000) // never deleted: never touched, whatever its size
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("c%d", i)
		write(id, 10)
		if _, err := boundShimLogs(dir, id, 3, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := boundShimLogs(dir, "c4", 3, 1<<20); err != nil { // a retried delete
		t.Fatal(err)
	}
	var got []string
	for _, p := range sortedShimLogs(dir) {
		got = append(got, filepath.Base(p))
	}
	want := []string{"runsc-shim-c2.log", "runsc-shim-c3.log", "runsc-shim-c4.log", "runsc-shim-running.log"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	if ids := readLines(filepath.Join(dir, ".deleted")); fmt.Sprint(ids) != "[c2 c3 c4]" {
		t.Fatalf("index %v", ids)
	}
	write("big", 100000) // 1.7 MB
	if _, err := boundShimLogs(dir, "big", 3, 64<<10); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(shimLogName(dir, "big"))
	if len(b) > 64<<10+200 || !strings.HasPrefix(string(b), "[thaw: the first ") ||
		!strings.HasSuffix(string(b), "line of the shim\n") {
		t.Fatalf("cut to %d bytes: %q", len(b), b[:80])
	}
	if st, _ := os.Stat(shimLogName(dir, "running")); st.Size() != int64(len("line of the shim\n"))*10000 {
		t.Fatal("a running container's log was cut")
	}
	if r, err := boundShimLogs(filepath.Join(dir, "absent"), "x", 3, 1<<20); r != nil || err != nil {
		t.Fatal("no shim log directory is not an error")
	}
}
