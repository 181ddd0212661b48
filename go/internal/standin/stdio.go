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
