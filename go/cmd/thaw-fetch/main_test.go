package main

// The CLI's contract with control/images/fetcher.py: a plan on stdin, JSON
// lines on stdout, exit 0 / 1 (after an error line) / 2 (a plan it cannot
// execute). The engine itself is tested in go/internal/fetch.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func plan(t *testing.T, url string, raw []byte) (string, string) {
	dest := filepath.Join(t.TempDir(), "pages.img")
	if err := os.WriteFile(dest, make([]byte, len(raw)), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	return fmt.Sprintf(`{"version":2,"workers":2,"timeout_s":5,"direct_io":true,`+
		`"retry":{"max_attempts":0,"budget_s":0},"files":[%q],"objects":[{"url":%q,"name":"packs/p"}],`+
		`"ranges":[[0,0,%d,[[%q,%d,0,%d,"none",[[0,0]],""]]]]}`,
		dest, url, len(raw), hex.EncodeToString(sum[:]), len(raw), len(raw)), dest
}

func lines(t *testing.T, out string) []map[string]json.RawMessage {
	var msgs []map[string]json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

func TestPlanInLinesOut(t *testing.T) {
	raw := bytes.Repeat([]byte("thaw-fetch "), 3000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "p", time.Time{}, bytes.NewReader(raw))
	}))
	defer srv.Close()
	p, dest := plan(t, srv.URL+"/p", raw)
	var out, errw bytes.Buffer
	if rc := run(strings.NewReader(p), &out, &errw); rc != 0 {
		t.Fatalf("exit %d: %s %s", rc, out.String(), errw.String())
	}
	msgs := lines(t, out.String())
	last := msgs[len(msgs)-1]
	var st struct {
		Written int64 `json:"written_bytes"`
	}
	if err := json.Unmarshal(last["stats"], &st); err != nil || st.Written != int64(len(raw)) {
		t.Fatalf("last line %s: %v", out.String(), err)
	}
	if done := string(msgs[len(msgs)-2]["done"]); done != fmt.Sprint(len(raw)) {
		t.Fatalf("the last done line says %s, want the whole", done)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, raw) {
		t.Fatal("the file differs")
	}

	srv404 := httptest.NewServer(http.NotFoundHandler())
	defer srv404.Close()
	p, _ = plan(t, srv404.URL+"/p", raw)
	out.Reset()
	if rc := run(strings.NewReader(p), &out, &errw); rc != 1 {
		t.Fatalf("exit %d, want 1", rc)
	}
	msgs = lines(t, out.String())
	var e struct{ Kind, Store, Object, Detail string }
	if err := json.Unmarshal(msgs[len(msgs)-1]["error"], &e); err != nil || e.Kind != "store" ||
		e.Object != "packs/p" || e.Store != srv404.URL || !strings.HasPrefix(e.Detail, "HTTP 404") {
		t.Fatalf("%s: %v", out.String(), err)
	}

	for _, bad := range []string{`{"version":1}`, `{"version":2,"workers":1,"timeout_s":1,"attempts":3}`, `not json`} {
		out.Reset()
		errw.Reset()
		if rc := run(strings.NewReader(bad), &out, &errw); rc != 2 || out.Len() != 0 ||
			!strings.HasPrefix(errw.String(), "thaw-fetch: ") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", bad, rc, out.String(), errw.String())
		}
	}
}
