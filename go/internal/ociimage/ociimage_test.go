package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

func str(s string) *string { return &s }

// fixture: a host tree and a rootfs tar the spec below uses.
func fixture(t *testing.T) (dir string, spec *Spec) {
	t.Helper()
	dir = t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "runsc"), []byte("runsc binary"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "secret"), []byte("0600 file"), 0o600))
	tree := filepath.Join(dir, "pkg")
	must(t, os.MkdirAll(filepath.Join(tree, "sub"), 0o750))
	must(t, os.WriteFile(filepath.Join(tree, "sub", "mod.py"), []byte("print(1)\n"), 0o644))
	must(t, os.Symlink("sub/mod.py", filepath.Join(tree, "alias.py")))

	// A rootfs tar as mmdebstrap writes one: "./" names, a root entry, a hard link.
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./usr/bin/python3.11", Typeflag: tar.TypeReg, Mode: 0o755, Size: 6, Uid: 0},
		{Name: "./usr/bin/python3", Typeflag: tar.TypeLink, Linkname: "./usr/bin/python3.11"},
		{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./etc/shadow", Typeflag: tar.TypeReg, Mode: 0o640, Gid: 42, Size: 0},
	} {
		must(t, tw.WriteHeader(h))
		if h.Size > 0 {
			_, err := tw.Write([]byte("python"))
			must(t, err)
		}
	}
	must(t, tw.Close())
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(raw.Bytes())
	must(t, err)
	must(t, zw.Close())
	must(t, os.WriteFile(filepath.Join(dir, "rootfs.tar.gz"), gz.Bytes(), 0o644))

	spec = &Spec{
		Ref:    "ghcr.io/thaw-dev/thaw:test",
		Epoch:  1700000000,
		Config: v1.ImageConfig{Cmd: []string{"thaw", "serve"}, Env: []string{"PATH=/usr/bin"}},
		Layers: []Layer{
			{Comment: "base", Tar: filepath.Join(dir, "rootfs.tar.gz")},
			{Comment: "thaw", Entries: []Entry{
				{Path: "/opt/thaw-dist/bin/runsc", Src: filepath.Join(dir, "runsc")},
				{Path: "/opt/thaw-dist/bin/secret", Src: filepath.Join(dir, "secret"), Mode: "0640"},
				{Path: "/usr/lib/thaw", Src: tree},
				{Path: "/etc/thaw.conf", Data: str("x = 1\n")},
				{Path: "/tmp", Dir: true, Mode: "1777"},
				{Path: "/usr/local/bin/thaw", Link: "/usr/lib/thaw/alias.py"},
			}},
		},
	}
	return dir, spec
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// readArchive: every file of an OCI archive by name.
func readArchive(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		must(t, err)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			must(t, err)
			out[h.Name] = b
		}
	}
}

func blob(t *testing.T, files map[string][]byte, d string) []byte {
	t.Helper()
	name := "blobs/sha256/" + strings.TrimPrefix(d, "sha256:")
	b, ok := files[name]
	if !ok {
		t.Fatalf("%s missing from the archive", name)
	}
	sum := sha256.Sum256(b)
	if "sha256:"+hex.EncodeToString(sum[:]) != d {
		t.Fatalf("%s: content does not match its digest", name)
	}
	return b
}

type entry struct {
	typ      byte
	mode     int64
	link     string
	gid      int
	content  string
	mtimeSec int64
}

func layerEntries(t *testing.T, gzBlob []byte, wantDiffID string) ([]string, map[string]entry) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gzBlob))
	must(t, err)
	raw, err := io.ReadAll(zr)
	must(t, err)
	sum := sha256.Sum256(raw)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != wantDiffID {
		t.Fatalf("diff_id %s, the uncompressed layer hashes to %s", wantDiffID, got)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	var names []string
	m := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, m
		}
		must(t, err)
		b, err := io.ReadAll(tr)
		must(t, err)
		names = append(names, h.Name)
		m[h.Name] = entry{h.Typeflag, h.Mode, h.Linkname, h.Gid, string(b), h.ModTime.Unix()}
	}
}

func TestWriteArchive(t *testing.T) {
	dir, spec := fixture(t)
	out := filepath.Join(dir, "image.tar")
	res, err := Write(spec, out, "")
	must(t, err)
	files := readArchive(t, out)

	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", files["oci-layout"])
	}
	var index v1.Index
	must(t, json.Unmarshal(files["index.json"], &index))
	if len(index.Manifests) != 1 || string(index.Manifests[0].Digest) != string(res.Manifest) {
		t.Fatalf("index %+v, result manifest %s", index, res.Manifest)
	}
	ann := index.Manifests[0].Annotations
	if ann["io.containerd.image.name"] != spec.Ref || ann[v1.AnnotationRefName] != spec.Ref {
		t.Errorf("index annotations %v", ann)
	}
	var man v1.Manifest
	must(t, json.Unmarshal(blob(t, files, string(res.Manifest)), &man))
	var cfg v1.Image
	must(t, json.Unmarshal(blob(t, files, string(man.Config.Digest)), &cfg))
	if strings.Join(cfg.Config.Cmd, " ") != "thaw serve" || cfg.Architecture != "amd64" || cfg.OS != "linux" {
		t.Errorf("config %+v", cfg)
	}
	if cfg.Created.Unix() != spec.Epoch || len(cfg.History) != 2 || cfg.History[1].CreatedBy != "thaw" {
		t.Errorf("created %v, history %+v", cfg.Created, cfg.History)
	}
	if len(man.Layers) != 2 || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("%d layers, %d diff_ids", len(man.Layers), len(cfg.RootFS.DiffIDs))
	}

	// The base layer: names made relative, the root entry dropped, the hard
	// link's target renamed the same way, owners kept.
	names, base := layerEntries(t, blob(t, files, string(man.Layers[0].Digest)), string(cfg.RootFS.DiffIDs[0]))
	if got := strings.Join(names, " "); got != "usr/ usr/bin/ usr/bin/python3.11 usr/bin/python3 etc/ etc/shadow" {
		t.Errorf("base layer entries: %s", got)
	}
	if e := base["usr/bin/python3"]; e.typ != tar.TypeLink || e.link != "usr/bin/python3.11" {
		t.Errorf("hard link %+v", e)
	}
	if e := base["etc/shadow"]; e.mode != 0o640 || e.gid != 42 {
		t.Errorf("etc/shadow %+v", e)
	}

	// The generated layer: sorted, parents added, modes as asked, mtime = epoch.
	names, l := layerEntries(t, blob(t, files, string(man.Layers[1].Digest)), string(cfg.RootFS.DiffIDs[1]))
	want := "etc/ etc/thaw.conf opt/ opt/thaw-dist/ opt/thaw-dist/bin/ opt/thaw-dist/bin/runsc opt/thaw-dist/bin/secret " +
		"tmp/ usr/ usr/lib/ usr/lib/thaw/ usr/lib/thaw/alias.py usr/lib/thaw/sub/ usr/lib/thaw/sub/mod.py " +
		"usr/local/ usr/local/bin/ usr/local/bin/thaw"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("layer entries:\n got %s\nwant %s", got, want)
	}
	checks := map[string]entry{
		"opt/thaw-dist/bin/runsc":  {typ: tar.TypeReg, mode: 0o755, content: "runsc binary"},
		"opt/thaw-dist/bin/secret": {typ: tar.TypeReg, mode: 0o640, content: "0600 file"},
		"opt/thaw-dist/":           {typ: tar.TypeDir, mode: 0o755},
		"tmp/":                     {typ: tar.TypeDir, mode: 0o1777},
		"etc/thaw.conf":            {typ: tar.TypeReg, mode: 0o644, content: "x = 1\n"},
		"usr/lib/thaw/sub/":        {typ: tar.TypeDir, mode: 0o750},
		"usr/lib/thaw/sub/mod.py":  {typ: tar.TypeReg, mode: 0o644, content: "print(1)\n"},
		"usr/lib/thaw/alias.py":    {typ: tar.TypeSymlink, mode: 0o777, link: "sub/mod.py"},
		"usr/local/bin/thaw":       {typ: tar.TypeSymlink, mode: 0o777, link: "/usr/lib/thaw/alias.py"},
	}
	for name, w := range checks {
		w.mtimeSec = spec.Epoch
		if got := l[name]; got != w {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}

	// docker load's manifest.json names the same blobs.
	var dm []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	must(t, json.Unmarshal(files["manifest.json"], &dm))
	if len(dm) != 1 || dm[0].Config != "blobs/sha256/"+man.Config.Digest.Encoded() ||
		len(dm[0].Layers) != 2 || dm[0].Layers[1] != "blobs/sha256/"+man.Layers[1].Digest.Encoded() ||
		len(dm[0].RepoTags) != 1 || dm[0].RepoTags[0] != spec.Ref {
		t.Errorf("manifest.json %+v", dm)
	}
	if res.Layers[1].Entries != len(names) || res.Layers[0].Entries != 6 {
		t.Errorf("result entry counts %+v", res.Layers)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("scratch files left: %v", left)
	}
}

func TestSameInputsSameImage(t *testing.T) {
	dir, spec := fixture(t)
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	ra, err := Write(spec, a, "")
	must(t, err)
	rb, err := Write(spec, b, filepath.Join(dir, "layout"))
	must(t, err)
	if ra.Manifest != rb.Manifest {
		t.Fatalf("two builds of one spec: %s vs %s", ra.Manifest, rb.Manifest)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ba, bb) {
		t.Error("the two archives differ byte for byte")
	}
	// The layout directory holds the same index as the archive.
	idx, err := os.ReadFile(filepath.Join(dir, "layout", "index.json"))
	must(t, err)
	if !bytes.Equal(idx, readArchive(t, a)["index.json"]) {
		t.Error("layout index.json differs from the archive's")
	}
	// A changed input changes the digest.
	must(t, os.WriteFile(filepath.Join(dir, "runsc"), []byte("runsc binary 2"), 0o755))
	rc, err := Write(spec, filepath.Join(dir, "c.tar"), "")
	must(t, err)
	if rc.Manifest == ra.Manifest {
		t.Error("a changed file kept the manifest digest")
	}
}

func TestUncompressed(t *testing.T) {
	dir, spec := fixture(t)
	spec.Compression = "none"
	res, err := Write(spec, filepath.Join(dir, "image.tar"), "")
	must(t, err)
	for _, l := range res.Layers {
		if l.Digest != l.DiffID {
			t.Errorf("uncompressed layer: digest %s != diff_id %s", l.Digest, l.DiffID)
		}
	}
	files := readArchive(t, filepath.Join(dir, "image.tar"))
	var man v1.Manifest
	must(t, json.Unmarshal(blob(t, files, string(res.Manifest)), &man))
	if man.Layers[0].MediaType != v1.MediaTypeImageLayer {
		t.Errorf("media type %s", man.Layers[0].MediaType)
	}
}

func TestBadSpecs(t *testing.T) {
	dir, _ := fixture(t)
	must(t, syscall.Mkfifo(filepath.Join(dir, "pkg", "fifo"), 0o644))
	cases := map[string]string{
		`{"ref":"x","layers":[{"entries":[{"path":"rel/path","dir":true}]}]}`:               "clean absolute path",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","dir":true,"link":"b"}]}]}`:          "exactly one of",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","dir":true,"mode":"999"}]}]}`:        "octal",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","dir":true}]}],"compresion":"gzip"}`: "unknown field",
		`{"ref":"x","layers":[]}`:                                                                      "no layers",
		`{"layers":[{"entries":[{"path":"/a","dir":true}]}]}`:                                          "ref is empty",
		`{"ref":"x","layers":[{"tar":"a.tar","entries":[{"path":"/a","dir":true}]}]}`:                  "either tar or entries",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","dir":true},{"path":"/a","data":""}]}]}`:        "given twice",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","data":""},{"path":"/a/b","data":""}]}]}`:       "not a directory",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","src":"` + dir + `/missing"}]}]}`:               "no such file",
		`{"ref":"x","layers":[{"entries":[{"path":"/a","src":"` + filepath.Join(dir, "pkg") + `"}]}]}`: "not a regular file, directory or symlink",
	}
	for text, want := range cases {
		spec, err := LoadSpec(strings.NewReader(text))
		if err == nil {
			_, err = Write(spec, filepath.Join(dir, "out.tar"), "")
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error saying %q", text, err, want)
		}
		if _, statErr := os.Stat(filepath.Join(dir, "out.tar")); statErr == nil {
			t.Errorf("%s: an archive was written despite the error", text)
		}
	}
}
