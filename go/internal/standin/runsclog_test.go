package standin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunscErrorSinceReadsTheLastErrorOfThisRun(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log.json")
	// An earlier command's error, then this run's: runsc writes records with no
	// newline between them (util.Errorf), the stand-in's own fail with one.
	earlier := `{"msg":"an earlier command's error","level":"error","time":"2026-12-04T20:34:41Z"}`
	if err := os.WriteFile(p, []byte(earlier), 0o644); err != nil {
		t.Fatal(err)
	}
	off := runscLogSize(p)
	if got := runscErrorSince(p, off); got != "" {
		t.Fatalf("nothing written since: got %q", got)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"msg":"a warning","level":"warning","time":"2026-12-04T20:34:42Z"}` +
		`{"msg":"starting container: urpc method \"containerManager.RestoreSubcontainer\" failed: EOF","level":"error","time":"2026-12-04T20:34:42Z"}` + "\n")
	f.Close()
	want := `starting container: urpc method "containerManager.RestoreSubcontainer" failed: EOF`
	if got := runscErrorSince(p, off); got != want {
		t.Fatalf("runscErrorSince = %q, want %q", got, want)
	}
	if got := runscErrorSince(p, 0); got != want {
		t.Fatalf("from the start: %q, want the last error %q", got, want)
	}
}

func TestRunscErrorSinceWithoutALog(t *testing.T) {
	if got := runscErrorSince("", 0); got != "" {
		t.Fatalf("no --log: %q", got)
	}
	missing := filepath.Join(t.TempDir(), "none.json")
	if runscLogSize(missing) != 0 || runscErrorSince(missing, 0) != "" {
		t.Fatal("a missing log has size 0 and no error")
	}
	p := filepath.Join(t.TempDir(), "text.log")
	os.WriteFile(p, []byte("not json at all\n"), 0o644)
	if got := runscErrorSince(p, 0); got != "" {
		t.Fatalf("text log: %q", got)
	}
	long := filepath.Join(t.TempDir(), "long.json")
	os.WriteFile(long, []byte(`{"msg":"`+strings.Repeat("x", 3000)+`","level":"error"}`), 0o644)
	if got := runscErrorSince(long, 0); len(got) != maxRunscMessage+3 {
		t.Fatalf("long message kept at %d characters", len(got))
	}
}
