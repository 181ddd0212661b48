package standin

import (
	"os"
	"syscall"
	"testing"
)

func TestWritableNullReopensReadOnlyDevNull(t *testing.T) {
	ro, err := os.Open(os.DevNull) // what go-runc's NewNullIO hands a container
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	fd := int(ro.Fd())
	if _, err := syscall.Write(fd, []byte("x")); err != syscall.EBADF {
		t.Fatalf("write to read-only /dev/null: %v, want EBADF", err)
	}
	done, err := writableNull(fd)
	if err != nil || len(done) != 1 || done[0] != fd {
		t.Fatalf("writableNull(%d) = %v, %v", fd, done, err)
	}
	if n, err := syscall.Write(fd, []byte("x")); err != nil || n != 1 {
		t.Fatalf("write after writableNull: %d, %v", n, err)
	}
	if got := stdioKindOf(t, fd); got != "null" {
		t.Fatalf("fd %d is %q after the reopen, want still /dev/null", fd, got)
	}
}

func TestWritableNullLeavesOthersAlone(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rw, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	done, err := writableNull(int(r.Fd()), int(rw.Fd()), 987)
	if err != nil || len(done) != 0 {
		t.Fatalf("writableNull of a pipe, a writable /dev/null and a closed fd = %v, %v; want none", done, err)
	}
}

func stdioKindOf(t *testing.T, fd int) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFCHR && (st.Rdev>>8)&0xfff == 1 && st.Rdev&0xff == 3 {
		return "null"
	}
	return "other"
}
