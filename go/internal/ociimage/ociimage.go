// Package ociimage writes a container image without a container daemon: an
// OCI image layout (image-spec v1.1) as a tar archive that `ctr images
// import` reads (plus docker's manifest.json, for `docker load`: not tried
// here, there is no docker daemon), or as a directory.
//
// An image is described by a Spec: layers built from host files (single
// files, whole directory trees, symlinks, inline data, empty directories)
// or copied entry by entry from an existing tar (a root filesystem made by
// mmdebstrap, say), plus the image config (Cmd, Env, ...). The output is
// reproducible: entries of a generated layer are sorted and carry the spec's
// Epoch as their mtime and root as their owner, so the same inputs give the
// same manifest digest.
//
// Why not a builder: deploy/Containerfile needs a daemon (docker, buildah)
// or a registry to pull its base from, and neither is reachable from thaw's
// CI; the image-spec types and go-digest are already in thaw's module graph
// (through containerd), and archive/tar plus klauspost/compress's gzip do
// the rest.
package ociimage

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Spec describes one image.
type Spec struct {
	// Ref names the image: the index annotations io.containerd.image.name
	// (what `ctr images import` calls it) and org.opencontainers.image.ref.name,
	// and the RepoTags of the docker manifest.json.
	Ref string `json:"ref"`
	// Epoch (seconds, SOURCE_DATE_EPOCH style) is the mtime of every generated
	// entry and the config's "created". Entries copied from a tar keep theirs.
	Epoch int64 `json:"epoch"`
	// Compression of the layer blobs: "gzip" (default) or "none".
	Compression  string         `json:"compression"`
	Architecture string         `json:"architecture"` // default amd64
	OS           string         `json:"os"`           // default linux
	Config       v1.ImageConfig `json:"config"`
	Layers       []Layer        `json:"layers"`
}

// Layer is either a copy of an existing tar or a list of entries.
type Layer struct {
	// Comment becomes the layer's history entry (created_by).
	Comment string `json:"comment"`
	// Tar: a tar file (gzip-compressed or not) copied entry by entry; names
	// are made relative ("./usr" -> "usr") and the root entry is dropped.
	Tar     string  `json:"tar"`
	Entries []Entry `json:"entries"`
}

// Entry is one thing in a generated layer. Exactly one of Src, Link, Data or
// Dir says what it is.
type Entry struct {
	Path string `json:"path"` // absolute path inside the image
	// Src: a host file (copied) or directory (copied recursively, modes kept,
	// symlinks kept as symlinks).
	Src string `json:"src,omitempty"`
	// Link: a symlink to this target.
	Link string `json:"link,omitempty"`
	// Data: a file with this content.
	Data *string `json:"data,omitempty"`
	// Dir: an empty directory.
	Dir bool `json:"dir,omitempty"`
	// Mode: octal permission bits ("0755", "1777") for a file, a directory or
	// Data; default: the source file's, 0644 for Data, 0755 for a directory.
	// Not used for the contents of a Src directory.
	Mode string `json:"mode,omitempty"`
}

// LayerResult describes one written layer.
type LayerResult struct {
	Digest  digest.Digest `json:"digest"`  // of the blob as stored
	DiffID  digest.Digest `json:"diff_id"` // of the uncompressed tar
	Size    int64         `json:"size"`
	Entries int           `json:"entries"`
	Comment string        `json:"comment,omitempty"`
}

// Result describes the written image.
type Result struct {
	Ref      string        `json:"ref"`
	Manifest digest.Digest `json:"manifest"`
	Config   digest.Digest `json:"config"`
	Layers   []LayerResult `json:"layers"`
}

// LoadSpec reads a JSON spec; unknown fields are errors (a misspelt key would
// otherwise be dropped silently).
func LoadSpec(r io.Reader) (*Spec, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("image spec: %w", err)
	}
	return &s, s.validate()
}

func (s *Spec) validate() error {
	if s.Ref == "" {
		return errors.New("image spec: ref is empty")
	}
	switch s.Compression {
	case "", "gzip", "none":
	default:
		return fmt.Errorf("image spec: compression %q: want gzip or none", s.Compression)
	}
	if len(s.Layers) == 0 {
		return errors.New("image spec: no layers")
	}
	for i, l := range s.Layers {
		if (l.Tar == "") == (len(l.Entries) == 0) {
			return fmt.Errorf("image spec: layer %d: give either tar or entries", i)
		}
		for _, e := range l.Entries {
			if err := e.validate(); err != nil {
				return fmt.Errorf("image spec: layer %d: %w", i, err)
			}
		}
	}
	return nil
}

func (e Entry) validate() error {
	if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == "/" {
		return fmt.Errorf("entry path %q: want a clean absolute path below /", e.Path)
	}
	kinds := 0
	for _, set := range []bool{e.Src != "", e.Link != "", e.Data != nil, e.Dir} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return fmt.Errorf("entry %s: give exactly one of src, link, data, dir", e.Path)
	}
	if e.Mode != "" {
		if _, err := parseMode(e.Mode); err != nil {
			return fmt.Errorf("entry %s: %w", e.Path, err)
		}
	}
	return nil
}

func parseMode(s string) (int64, error) {
	m, err := strconv.ParseInt(s, 8, 32)
	if err != nil || m < 0 || m > 07777 {
		return 0, fmt.Errorf("mode %q: want octal permission bits (0755, 1777)", s)
	}
	return m, nil
}

// Write builds the image and writes an OCI archive to archivePath (a tar;
// written under a temporary name and renamed last) and/or an OCI layout
// directory layoutDir (must not exist yet). Either may be empty, not both.
func Write(s *Spec, archivePath, layoutDir string) (*Result, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if archivePath == "" && layoutDir == "" {
		return nil, errors.New("no output: give an archive path or a layout directory")
	}
	scratchParent := filepath.Dir(archivePath)
	if archivePath == "" {
		scratchParent = filepath.Dir(layoutDir)
	}
	scratch, err := os.MkdirTemp(scratchParent, ".thaw-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	blobs := filepath.Join(scratch, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, err
	}

	epoch := time.Unix(s.Epoch, 0).UTC()
	res := &Result{Ref: s.Ref}
	var layerDescs []v1.Descriptor
	var diffIDs []digest.Digest
	var history []v1.History
	for i, l := range s.Layers {
		lr, err := writeLayer(l, s.Compression, epoch, blobs)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		res.Layers = append(res.Layers, *lr)
		mt := v1.MediaTypeImageLayerGzip
		if s.Compression == "none" {
			mt = v1.MediaTypeImageLayer
		}
		layerDescs = append(layerDescs, v1.Descriptor{MediaType: mt, Digest: lr.Digest, Size: lr.Size})
		diffIDs = append(diffIDs, lr.DiffID)
		history = append(history, v1.History{Created: &epoch, CreatedBy: l.Comment})
	}

	arch, osName := s.Architecture, s.OS
	if arch == "" {
		arch = "amd64"
	}
	if osName == "" {
		osName = "linux"
	}
	cfg := v1.Image{
		Created:  &epoch,
		Platform: v1.Platform{Architecture: arch, OS: osName},
		Config:   s.Config,
		RootFS:   v1.RootFS{Type: "layers", DiffIDs: diffIDs},
		History:  history,
	}
	cfgDesc, err := writeJSONBlob(blobs, v1.MediaTypeImageConfig, cfg)
	if err != nil {
		return nil, err
	}
	res.Config = cfgDesc.Digest
	man := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    cfgDesc,
		Layers:    layerDescs,
	}
	manDesc, err := writeJSONBlob(blobs, v1.MediaTypeImageManifest, man)
	if err != nil {
		return nil, err
	}
	res.Manifest = manDesc.Digest
	manDesc.Annotations = map[string]string{
		// containerd's importer names the image from this annotation
		// (core/images/archive/importer.go); the OCI one is for other tools.
		"io.containerd.image.name": s.Ref,
		v1.AnnotationRefName:       s.Ref,
	}
	manDesc.Platform = &v1.Platform{Architecture: arch, OS: osName}
	index := v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{manDesc},
	}
	if err := writeJSON(filepath.Join(scratch, v1.ImageIndexFile), index); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(scratch, v1.ImageLayoutFile), v1.ImageLayout{Version: v1.ImageLayoutVersion}); err != nil {
		return nil, err
	}
	// docker load reads manifest.json (its own format; moby image/tarexport)
	// and ignores the rest.
	dm := dockerManifest{Config: blobPath(cfgDesc.Digest)}
	if tagged(s.Ref) {
		dm.RepoTags = []string{s.Ref}
	}
	for _, d := range layerDescs {
		dm.Layers = append(dm.Layers, blobPath(d.Digest))
	}
	if err := writeJSON(filepath.Join(scratch, "manifest.json"), []dockerManifest{dm}); err != nil {
		return nil, err
	}

	if archivePath != "" {
		if err := archiveDir(scratch, archivePath, epoch); err != nil {
			return nil, err
		}
	}
	if layoutDir != "" {
		if err := os.Rename(scratch, layoutDir); err != nil {
			return nil, err
		}
		if err := os.Chmod(layoutDir, 0o755); err != nil {
			return nil, err
		}
	}
	return res, nil
}

type dockerManifest struct {
	Config   string
	RepoTags []string `json:",omitempty"`
	Layers   []string
}

func blobPath(d digest.Digest) string {
	return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
}

// tagged: the last path component of ref carries a ":tag".
func tagged(ref string) bool {
	last := ref[strings.LastIndex(ref, "/")+1:]
	return strings.Contains(last, ":")
}

func writeJSON(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

func writeJSONBlob(blobs, mediaType string, v any) (v1.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return v1.Descriptor{}, err
	}
	d := digest.FromBytes(b)
	if err := os.WriteFile(filepath.Join(blobs, d.Encoded()), b, 0o644); err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}, nil
}

// archiveDir writes the layout under dir as a tar at out (temp name, rename).
func archiveDir(dir, out string, epoch time.Time) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	buf := bufio.NewWriterSize(tmp, 1<<20)
	tw := tar.NewWriter(buf)
	var names []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Format: tar.FormatPAX, Mode: 0o644}
		if st.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !st.IsDir() {
			if err := copyFile(tw, p, st.Size()); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := buf.Flush(); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
