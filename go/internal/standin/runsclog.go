package standin

import (
	"encoding/json"
	"io"
	"os"
)

// runsc says why a command failed in the error record it appends to its --log
// file (runsc/cmd/util.Errorf: {"msg","level":"error","time"}, no newline
// between records) and on its stderr, which is the shim's; the exit status alone
// ("exit status 128", util.Fatalf's) names no cause. runscLogSize before a run
// and runscErrorSince after it put runsc's message into the stand-in's reason,
// where the decision log and thawd's outcome show it (issue 32: a pod member's
// failed restore said only "exit status 128").

// maxRunscLogRead bounds what runscErrorSince reads: one command's records.
const maxRunscLogRead = 1 << 20

// maxRunscMessage bounds the message kept in a reason.
const maxRunscMessage = 1000

// runscLogSize is the size of runsc's --log file now, where the next run's
// records begin (0 when there is no such file).
func runscLogSize(path string) int64 {
	if path == "" {
		return 0
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// runscErrorSince is the message of the last error record in runsc's --log
// file past offset ("" when there is none, or the file cannot be read).
func runscErrorSince(path string, offset int64) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	dec := json.NewDecoder(io.LimitReader(f, maxRunscLogRead))
	msg := ""
	for {
		var rec struct {
			Msg   string `json:"msg"`
			Level string `json:"level"`
		}
		if dec.Decode(&rec) != nil {
			break // the end, or something that is not runsc's record
		}
		if rec.Level == "error" && rec.Msg != "" {
			msg = rec.Msg
		}
	}
	if len(msg) > maxRunscMessage {
		msg = msg[:maxRunscMessage] + "..."
	}
	return msg
}
