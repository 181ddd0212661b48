package ociimage

// One layer of an image: a copy of an existing tar, or entries built from host
// files, links, data and directories, written reproducibly (Epoch mtimes, root
// owner) and compressed as the Spec asks.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
)

// countingWriter counts and hashes what passes through it.
type countingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// writeLayer writes one layer blob into blobs and returns its digests.
func writeLayer(l Layer, compression string, epoch time.Time, blobs string) (*LayerResult, error) {
	tmp, err := os.CreateTemp(blobs, ".layer-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	buf := bufio.NewWriterSize(tmp, 1<<20)
	stored := &countingWriter{w: buf, h: sha256.New()}
	var gz *gzip.Writer
	var tarOut io.Writer = stored
	if compression != "none" {
		// BestSpeed: layers here are hundreds of MB on a 2-core CI machine;
		// default compression took several times longer for ~10% less.
		gz, err = gzip.NewWriterLevel(stored, gzip.BestSpeed)
		if err != nil {
			return nil, err
		}
		tarOut = gz
	}
	plain := &countingWriter{w: tarOut, h: sha256.New()}
	tw := tar.NewWriter(plain)
	var n int
	if l.Tar != "" {
		n, err = copyTar(tw, l.Tar)
	} else {
		n, err = writeEntries(tw, l.Entries, epoch)
	}
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if gz != nil {
		if err := gz.Close(); err != nil {
			return nil, err
		}
	}
	if err := buf.Flush(); err != nil {
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	d := digest.NewDigestFromBytes(digest.SHA256, stored.h.Sum(nil))
	if err := os.Rename(tmp.Name(), filepath.Join(blobs, d.Encoded())); err != nil {
		return nil, err
	}
	return &LayerResult{Digest: d, DiffID: digest.NewDigestFromBytes(digest.SHA256, plain.h.Sum(nil)),
		Size: stored.n, Entries: n, Comment: l.Comment}, nil
}

// relName turns "./usr/bin", "/usr/bin" or "usr/bin/" into "usr/bin".
func relName(name string) string {
	return strings.TrimSuffix(strings.TrimLeft(strings.TrimPrefix(name, "."), "/"), "/")
}

func copyTar(tw *tar.Writer, p string) (int, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p, err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", p, err)
		}
		name := relName(h.Name)
		if name == "" {
			continue // the root directory itself
		}
		h.Name = name
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if h.Typeflag == tar.TypeLink {
			h.Linkname = relName(h.Linkname)
		}
		h.Format = tar.FormatPAX
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return n, fmt.Errorf("%s: %s: %w", p, h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return n, fmt.Errorf("%s: %s: %w", p, h.Name, err)
		}
		n++
	}
}

// item is one entry of a generated layer, before it is written.
type item struct {
	hdr  tar.Header
	src  string  // file contents from here, or
	data *string // from here
}

func writeEntries(tw *tar.Writer, entries []Entry, epoch time.Time) (int, error) {
	items := map[string]*item{}
	explicit := map[string]bool{}
	add := func(it *item) error {
		name := it.hdr.Name
		if explicit[name] {
			return fmt.Errorf("%s is given twice", "/"+name)
		}
		explicit[name] = true
		items[name] = it
		return nil
	}
	for _, e := range entries {
		name := relName(e.Path)
		var mode int64 = -1
		if e.Mode != "" {
			mode, _ = parseMode(e.Mode)
		}
		switch {
		case e.Link != "":
			if err := add(&item{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.Link, Mode: 0o777}}); err != nil {
				return 0, err
			}
		case e.Dir:
			if mode < 0 {
				mode = 0o755
			}
			if err := add(&item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}); err != nil {
				return 0, err
			}
		case e.Data != nil:
			if mode < 0 {
				mode = 0o644
			}
			if err := add(&item{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(*e.Data))}, data: e.Data}); err != nil {
				return 0, err
			}
		default:
			st, err := os.Lstat(e.Src)
			if err != nil {
				return 0, err
			}
			if st.IsDir() {
				if err := addTree(e.Src, name, mode, add); err != nil {
					return 0, err
				}
				continue
			}
			if !st.Mode().IsRegular() {
				return 0, fmt.Errorf("%s: not a regular file or directory", e.Src)
			}
			if mode < 0 {
				mode = unixMode(st.Mode())
			}
			if err := add(&item{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: st.Size()}, src: e.Src}); err != nil {
				return 0, err
			}
		}
	}
	// Parent directories nobody listed: root-owned 0755, as a builder's
	// COPY would create them.
	for name := range explicit {
		for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := items[d]; !ok {
				items[d] = &item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}}
			} else if items[d].hdr.Typeflag != tar.TypeDir {
				return 0, fmt.Errorf("/%s is not a directory but /%s is inside it", d, name)
			}
		}
	}
	names := make([]string, 0, len(items))
	for n := range items {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		it := items[n]
		h := it.hdr
		h.ModTime = epoch
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if err := tw.WriteHeader(&h); err != nil {
			return 0, fmt.Errorf("/%s: %w", n, err)
		}
		switch {
		case it.data != nil:
			if _, err := io.WriteString(tw, *it.data); err != nil {
				return 0, err
			}
		case it.src != "":
			if err := copyFile(tw, it.src, h.Size); err != nil {
				return 0, err
			}
		}
	}
	return len(names), nil
}

// unixMode: permission bits plus setuid/setgid/sticky, as tar stores them.
func unixMode(m fs.FileMode) int64 {
	out := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

func addTree(root, dest string, topMode int64, add func(*item) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := dest
		if rel != "." {
			name = path.Join(dest, filepath.ToSlash(rel))
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := unixMode(info.Mode())
		switch {
		case d.IsDir():
			if rel == "." && topMode >= 0 {
				mode = topMode
			}
			return add(&item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return add(&item{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}})
		case info.Mode().IsRegular():
			return add(&item{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: info.Size()}, src: p})
		default:
			return fmt.Errorf("%s: not a regular file, directory or symlink", p)
		}
	})
}

func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != size {
		return fmt.Errorf("%s changed while it was copied (%d of %d bytes)", p, n, size)
	}
	return nil
}
