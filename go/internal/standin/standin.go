package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "thaw.dev/thaw/go/gen/thawpb"
	"thaw.dev/thaw/go/internal/runscargv"
)

// Annotations the stand-in reads from config.json (twins: control/lifecycle/workload.py,
// control/lifecycle/pod.py).
const (
	AnnotationWorkload = "thaw.dev/workload" // opt-in: present = thaw may restore this container
	// CRI's container type: "container" for a pod's app container, which joins
	// the pod's sandbox as a subcontainer.
	annotationContainerType = "io.kubernetes.cri.container-type"
	origConfigName          = "config.json.thaw-orig"
	// podFailedReason starts thawd's reason when it removed a pod's sandbox (the
	// pod cannot be restored and, its sandbox's start spent on the restore,
	// cannot start cold either). Twin: control/thawd/podrecord.py POD_FAILED.
	podFailedReason = "pod-failed"
	// stoppedWhileRestoring starts the reason the stand-in reports when a kill
	// of a container of a restoring pod failed (runsc has no process to signal
	// before the pod's last container registers). Twin: control/thawd/podrecord.py
	// STOPPED_WHILE_RESTORING.
	stoppedWhileRestoring = "stopped-while-restoring"
	// CRI's pod name annotation: on a pod's sandbox (pause) container only.
	annotationSandboxName = "io.kubernetes.cri.sandbox-name"
)

// Standin handles one invocation.
type Standin struct {
	cfg    Config
	cfgErr error    // a bad configuration: create starts cold and logs it
	argv   []string // the stand-in's argv: argv[0] is thaw-runsc
	a      runscargv.Argv
	log    *decisionLog
}

// Main handles create, start and delete (thaw-runsc-hooks; thaw-runsc execs
// it for those three) and returns the exit code; exec'ing never returns.
func Main(argv []string) int {
	cfg, cfgErr := LoadConfig(os.LookupEnv)
	if len(argv) == 2 && argv[1] == printConfigCommand {
		return printConfig(cfg, cfgErr)
	}
	s := &Standin{cfg: cfg, cfgErr: cfgErr, argv: argv, a: runscargv.Parse(argv[1:])}
	s.log = openDecisionLog(s.cfg.LogPath, s.cfg.LogMaxBytes, s.cfg.LogKeep)
	defer s.log.Close()
	if id := s.target(); id != "" && runscargv.Alias(s.a.Root(), id) == runscargv.Satisfied {
		return s.satisfiedCall(id)
	}
	switch s.a.Command {
	case "create":
		return s.create()
	case "start":
		return s.start()
	case "kill":
		return s.kill()
	case "delete":
		return s.delete()
	default: // thaw-runsc sends only these three here; anything else is runsc's
		return s.execRunsc(argv[1:])
	}
}

// execRunsc replaces this process with the real runsc (no extra process).
func (s *Standin) execRunsc(args []string) int {
	err := syscall.Exec(s.cfg.RealRunsc, append([]string{s.cfg.RealRunsc}, args...), os.Environ())
	return s.fail(fmt.Sprintf("thaw stand-in: exec %s: %v", s.cfg.RealRunsc, err))
}

// runscCmd is the real runsc as a child that dies with this process: when the
// shim's call is killed (SIGKILL, a timeout), a `runsc create` it started must
// not finish on its own and leave a sandbox nothing reclaims; plain runsc
// killed at the same moment takes its half-made sandbox with it (issue 14).
// Pdeathsig fires when the thread that forked the child exits, so the fork
// happens on a locked OS thread that lives as long as the process does.
func (s *Standin) runscCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(s.cfg.RealRunsc, append(append([]string{}, s.a.Global...), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// runRunsc runs the real runsc as a child with this process's stdio.
func (s *Standin) runRunsc(args ...string) error {
	runtime.LockOSThread() // never unlocked: Pdeathsig watches the forking thread
	cmd := s.runscCmd(args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd.Run()
}

// runRunscQuiet runs the real runsc with /dev/null as stdio.
func (s *Standin) runRunscQuiet(args ...string) error {
	runtime.LockOSThread()
	cmd := s.runscCmd(args...)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	return cmd.Run()
}

// fail follows runsc's contract with the shim (runsc/cmd/util.Errorf): one
// JSON line {"msg","level":"error","time"} appended to the --log file, the
// message on stderr, a non-zero exit.
func (s *Standin) fail(msg string) int {
	if p := s.a.GlobalValue("log"); p != "" {
		if f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			b, _ := json.Marshal(map[string]any{"msg": msg, "level": "error", "time": time.Now()})
			f.Write(append(b, '\n'))
			f.Close()
		}
	}
	fmt.Fprintln(os.Stderr, msg)
	return 128
}

func (s *Standin) runtime() *pb.Runtime {
	bundle := s.a.Flag("bundle")
	if bundle == "" && s.a.Command == "create" {
		bundle, _ = os.Getwd() // runsc's default bundle is the working directory
	}
	return &pb.Runtime{ContainerId: s.a.ContainerID(), Bundle: bundle, RunscRoot: s.a.GlobalValue("root"),
		GlobalFlags: s.a.Global}
}

func (s *Standin) dial() (pb.ThawdClient, func(), error) {
	if _, err := os.Stat(s.cfg.Socket); err != nil {
		return nil, func() {}, fmt.Errorf("thawd socket %s: %w", s.cfg.Socket, err)
	}
	conn, err := grpc.NewClient("unix://"+s.cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, func() {}, err
	}
	return pb.NewThawdClient(conn), func() { conn.Close() }, nil
}

// annotations reads the bundle's annotations (nil when config.json is unreadable).
func annotations(bundle string) map[string]string {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(b, &spec) != nil {
		return nil
	}
	return spec.Annotations
}

// optedIn: only opted-in containers involve thawd.
func optedIn(ann map[string]string) bool {
	_, ok := ann[AnnotationWorkload]
	return ok
}

func (s *Standin) create() int {
	t0 := time.Now()
	rt := s.runtime()
	// Before any path (cold, restore, plain runsc), since the sandbox inherits
	// them. It cannot fail short of opening /dev/null failing, and then the
	// container gets what plain runsc gives it: nothing here stops a start.
	_, _ = writableNull(1, 2)
	// A container id containerd uses again after a crash left its alias
	// behind must not reach the parked sandbox an earlier container adopted.
	s.removeAlias(rt.ContainerId)
	var ann map[string]string
	if rt.ContainerId != "" {
		ann = annotations(rt.Bundle)
	}
	if !optedIn(ann) {
		return s.execRunsc(s.argv[1:])
	}
	m := &marker{ID: rt.ContainerId, Root: rt.RunscRoot, Bundle: rt.Bundle, Decision: "preparing",
		PidFile: s.a.Flag("pid-file"), Created: float64(t0.UnixNano()) / 1e9,
		Member:     ann[annotationContainerType] == "container",
		PodSandbox: ann[annotationContainerType] == "sandbox" && ann[annotationSandboxName] != ""}
	// The marker goes first: a create killed while thawd decides (SIGKILL, the
	// shim's timeout) is followed by containerd's delete, and delete releases
	// thawd's decision only for a container with a marker (issue 14: thawd
	// hears every decision's end).
	if err := s.saveMarker(m); err != nil {
		s.log.Write("create", m, "marker-failed", err.Error(), t0)
		return s.execRunsc(s.argv[1:])
	}
	m.Decision = "cold"
	resp, err := s.prepare(rt)
	switch {
	case s.cfgErr != nil:
		m.Reason = "config-error: " + s.cfgErr.Error()
	case err != nil:
		m.Reason = "thawd-unavailable: " + describeWithin(err, s.cfg.PrepareTimeout, "thawd.prepare_timeout_s + 1 s")
	case resp.Decision == pb.PrepareRestoreResponse_RESTORE:
		m.Decision, m.Key, m.RestoreTimeoutMs = "restore", resp.WorkloadKey, resp.RestoreTimeoutMs
		m.ImagePath = resp.ImagePath
	case resp.Decision == pb.PrepareRestoreResponse_ADOPT && !m.Member && resp.AdoptId != "":
		m.Decision, m.Key, m.RestoreTimeoutMs = "adopt", resp.WorkloadKey, resp.RestoreTimeoutMs
		m.AdoptID = resp.AdoptId
	case resp.Decision == pb.PrepareRestoreResponse_SATISFIED && m.Member:
		m.Decision, m.Key, m.Reason = "satisfied", resp.WorkloadKey, resp.Reason
	default:
		m.Key, m.Reason = resp.WorkloadKey, resp.Reason
	}
	if err := s.saveMarker(m); err != nil {
		s.log.Write("create", m, "marker-failed", err.Error(), t0)
		return s.execRunsc(s.argv[1:])
	}
	s.log.Write("create", m, m.Decision, m.Reason, t0)
	if m.Member && strings.HasPrefix(m.Reason, podFailedReason) {
		// thawd removed the pod's sandbox: say why rather than let runsc
		// report a sandbox that is gone. The kubelet re-creates the pod.
		return s.fail("thaw: " + m.Reason)
	}
	if m.Decision == "satisfied" {
		return s.satisfy(m, ann, t0)
	}
	if m.Decision == "adopt" {
		if err := s.adopt(m, resp); err != nil {
			s.log.Write("create", m, "adopt-failed", err.Error(), t0)
			s.removeAlias(m.ID)
			s.coldAgain(m, "adopting parked sandbox "+m.AdoptID+" failed: "+err.Error())
			return s.execRunsc(s.argv[1:])
		}
		return 0
	}
	if m.Decision != "restore" || m.Member {
		// A pod's app container is created as runsc would; its start restores it.
		return s.execRunsc(s.argv[1:])
	}
	// Restore: create the sandbox now from the spec thawd prepared; start restores it.
	if err := s.runRunsc(append([]string{s.a.Command}, s.a.Args...)...); err != nil {
		s.log.Write("create", m, "restore-create-failed", err.Error(), t0)
		s.coldAgain(m, "create for restore failed: "+err.Error())
		return s.execRunsc(s.argv[1:])
	}
	return 0
}

// coldAgain puts the original spec back, tells thawd the restore could not
// even be tried, and records a cold decision.
func (s *Standin) coldAgain(m *marker, reason string) {
	s.report(m, pb.ReportOutcomeRequest_RESTORE_FAILED, reason)
	s.coldAgainQuiet(m, reason)
}

// coldAgainQuiet is coldAgain when thawd already knows (its Restore said no).
func (s *Standin) coldAgainQuiet(m *marker, reason string) {
	orig := filepath.Join(m.Bundle, origConfigName)
	if _, err := os.Stat(orig); err == nil {
		os.Rename(orig, filepath.Join(m.Bundle, "config.json"))
	}
	m.Decision, m.Reason = "cold-fallback", reason
	s.saveMarker(m)
}

func (s *Standin) prepare(rt *pb.Runtime) (*pb.PrepareRestoreResponse, error) {
	if s.cfgErr != nil {
		return nil, s.cfgErr // which socket or deadline is meant is unknown: start cold
	}
	c, closer, err := s.dial()
	if err != nil {
		return nil, err
	}
	defer closer()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PrepareTimeout)
	defer cancel()
	return c.PrepareRestore(ctx, &pb.PrepareRestoreRequest{Runtime: rt, Stdio: stdioKinds()})
}

func (s *Standin) report(m *marker, outcome pb.ReportOutcomeRequest_Outcome, reason string) {
	c, closer, err := s.dial()
	if err != nil {
		return
	}
	defer closer()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Runtime: s.runtimeOf(m), Outcome: outcome, Reason: reason})
}

func (s *Standin) runtimeOf(m *marker) *pb.Runtime {
	return &pb.Runtime{ContainerId: m.ID, Bundle: m.Bundle, RunscRoot: m.Root, GlobalFlags: s.a.Global}
}

func (s *Standin) start() int {
	t0 := time.Now()
	id := s.a.ContainerID()
	m := s.loadMarker(id)
	if m == nil {
		return s.execRunsc(s.argv[1:])
	}
	if m.Decision != "restore" && m.Decision != "adopt" {
		if err := s.runRunsc(append([]string{s.a.Command}, s.a.Args...)...); err != nil {
			return exitCode(err)
		}
		if m.Key != "" {
			s.report(m, pb.ReportOutcomeRequest_COLD_STARTED, m.Reason)
		}
		s.log.Write("start", m, "started-cold", m.Reason, t0)
		return 0
	}
	if m.Member {
		return s.startMember(m, t0)
	}
	// thawd runs `runsc restore`, the health check, the post-restore hooks and
	// the network gate, and records the outcome (one lifecycle for every door:
	// control/lifecycle/engine.py). Not restored: thawd removed the sandbox.
	ok, reason, _ := s.restore(m, false)
	if ok {
		s.log.Write("start", m, "restored", "", t0)
		s.commitRestored(m)
		return 0
	}
	// Fall back: the container must start, cold. An adopted sandbox's alias
	// goes first (thawd removed the sandbox): this delete and everything after
	// is about the container's own id.
	s.log.Write("start", m, "restore-failed", reason, t0)
	s.removeAlias(id)
	s.runRunscQuiet("delete", "--force", id)
	s.coldAgainQuiet(m, reason)
	createArgs := []string{"create", "--bundle=" + m.Bundle}
	if m.PidFile != "" {
		createArgs = append(createArgs, "--pid-file="+m.PidFile)
	}
	// The recreated container's stdio is /dev/null: the stdio the shim gave
	// the first create is gone, and this process's own stdout may be a pipe
	// the shim reads to EOF, which a sandbox holding it would never send.
	if err := s.runRunscQuiet(append(createArgs, id)...); err != nil {
		return s.fail(fmt.Sprintf("thaw: restore failed (%s) and the cold create failed too: %v", reason, err))
	}
	if err := s.runRunscQuiet("start", id); err != nil {
		return s.fail(fmt.Sprintf("thaw: restore failed (%s) and the cold start failed too: %v", reason, err))
	}
	s.log.Write("start", m, "started-cold-after-failed-restore", reason, t0)
	return 0
}

// startMember restores a pod's app container: `runsc restore` registers it in
// the restoring sandbox, with this process's stdio, which is the shim's for
// this container (runsc hands it to the sandbox; thawd could not). The last
// container's restore is the sandbox's restore (runsc/boot/restore.go); thawd
// then checks the pod's health. There is no cold fallback inside a sandbox
// whose start went to a restore: on failure thawd removes the sandbox and the
// start fails, and the kubelet re-creates the pod, which then starts cold.
func (s *Standin) startMember(m *marker, t0 time.Time) int {
	args := []string{"restore", "--image-path=" + m.ImagePath, "--detach", m.ID}
	logPath := s.a.GlobalValue("log")
	logSize := runscLogSize(logPath)
	if err := s.runRunsc(args...); err != nil {
		reason := "runsc restore: " + err.Error()
		if msg := runscErrorSince(logPath, logSize); msg != "" {
			reason += ": " + msg
		}
		s.report(m, pb.ReportOutcomeRequest_RESTORE_FAILED, reason)
		s.log.Write("start", m, "restore-failed", reason, t0)
		return s.fail(fmt.Sprintf("thaw: restoring container %s failed (%s); its pod's sandbox is removed "+
			"and starts cold when the kubelet re-creates it", m.ID, reason))
	}
	ok, reason, answered := s.restore(m, true)
	if !answered {
		// runsc has registered (or, last, restored) the container; only thawd's
		// health check is missing. Failing the start now would lose a pod
		// that may be fine: say so and go on.
		s.log.Write("start", m, "restored-unchecked", reason, t0)
		s.commitRestored(m)
		return 0
	}
	if !ok {
		s.log.Write("start", m, "restore-failed", reason, t0)
		return s.fail(fmt.Sprintf("thaw: restoring container %s failed (%s); its pod's sandbox is removed "+
			"and starts cold when the kubelet re-creates it", m.ID, reason))
	}
	s.log.Write("start", m, "restored", "", t0)
	s.commitRestored(m)
	return 0
}

// restore asks thawd to restore the container it prepared. Without thawd (it
// went away after create) nothing can restore: the caller starts cold.
// subcontainerRestored: a pod's app container, whose runsc restore ran here.
// answered: thawd gave an answer (false: it could not be asked, or the call failed).
func (s *Standin) restore(m *marker, subcontainerRestored bool) (ok bool, reason string, answered bool) {
	c, closer, err := s.dial()
	if err != nil {
		return false, "thawd unavailable at start: " + err.Error(), false
	}
	defer closer()
	timeout := time.Duration(m.RestoreTimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultRestoreTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := c.Restore(ctx, &pb.RestoreRequest{Runtime: s.runtimeOf(m), StandinPid: int32(os.Getpid()),
		StandinMarker: s.markerPath(m.ID), SubcontainerRestored: subcontainerRestored})
	if err != nil {
		return false, "thawd Restore: " + describeWithin(err, timeout,
			"thawd.health_timeout_s + runsc.timeout_s + the post-restore hooks' timeouts"), false
	}
	if !r.Restored {
		return false, r.Detail, true
	}
	return true, "", true
}

// defaultRestoreTimeout is used only for a marker written by an older stand-in
// that did not record thawd's deadline.
const defaultRestoreTimeout = 150 * time.Second

// kill is runsc's, except for a container of a pod that is being restored:
// until the pod's last container has registered, runsc has no process to
// signal in any of them and the kill fails, so the kubelet could never stop
// the pod. Then thawd removes the restoring sandbox (the pod is going away)
// and the kill succeeds: there is nothing left to signal.
func (s *Standin) kill() int {
	id := s.a.KillContainerID() // not ContainerID: kill's last word is the signal
	if parked := runscargv.Alias(s.a.Root(), id); parked != "" {
		return s.execRunsc(s.a.WithTarget(parked).Words())
	}
	m := s.loadMarker(id)
	// "restored": a pod's container whose start committed; the pod may still be
	// waiting for its later containers.
	if m == nil || (m.Decision != "restore" && m.Decision != "restored") || !(m.Member || m.PodSandbox) {
		return s.execRunsc(s.argv[1:])
	}
	t0 := time.Now()
	err := s.runRunsc(append([]string{s.a.Command}, s.a.Args...)...)
	if err == nil {
		return 0
	}
	s.report(m, pb.ReportOutcomeRequest_RESTORE_FAILED, stoppedWhileRestoring+": kill: "+err.Error())
	if s.runRunscQuiet("state", id) != nil { // gone with its sandbox
		s.log.Write("kill", m, "restore-ended", "the pod was stopped while it restored", t0)
		return 0
	}
	s.log.Write("kill", m, "kill-failed", err.Error(), t0)
	return exitCode(err)
}

func (s *Standin) delete() int {
	t0 := time.Now()
	id := s.a.ContainerID()
	// Every container's delete passes here (opted in or not): its shim log is
	// done, and the deleted ones' logs are bounded (logrotate.go).
	if _, err := boundShimLogs(s.cfg.ShimLogDir, id, s.cfg.ShimLogsKeep, s.cfg.ShimLogMax); err != nil {
		s.log.Write("delete", &marker{ID: id, Root: s.a.Root()}, "shim-logs-unbounded", err.Error(), t0)
	}
	if parked := runscargv.Alias(s.a.Root(), id); parked != "" {
		return s.deleteAdopted(id, parked, t0)
	}
	if m := s.loadMarker(id); m != nil {
		if s.unknownToRunsc(id, m.Root) {
			s.reapKilledCreate(m, t0)
		}
		s.release(id, m.Root)
		os.Remove(s.markerPath(id))
		s.log.Write("delete", m, "released", "", t0)
	}
	return s.execRunsc(s.argv[1:])
}

// reapKilledCreate removes what a create killed part way left of container
// m, which runsc has no state for: its sandbox and gofer processes
// (orphans.go), then its cgroup directories (cgroups.go).
func (s *Standin) reapKilledCreate(m *marker, t0 time.Time) {
	if pids := reapOrphans(m.ID, m.Root); len(pids) > 0 {
		s.log.Write("delete", m, "reaped-orphans", fmt.Sprintf("killed %v: sandbox processes of a killed create", pids), t0)
	}
	var dirs []string
	for _, p := range cgroupsPaths(m.Bundle) {
		dirs = append(dirs, cgroupDirs(cgroupFS, p)...)
	}
	removed, errs := removeCgroupDirs(dirs, cgroupRmdirWait)
	if len(removed) > 0 || len(errs) > 0 {
		s.log.Write("delete", m, "reaped-cgroups", fmt.Sprintf("removed %v, left %v: cgroups of a killed create", removed, errs), t0)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return 128
}

// release tells thawd the container is gone (its lease, a parked sandbox's
// resources); best effort: a thawd that is down has nothing to release.
func (s *Standin) release(id, root string) {
	c, closer, err := s.dial()
	if err != nil {
		return
	}
	defer closer()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.Release(ctx, &pb.ReleaseRequest{ContainerId: id, RunscRoot: root})
}
