// Command thaw-runsc is the runsc the containerd shim executes (runsc.toml
// binary_name). It restores opted-in containers from thawd's cache and passes
// every other call straight to the real runsc; see go/internal/standin.
package main

import (
	"os"

	"thaw.dev/thaw/go/internal/standin"
)

func main() {
	os.Exit(standin.Main(os.Args))
}
