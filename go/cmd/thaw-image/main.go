// Command thaw-image writes a container image from a JSON spec without a
// container daemon or registry: an OCI image layout archive that
// `ctr images import` reads, with docker's manifest.json for `docker load`
// (go/internal/ociimage).
//
// Usage:
//
//	thaw-image -spec SPEC.json [-o IMAGE.tar] [-layout DIR]
//
// SPEC "-" reads stdin. Prints a JSON summary (manifest and config digests,
// each layer's digest, diff_id, size and entry count) on success; on failure
// prints the error and exits 1. ci/build-image.sh builds the DaemonSet image
// with it, ci/cri.sh the pause and test images of the CRI recipe.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"thaw.dev/thaw/go/internal/ociimage"
)

func main() {
	specPath := flag.String("spec", "", "image spec (JSON); - for stdin")
	out := flag.String("o", "", "write an OCI image layout archive (tar) here")
	layout := flag.String("layout", "", "write an OCI image layout directory here (must not exist)")
	flag.Parse()
	if err := run(*specPath, *out, *layout); err != nil {
		fmt.Fprintf(os.Stderr, "thaw-image: %v\n", err)
		os.Exit(1)
	}
}

func run(specPath, out, layout string) error {
	if specPath == "" || flag.NArg() != 0 {
		return fmt.Errorf("usage: thaw-image -spec SPEC.json [-o IMAGE.tar] [-layout DIR]")
	}
	var r io.Reader = os.Stdin
	if specPath != "-" {
		f, err := os.Open(specPath)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	spec, err := ociimage.LoadSpec(r)
	if err != nil {
		return err
	}
	res, err := ociimage.Write(spec, out, layout)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
