package standin

import (
	"strings"
	"syscall"
)

// stdioKinds says what this process's descriptors 0, 1 and 2 are (the shim's
// stdio for the container): PrepareRestoreRequest.stdio. Twin:
// control/thawd/containers.py STDIO_KINDS.
func stdioKinds() string {
	kinds := make([]string, 3)
	for fd := 0; fd < 3; fd++ {
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			kinds[fd] = "none"
			continue
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFIFO:
			kinds[fd] = "pipe"
		case syscall.S_IFREG:
			kinds[fd] = "file"
		case syscall.S_IFSOCK:
			kinds[fd] = "socket"
		case syscall.S_IFCHR:
			major, minor := (st.Rdev>>8)&0xfff, (st.Rdev&0xff)|((st.Rdev>>12)&0xfff00)
			switch {
			case major == 1 && minor == 3:
				kinds[fd] = "null"
			case major == 136 || major == 5 || major == 4:
				kinds[fd] = "tty"
			default:
				kinds[fd] = "char"
			}
		default:
			kinds[fd] = "other"
		}
	}
	return strings.Join(kinds, ",")
}

// writableNull gives each of fds that is /dev/null opened read-only a /dev/null
// that can be written, as runc's init does for a container's stdio
// (opencontainers/runc#309). containerd's shims hand a container without I/O
// (`ctr run --null-io`, go-runc NewNullIO) os.Open("/dev/null") -- read-only --
// as its stdout and stderr; runc reopens it, but runsc imports host FDs with
// their flags, so every write of the workload fails with EBADF and a server
// that logs its first line dies on it (docs/gvisor-notes.md). Returns the fds it
// reopened.
func writableNull(fds ...int) ([]int, error) {
	var done []int
	for _, fd := range fds {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR ||
			(st.Rdev>>8)&0xfff != 1 || st.Rdev&0xff != 3 {
			continue
		}
		fl, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
		if errno != 0 || fl&syscall.O_ACCMODE != syscall.O_RDONLY {
			continue
		}
		null, err := syscall.Open("/dev/null", syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return done, err
		}
		// dup3 keeps fd's close-on-exec flag clear: runsc must inherit it.
		err = syscall.Dup3(null, fd, 0)
		syscall.Close(null)
		if err != nil {
			return done, err
		}
		done = append(done, fd)
	}
	return done, nil
}
