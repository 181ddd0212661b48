// Command thaw-runsc-hooks does thaw's part of runsc create, start and delete
// for opted-in containers (go/internal/standin); thaw-runsc execs it.
package main

import (
	"os"

	"thaw.dev/thaw/go/internal/standin"
)

func main() {
	os.Exit(standin.Main(os.Args))
}
