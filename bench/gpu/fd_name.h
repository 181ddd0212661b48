/*
 * What a file descriptor number names now, for the EBADF hunt's two C probes
 * (fd_clobber.c, close_trace.c; docs/gvisor-notes.md): the /proc/self/fd link, or
 * "(closed: ERRNO)" when the number names nothing. Leaves errno as it found it, so a
 * wrapper of close/dup can call it between the real call and its own return.
 */
#pragma once

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void fd_name(int fd, char *out, size_t n) {
  int saved = errno;
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(p, out, n - 1);
  out[k < 0 ? 0 : k] = 0;
  if (k < 0) snprintf(out, n, "(closed: %s)", strerror(errno));
  errno = saved;
}
