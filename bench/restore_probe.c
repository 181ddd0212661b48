/*
 * restore_probe: the workload of bench/restore_contention.py. Runs inside a
 * runsc sandbox; measures how fast the sandbox runs its processes while runsc
 * still loads the restored memory in the background (runsc restore
 * --background) and after.
 *
 *   restore_probe OUTFILE MIB    fill MIB of memory (saved with the checkpoint),
 *                                touch OUTFILE.ready, then loop forever
 *   restore_probe --noop         exit at once (what the loop spawns)
 *
 * Each 20 ms slot of the loop appends one line to OUTFILE:
 *   realtime_ns units syscalls max_syscall_ns spawn_ns
 * units: fixed slices of user-space arithmetic done in the slot's first
 * 10 ms (CPU the process got); syscalls: getppid() calls in its second 10 ms
 * (each a round trip through the sentry under systrap), max_syscall_ns the
 * slowest of them; spawn_ns: posix_spawn + wait of "--noop" (an exec
 * through the sentry, like runsc's cuda-checkpoint helper) just before the
 * slot, once every 5 slots, else 0. Lines are buffered and written every 10 slots.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int64_t now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static volatile uint64_t sink;

static void unit(void) {
  uint64_t x = sink + 1;
  for (int i = 0; i < 80000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  sink = x;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--noop") == 0) return 0;
  if (argc != 3) {
    fprintf(stderr, "usage: restore_probe OUTFILE MIB | --noop\n");
    return 2;
  }
  size_t bytes = (size_t)atol(argv[2]) << 20;
  unsigned char *mem = malloc(bytes);
  if (!mem) { perror("malloc"); return 1; }
  for (size_t i = 0; i < bytes; i += 4096) memset(mem + i, (int)(i >> 12) | 1, 4096);
  int fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) { perror("open"); return 1; }
  char ready[4096];
  snprintf(ready, sizeof ready, "%s.ready", argv[1]);
  close(open(ready, O_WRONLY | O_CREAT, 0644));

  static char buf[1 << 16];
  size_t len = 0;
  char *noop_argv[] = {argv[0], "--noop", NULL};
  for (uint64_t slot = 0;; slot++) {
    uint64_t units = 0, calls = 0;
    int64_t maxsc = 0, spawn_ns = 0;
    if (slot % 5 == 0) {
      int64_t t = now(CLOCK_MONOTONIC);
      pid_t pid;
      if (posix_spawn(&pid, argv[0], NULL, NULL, noop_argv, environ) == 0) waitpid(pid, NULL, 0);
      spawn_ns = now(CLOCK_MONOTONIC) - t;
    }
    int64_t end = now(CLOCK_MONOTONIC) + 20000000LL;
    /* First half of the slot: arithmetic only (CPU the process gets);
     * second half: getppid() only (round trips through the sentry). */
    int64_t mid = end - 10000000LL;
    while (now(CLOCK_MONOTONIC) < mid) {
      unit();
      units++;
    }
    while (now(CLOCK_MONOTONIC) < end) {
      int64_t t = now(CLOCK_MONOTONIC);
      syscall(SYS_getppid);
      int64_t d = now(CLOCK_MONOTONIC) - t;
      calls++;
      if (d > maxsc) maxsc = d;
    }
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%lld %llu %llu %lld %lld\n",
                            (long long)now(CLOCK_REALTIME), (unsigned long long)units,
                            (unsigned long long)calls, (long long)maxsc, (long long)spawn_ns);
    if (slot % 10 == 9 || len > sizeof buf - 256) {
      if (write(fd, buf, len) < 0) return 1;
      len = 0;
    }
    (void)mem;
  }
}
