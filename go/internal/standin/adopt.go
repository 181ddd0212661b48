package standin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	pb "thaw.dev/thaw/go/gen/thawpb"
	"thaw.dev/thaw/go/internal/relay"
	"thaw.dev/thaw/go/internal/runscargv"
)

// A container that adopts a parked sandbox (docs/parking.md): no runsc create
// runs; its stdio goes to the sandbox's relay and an alias sends the shim's
// runsc calls to the sandbox's id.

// aliasPath is the link that sends the shim's runsc calls for container id to
// the parked sandbox it adopted (runscargv.Alias).
func (s *Standin) aliasPath(id string) string {
	return filepath.Join(s.a.Root(), runscargv.AliasPrefix+id)
}

func (s *Standin) removeAlias(id string) {
	if id != "" && !strings.ContainsAny(id, "/\x00") {
		os.Remove(s.aliasPath(id))
	}
}

// adoptStdioTimeout bounds the hand-over of the container's stdio to the
// parked sandbox's relay (a local socket: milliseconds).
const adoptStdioTimeout = 5 * time.Second

// adopt makes the container the parked sandbox thawd chose (docs/parking.md):
// no `runsc create` runs. The shim's stdio for this container (this
// process's 0, 1, 2: its pipes, or /dev/null) goes to the sandbox's stdio
// relay, the shim's pid file gets the sandbox's pid, and the alias makes
// every later runsc call for this id one for the sandbox. The alias is the
// last step and the commit: until it exists, nothing the shim does reaches the
// sandbox, and on any error the caller starts the container cold.
func (s *Standin) adopt(m *marker, resp *pb.PrepareRestoreResponse) error {
	if m.PidFile == "" || resp.AdoptPid <= 0 {
		return fmt.Errorf("thawd's answer lacks the sandbox's pid (%d), or create has no --pid-file", resp.AdoptPid)
	}
	// No relay: the sandbox was parked with /dev/null for all three (as this
	// container's are: thawd matched the kinds), and has nothing to hand over.
	if resp.RelaySocket != "" {
		if err := relay.Send(resp.RelaySocket, [3]*os.File{os.Stdin, os.Stdout, os.Stderr}, adoptStdioTimeout); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(m.PidFile, []byte(fmt.Sprint(resp.AdoptPid)), 0o644); err != nil {
		return fmt.Errorf("pid file %s: %w", m.PidFile, err)
	}
	return s.writeAlias(m.ID, m.AdoptID)
}

// deleteAdopted is delete of a container that adopted parked sandbox
// `parked`: runsc deletes the sandbox, then the alias goes and thawd releases
// what the sandbox held (its image lease, root filesystem, relay).
func (s *Standin) deleteAdopted(id, parked string, t0 time.Time) int {
	err := s.runRunsc(s.a.WithTarget(parked).Words()[len(s.a.Global):]...)
	if err != nil && s.runRunscQuiet("state", parked) == nil {
		// The sandbox is still there: keep the alias, so a retried delete
		// (containerd retries) still reaches it.
		return exitCode(err)
	}
	s.removeAlias(id)
	m := s.loadMarker(id)
	if m == nil {
		m = &marker{ID: id, Root: s.a.Root(), AdoptID: parked}
	}
	s.release(id, m.Root)
	os.Remove(s.markerPath(id))
	s.log.Write("delete", m, "released", "adopted sandbox "+parked, t0)
	return 0
}
