// Command thaw-chunk splits files into content-defined chunks (FastCDC with
// normalized chunking) and hashes every chunk with SHA-256 (its name, which
// every fetch checks) and BLAKE3 (the manifest's check column, which thaw-fetch
// checked until issue 14 item 6: docs/store.md, "Integrity"), for thaw's image
// packer (control/images/chunk.py runs it). Pure-Python CDC runs at a few MB/s; this
// runs at disk speed (docs/store.md has the measurements).
//
// Output, on stdout, one JSON object a line:
//
//	{"algorithm":"fastcdc-gear-v1","hash":"sha256","check":"blake3","min":N,"avg":N,"max":N}
//	{"f":FILEINDEX,"o":OFFSET,"n":LENGTH,"h":"HEX","b":"HEX"}   one per chunk, in order
//	{"f":FILEINDEX,"size":N,"chunks":K}                 after each file's chunks
//
// Exit status 2 with a message on stderr for bad arguments, 1 for I/O errors.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"

	"github.com/zeebo/blake3"

	"thaw.dev/thaw/go/internal/version"
)

type chunk struct {
	off, n int
	sum    [32]byte // SHA-256
	check  [32]byte // BLAKE3-256
}

func main() {
	min := flag.Int("min", 256<<10, "smallest chunk in bytes (except a file's last)")
	avg := flag.Int("avg", 1<<20, "target average chunk in bytes (a power of two)")
	max := flag.Int("max", 4<<20, "largest chunk in bytes")
	workers := flag.Int("workers", runtime.NumCPU(), "hashing goroutines")
	// The build's stamp (ci/build-go.sh): ci/release.sh checks the binaries it
	// ships are of the version it names.
	printVersion := flag.Bool("version", false, "print thaw's version and exit")
	flag.Parse()
	if *printVersion {
		fmt.Println(version.Version)
		return
	}
	p, err := NewParams(*min, *avg, *max)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-chunk:", err)
		os.Exit(2)
	}
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "thaw-chunk: usage: thaw-chunk [-min N -avg N -max N] FILE...")
		os.Exit(2)
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	enc := json.NewEncoder(out)
	_ = enc.Encode(map[string]any{"algorithm": Algorithm, "hash": "sha256", "check": "blake3", "min": p.Min, "avg": p.Avg, "max": p.Max})
	for i, path := range flag.Args() {
		chunks, size, err := chunkFile(path, p, *workers)
		if err != nil {
			out.Flush()
			fmt.Fprintf(os.Stderr, "thaw-chunk: %s: %v\n", path, err)
			os.Exit(1)
		}
		for _, c := range chunks {
			fmt.Fprintf(out, "{\"f\":%d,\"o\":%d,\"n\":%d,\"h\":\"%s\",\"b\":\"%s\"}\n", i, c.off, c.n,
				hex.EncodeToString(c.sum[:]), hex.EncodeToString(c.check[:]))
		}
		fmt.Fprintf(out, "{\"f\":%d,\"size\":%d,\"chunks\":%d}\n", i, size, len(chunks))
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "thaw-chunk: stdout:", err)
		os.Exit(1)
	}
}

// chunkFile maps the file read-only, finds the cut points on this goroutine
// and hashes the chunks on `workers` goroutines (SHA-256 uses the CPU's SHA
// extensions where present).
func chunkFile(path string, p Params, workers int) ([]chunk, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := st.Size()
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("not a regular file")
	}
	if size == 0 {
		return nil, 0, nil
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, 0, fmt.Errorf("mmap: %w", err)
	}
	defer syscall.Munmap(data)
	_ = madvise(data, 2) // MADV_SEQUENTIAL: read ahead, drop behind

	var chunks []chunk
	jobs := make(chan int, 64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				mu.Lock()
				c := chunks[i]
				mu.Unlock()
				sum := sha256.Sum256(data[c.off : c.off+c.n])
				check := blake3.Sum256(data[c.off : c.off+c.n])
				mu.Lock()
				chunks[i].sum, chunks[i].check = sum, check
				mu.Unlock()
			}
		}()
	}
	off := 0
	for off < len(data) {
		n := p.Cut(data[off:])
		mu.Lock()
		chunks = append(chunks, chunk{off: off, n: n})
		i := len(chunks) - 1
		mu.Unlock()
		jobs <- i
		off += n
	}
	close(jobs)
	wg.Wait()
	return chunks, size, nil
}

func madvise(b []byte, advice int) error {
	_, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafePointer(b)), uintptr(len(b)), uintptr(advice))
	if e != 0 {
		return e
	}
	return nil
}
