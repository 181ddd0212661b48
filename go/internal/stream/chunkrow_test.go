package stream

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChunkRowsParseAsTheManifestWritesThem(t *testing.T) {
	sum, b3 := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	var c chunkRef
	row := fmt.Sprintf(`[ "%s", 262144, "packs/x", 10, 200, "zstd", "%s" ]`, sum, b3)
	if err := json.Unmarshal([]byte(row), &c); err != nil || c.n != 262144 || !c.hasB3 || c.sum[0] != 0xab || c.b3[31] != 0xcd {
		t.Fatalf("%s: %+v %v", row, c, err)
	}
	c = chunkRef{}
	if err := json.Unmarshal([]byte(fmt.Sprintf(`["%s",7]`, sum)), &c); err != nil || c.n != 7 || c.hasB3 {
		t.Fatalf("two fields: %+v %v", c, err)
	}
	for _, bad := range []string{
		`[]`, `["` + sum + `"]`, `["abc", 1]`, `["` + strings.Repeat("zz", 32) + `", 1]`,
		`["` + sum + `", 0]`, `["` + sum + `", -1]`, `["` + sum + `", 1.5]`, `["` + sum + `", "1"]`,
		fmt.Sprintf(`["%s", %d]`, sum, fetch64MiB+1), `["` + sum + `", [1]]`, `["\u0061` + sum[1:] + `", 1]`,
		fmt.Sprintf(`["%s",1,"p",0,1,"zstd","xyz"]`, sum), `{"a": 1}`,
	} {
		if err := json.Unmarshal([]byte(bad), &chunkRef{}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// A ~3B image's manifest (24 000 rows) loads in well under the 0.16 s the generic decode took there.
func TestChunkTablesOfALargeManifestLoadQuickly(t *testing.T) {
	n := 24485
	var sb strings.Builder
	fmt.Fprintf(&sb, `{"files":[{"name":"pages.img","size":%d,"chunks":[`, n*262144)
	for i := 0; i < n; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `["%064x",262144,"packs/%064x",%d,200000,"zstd","%064x"]`, i, i, i*200000, i)
	}
	sb.WriteString(`]}]}`)
	p := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(p, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	tables, err := loadChunkTables(p, []GoferFile{{Name: "pages.img", Size: int64(n) * 262144}})
	took := time.Since(t0)
	if err != nil || len(tables[0].sums) != n || tables[0].b3 == nil {
		t.Fatalf("%v", err)
	}
	t.Logf("%d rows in %v", n, took)
}
