/*
 * LD_PRELOAD probe of libcuda's restore of its UVM descriptor (docs/gvisor-notes.md,
 * "EBADF listing a bind-mounted directory after a GPU restore": the cause).
 *
 * Inside a sandbox, runsc --strace showed libcuda 580.159.04's restore (the CUDA toggle
 * back to running) reopen /dev/nvidia-uvm at the lowest free number T, dup3(T, R) onto
 * the number the checkpoint kept with an eventfd, close(T), run UVM_INITIALIZE on R and
 * then close(T) a second time: whatever another thread opened at T in between is closed
 * under it. This shows whether the native driver does the same, without a sandbox or
 * strace: it wraps dup2/dup3/close of the process it is preloaded into and prints
 *
 *   UVMDUP tid old new                       a dup of a /dev/nvidia-uvm number
 *   UVMCLOSE1 tid fd rc was=PATH             the first close of that old number
 *   UVMCLOSE2 tid fd rc errno was=PATH       a second close of it by the same thread
 *                                            (was= what the number named just before)
 *
 * A reopen of the number by the same thread before its second close disarms it (that
 * close is then the thread's own). CLOSE_TRACE_WIDEN_US=N sleeps N us after UVMCLOSE1
 * (in libcuda's thread), widening the window in which another thread can take the
 * number, as the sandbox's slower ioctl does (~0.1-0.3 ms there).
 * CLOSE_TRACE_SHARING=1 sets UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE in the process's
 * UVM_INITIALIZE, as gVisor's nvproxy does for every sandboxed process (uvm.go
 * uvmInitialize), and hides it in the answer as nvproxy does. In that mode the driver has
 * no va_space_mm and answers UVM_MM_INITIALIZE with NV_WARN_NOTHING_TO_DO ("the MM FD is
 * not required and it may be released"), so libcuda runs with one UVM descriptor: the
 * sandbox's path, natively. UVMMM lines give each UVM_MM_INITIALIZE's status.
 * gcc -O2 -shared -fPIC -o close_trace.so close_trace.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fd_name.h"

static int (*real_close)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_ioctl)(int, unsigned long, void *);
static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static __thread int armed = -1, closed_once;

static void say(const char *fmt, ...) {
  char b[640];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (n > 0) (void)!write(2, b, n < (int)sizeof b ? n : (int)sizeof b - 1);
}

static void init(void) {
  if (!real_close) {
    real_close = dlsym(RTLD_NEXT, "close");
    real_dup2 = dlsym(RTLD_NEXT, "dup2");
    real_dup3 = dlsym(RTLD_NEXT, "dup3");
    real_ioctl = dlsym(RTLD_NEXT, "ioctl");
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
  }
}

static void dupped(int old, int new, int rc) {
  char was[256];
  fd_name(old, was, sizeof was);
  if (rc >= 0 && strstr(was, "nvidia-uvm")) {
    armed = old;
    closed_once = 0;
    say("UVMDUP %ld %d %d\n", (long)syscall(SYS_gettid), old, new);
  }
}

int dup3(int old, int new, int flags) {
  init();
  int rc = real_dup3(old, new, flags), e = errno;
  dupped(old, new, rc);
  errno = e;
  return rc;
}

int dup2(int old, int new) {
  init();
  int rc = real_dup2(old, new), e = errno;
  dupped(old, new, rc);
  errno = e;
  return rc;
}

#define UVM_INITIALIZE 0x30000001     /* twin: gVisor pkg/abi/nvgpu UVM_INITIALIZE */
#define UVM_MM_INITIALIZE 75          /* twin: gVisor pkg/abi/nvgpu UVM_MM_INITIALIZE */
#define UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE 0x2ULL

int ioctl(int fd, unsigned long req, ...) {
  init();
  va_list ap;
  va_start(ap, req);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  if (req == UVM_INITIALIZE && getenv("CLOSE_TRACE_SHARING")) {
    unsigned long long *flags = arg;   /* { NvU64 flags; NV_STATUS rmStatus; } */
    unsigned long long had = *flags & UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
    *flags |= UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
    int rc = real_ioctl(fd, req, arg), e = errno;
    if (!had) *flags &= ~UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE;
    say("UVMSHARING %ld %d rc=%d status=0x%x\n", (long)syscall(SYS_gettid), fd, rc, ((unsigned int *)arg)[2]);
    errno = e;
    return rc;
  }
  int rc = real_ioctl(fd, req, arg), e = errno;
  if (req == UVM_MM_INITIALIZE)         /* { int uvmFd; NV_STATUS rmStatus; } */
    say("UVMMM %ld %d rc=%d status=0x%x\n", (long)syscall(SYS_gettid), fd, rc, ((unsigned int *)arg)[1]);
  errno = e;
  return rc;
}

static int opened(int rc) {
  if (rc >= 0 && rc == armed && closed_once) armed = -1;   /* the thread's own file now */
  return rc;
}

int open(const char *path, int flags, ...) {
  init();
  va_list ap;
  va_start(ap, flags);
  int mode = va_arg(ap, int);
  va_end(ap);
  return opened(real_open(path, flags, mode));
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...) {
  init();
  va_list ap;
  va_start(ap, flags);
  int mode = va_arg(ap, int);
  va_end(ap);
  return opened(real_openat(dirfd, path, flags, mode));
}
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int close(int fd) {
  init();
  if (fd != armed || fd < 0) return real_close(fd);
  char was[256];
  fd_name(fd, was, sizeof was);
  int rc = real_close(fd), e = errno;
  if (!closed_once) {
    closed_once = 1;
    say("UVMCLOSE1 %ld %d %d was=%s\n", (long)syscall(SYS_gettid), fd, rc, was);
    const char *w = getenv("CLOSE_TRACE_WIDEN_US");
    if (w && atol(w) > 0) usleep(atol(w));
  } else {
    armed = -1;
    say("UVMCLOSE2 %ld %d %d %d was=%s\n", (long)syscall(SYS_gettid), fd, rc, rc < 0 ? e : 0, was);
  }
  errno = e;
  return rc;
}
