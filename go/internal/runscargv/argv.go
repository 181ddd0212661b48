// Package runscargv splits runsc command lines (global flags, subcommand,
// its arguments) the way runsc itself reads them. It imports nothing heavy:
// the stand-in parses argv with it before deciding to exec the real runsc.
package runscargv

import (
	"os"
	"strings"
)

// subcommands of runsc at the pin (runsc/cmd/*.go Name()). The first word
// of argv that is one of these, outside a flag's value, is the subcommand.
var subcommands = map[string]bool{
	"checkpoint": true, "cpu-features": true, "create": true, "debug": true, "delete": true, "do": true,
	"events": true, "exec": true, "features": true, "fscheckpoint": true, "gofer": true, "install": true,
	"uninstall": true, "kill": true, "list": true, "export-metrics": true, "metric-metadata": true,
	"metric-server": true, "mitigate": true, "pause": true, "platforms": true, "port-forward": true, "ps": true,
	"read": true, "read-control": true, "restore": true, "resume": true, "run": true, "sandboxexec": true,
	"spec": true, "start": true, "state": true, "statefile": true, "symbolize": true, "syscalls": true,
	"tar": true, "update": true, "usage": true, "wait": true, "write-control": true, "nvproxy": true,
	"trace": true, "boot": true, "help": true, "flags": true, "commands": true,
}

// boolFlags are runsc's boolean global flags (runsc/config/flags.go at the
// pin, deprecated ones included): given as "--flag" they take no value word.
var boolFlags = map[string]bool{
	"debug": true, "systemd-cgroup": true, "log-packets": true, "debug-to-user-log": true,
	"alsologtostderr": true, "allow-flag-override": true, "strace": true, "strace-event": true,
	"profile": true, "rootless": true, "cpu-num-from-quota": true, "oci-seccomp": true,
	"enable-core-tags": true, "systrap-disable-syscall-patching": true, "systrap-disable-fast-path": true,
	"allow-suid": true, "kvm-use-cpu-nums": true, "allow-rootfs-tar-annotation": true, "app-huge-pages": true,
	"overlay": true, "gvisor-marker-file": true, "ignore-cgroups": true, "iouring": true, "directfs": true,
	"TESTONLY-nftables": true, "net-raw": true, "allow-packet-socket-write": true,
	"allow-live-tcp-migration": true, "gso": true, "software-gso": true, "gvisor-gro": true,
	"tx-checksum-offload": true, "rx-checksum-offload": true, "EXPERIMENTAL-xdp-need-wakeup": true,
	"reproduce-nat": true, "reproduce-nftables": true, "net-disconnect-ok": true,
	"pause-external-networking": true, "allow-connected-on-save": true, "nvproxy": true,
	"nvproxy-docker": true, "nvproxy-allow-unsupported-driver": true, "rdmaproxy": true, "tpuproxy": true,
	"TESTONLY-unsafe-nonroot": true, "TESTONLY-afs-syscall-panic": true, "TESTONLY-autosave-resume": true,
	"fsgofer-host-uds": true, "vfs2": true, "fuse": true, "lisafs": true, "cgroupfs": true,
	"ignore-cgroups-creation": true, "host-uds-create": true, "watchdog": true,
}

// Argv is runsc's command line split into its parts.
type Argv struct {
	Global  []string // global flags before the subcommand, verbatim
	Command string   // the subcommand; "" when there is none (e.g. --version)
	Args    []string // everything after the subcommand, verbatim
}

// Parse splits argv[1:] tolerantly: "--flag=v" and "--flag v", "-flag" and
// "--flag", unknown flags too (a value-taking flag is assumed unless the flag
// is a known boolean or the next word is a subcommand).
func Parse(args []string) Argv {
	var a Argv
	for i := 0; i < len(args); i++ {
		w := args[i]
		if !strings.HasPrefix(w, "-") {
			a.Command = w
			a.Args = args[i+1:]
			return a
		}
		a.Global = append(a.Global, w)
		if w == "--" {
			continue
		}
		name := strings.TrimLeft(w, "-")
		if strings.Contains(name, "=") || boolFlags[name] {
			continue
		}
		if i+1 < len(args) && !subcommands[args[i+1]] && !strings.HasPrefix(args[i+1], "-") {
			a.Global = append(a.Global, args[i+1])
			i++
		}
	}
	return a
}

// GlobalValue returns the value of global flag name ("root", "log", ...).
func (a Argv) GlobalValue(name string) string {
	for i, w := range a.Global {
		n := strings.TrimLeft(w, "-")
		if v, ok := strings.CutPrefix(n, name+"="); ok {
			return v
		}
		if n == name && i+1 < len(a.Global) && !strings.HasPrefix(a.Global[i+1], "-") {
			return a.Global[i+1]
		}
	}
	return ""
}

// Flag returns the value of a subcommand flag (e.g. "bundle") and the
// positional arguments (the container id is the last one).
func (a Argv) Flag(name string) string {
	for i, w := range a.Args {
		n := strings.TrimLeft(w, "-")
		if !strings.HasPrefix(w, "-") {
			continue
		}
		if v, ok := strings.CutPrefix(n, name+"="); ok {
			return v
		}
		if n == name && i+1 < len(a.Args) {
			return a.Args[i+1]
		}
	}
	return ""
}

// ContainerID is the last positional word of the subcommand's arguments.
func (a Argv) ContainerID() string {
	if len(a.Args) == 0 {
		return ""
	}
	last := a.Args[len(a.Args)-1]
	if strings.HasPrefix(last, "-") {
		return ""
	}
	return last
}

// KillContainerID is the container id of `runsc kill [--all] [--pid N] <id>
// [signal]` (runsc/cmd/kill.go at the pin): its first positional word, since
// the signal follows it. "" when there is none.
func (a Argv) KillContainerID() string {
	for i := 0; i < len(a.Args); i++ {
		w := a.Args[i]
		if !strings.HasPrefix(w, "-") {
			return w
		}
		if n := strings.TrimLeft(w, "-"); n == "pid" { // the one kill flag that takes a value word
			i++
		}
	}
	return ""
}

// execValueFlags are `runsc exec`'s flags that take a value word (runsc/cmd/exec.go
// SetFlags at the pin); --detach is its one boolean.
var execValueFlags = map[string]bool{
	"cwd": true, "env": true, "user": true, "additional-gids": true, "cap": true, "process": true,
	"pid-file": true, "internal-pid-file": true, "console-socket": true, "pass-fd": true, "exec-fd": true,
}

// TargetIndex is the index in Args of the word that names the container the
// subcommand acts on, -1 when there is none: the first positional word for
// kill (its signal follows) and for exec without --process (its command
// follows), else the last positional word (create, start, state, wait, ps,
// events, delete, exec --process F, ...).
func (a Argv) TargetIndex() int {
	switch a.Command {
	case "kill":
		for i := 0; i < len(a.Args); i++ {
			w := a.Args[i]
			if !strings.HasPrefix(w, "-") {
				return i
			}
			if strings.TrimLeft(w, "-") == "pid" {
				i++
			}
		}
		return -1
	case "exec":
		if a.Flag("process") == "" {
			for i := 0; i < len(a.Args); i++ {
				w := a.Args[i]
				if w == "--" {
					if i+1 < len(a.Args) {
						return i + 1
					}
					return -1
				}
				if !strings.HasPrefix(w, "-") {
					return i
				}
				if n := strings.TrimLeft(w, "-"); execValueFlags[n] {
					i++
				}
			}
			return -1
		}
	}
	if len(a.Args) == 0 || strings.HasPrefix(a.Args[len(a.Args)-1], "-") {
		return -1
	}
	return len(a.Args) - 1
}

// WithTarget is a copy of a whose target container (TargetIndex) is id.
func (a Argv) WithTarget(id string) Argv {
	i := a.TargetIndex()
	if i < 0 {
		return a
	}
	b := a
	b.Args = append([]string{}, a.Args...)
	b.Args[i] = id
	return b
}

// Words is the command line again: global flags, subcommand, arguments.
func (a Argv) Words() []string {
	w := append([]string{}, a.Global...)
	if a.Command != "" {
		w = append(w, a.Command)
	}
	return append(w, a.Args...)
}

// DefaultRoot is runsc's --root when none is given (runsc/config/flags.go at the pin).
const DefaultRoot = "/var/run/runsc"

// Root is the runsc root directory argv addresses.
func (a Argv) Root() string {
	if r := a.GlobalValue("root"); r != "" {
		return r
	}
	return DefaultRoot
}

// AliasPrefix names, in a runsc root directory, the symbolic link that makes a
// container id another sandbox's: <root>/<AliasPrefix><id> -> <parked id>.
// thaw writes one when a container adopts a sandbox restored ahead of demand
// (a parked sandbox, docs/parking.md): containerd keeps calling runsc with its
// own container id, and runsc knows the sandbox by the id it was restored
// under (a sandbox cannot be renamed). runsc's own files there are
// "<id>_sandbox:<id>.state" and ".lock" (runsc/container/state_file.go), which
// this name never matches. Twin: control/thawd/parking.py ALIAS_PREFIX.
const AliasPrefix = "thaw-alias."

// Satisfied is the alias target of a container thaw answers for itself: an init
// container of a pod being restored, which ran to its end in the pod the image
// was saved from, and which thaw reports as exited 0 without running it
// (go/internal/standin/satisfied.go). No runsc id can be it: runsc ids have no
// such prefix in thaw's roots (control/thawd/podrecord.py INIT_SATISFIED says why).
const Satisfied = "thaw-satisfied"

// Alias is the id of the sandbox that container id stands for in root, "" when
// it stands for itself. One readlink: it runs on every runsc call the shim makes.
func Alias(root, id string) string {
	if id == "" || strings.ContainsAny(id, "/\x00") {
		return ""
	}
	t, err := os.Readlink(root + "/" + AliasPrefix + id)
	if err != nil || t == "" || strings.ContainsAny(t, "/\x00") {
		return ""
	}
	return t
}
