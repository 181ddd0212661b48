/*
 * Does a CUDA checkpoint toggle take over file descriptor numbers the application
 * reused? (docs/gvisor-notes.md, "EBADF listing a bind-mounted directory after a GPU
 * restore": all five failures came while the CUDA helper toggled the process listing
 * its spool, once as ENOTDIR, i.e. the directory's number then named a non-directory.)
 *
 *   fd_clobber DIR [SECONDS [PAUSE_US]]
 *
 * Loads libcuda.so.1 at run time (no toolkit needed to build: gcc -O2 -pthread -o
 * fd_clobber fd_clobber.c -ldl), makes a context and 256 MiB of device memory, prints
 * "threads main=T lister=T lister=T opener=T cuda=T" (thread ids, for a reader of a trace),
 * "ready PID" and then, until SECONDS pass (default 60) or SIGTERM:
 *   - two lister threads open DIR (O_DIRECTORY), read it with getdents64 and close it,
 *     as fast as they can, or PAUSE_US apart (a traced run; os.listdir in bench/gpu/server.py serve_spool); before
 *     reading and before closing they fstat the number and compare st_dev/st_ino with
 *     what they opened. A mismatch or a failed getdents64 is a CLOBBER line (the number,
 *     the errno, what /proc/self/fd/N names now); a clobbered number is not closed (it
 *     may be the driver's now) but left open;
 *   - one thread opens and closes /proc/self/status in a loop (other threads' opens
 *     that take a freed number, as a server's do);
 *   - one thread runs cuMemsetD8 every 10 ms (blocks while the process is locked).
 * SIGUSR1: open DIR 32 times and keep the numbers (call it while the process is
 * checkpointed: the lowest free numbers, those the toggle freed among them, become
 * directories); SIGUSR2: check every kept number is still that directory (HELD lines),
 * then close them. SIGWINCH, between the two: put /dev/null over the first held number
 * (a CONTROL line; the next check must report it as HELD). Every second a "tick" line with the counts; at the end one line:
 * "summary passes=N clobbers=N held_bad=N reidents=N" (REIDENT: the directory's inode
 * number changed, as a gVisor restore may do; not a clobber).
 * Built with -DFD_CLOBBER_NO_CUDA (the CPU rehearsal of bench/gpu/fd_clobber_sandbox.py)
 * it loads no libcuda and its CUDA thread only sleeps.
 * Exit 0 when nothing was clobbered, 1 when something was, 2 on a setup failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fd_name.h"

typedef int CUresult;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(unsigned long long *, size_t);
static CUresult (*cuMemsetD8)(unsigned long long, unsigned char, size_t);

static const char *dir;
static struct stat dir_st;
static void *ctx;
static unsigned long long dptr;
static atomic_long passes, clobbers, held_bad;
static atomic_int stop, want_hold, want_check, want_control;
static int held[32];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static pthread_mutex_t ident_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long reidents;

static int same(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return 0;
  pthread_mutex_lock(&ident_mu);
  int ok = st.st_dev == dir_st.st_dev && st.st_ino == dir_st.st_ino;
  if (!ok) {
    /* A restored gVisor sandbox may number the same directory anew (its gofer inode
     * numbers are the sentry's): the directory is still itself if the path now stats to
     * what the number does. Then every open number of it reads that way too. */
    struct stat now_st;
    if (stat(dir, &now_st) == 0 && now_st.st_dev == st.st_dev && now_st.st_ino == st.st_ino) {
      printf("REIDENT %.6f dev=%lu ino=%lu (was dev=%lu ino=%lu)\n", now(), (unsigned long)st.st_dev,
             (unsigned long)st.st_ino, (unsigned long)dir_st.st_dev, (unsigned long)dir_st.st_ino);
      fflush(stdout);
      dir_st = now_st;
      atomic_fetch_add(&reidents, 1);
      ok = 1;
    }
  }
  pthread_mutex_unlock(&ident_mu);
  return ok;
}

static void clobbered(const char *when, int fd, int err) {
  char now_is[512];
  fd_name(fd, now_is, sizeof now_is);
  atomic_fetch_add(&clobbers, 1);
  printf("CLOBBER %.6f tid=%ld %s fd=%d errno=%d (%s) now=%s\n", now(), (long)syscall(SYS_gettid), when, fd,
         err, err ? strerror(err) : "-", now_is);
  fflush(stdout);
}

static long pause_us;          /* argv[3]: a pause between listings (a traced run's log stays readable) */
static atomic_long tids[4];     /* each thread's id, for the "threads" line (a trace's reader drops their noise) */

static void *lister(void *arg) {
  atomic_store(&tids[(long)arg], syscall(SYS_gettid));
  char buf[8192];
  while (!atomic_load(&stop)) {
    if (pause_us) usleep(pause_us);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    if (!same(fd)) { clobbered("after-open", fd, 0); continue; }
    long r;
    while ((r = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {}
    if (r < 0) { clobbered("getdents64", fd, errno); continue; }
    if (!same(fd)) { clobbered("before-close", fd, 0); continue; }
    close(fd);
    atomic_fetch_add(&passes, 1);
  }
  return NULL;
}

static void *opener(void *arg) {
  atomic_store(&tids[(long)arg], syscall(SYS_gettid));
  while (!atomic_load(&stop)) {
    if (pause_us) usleep(pause_us);
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) close(fd);
  }
  return NULL;
}

static void *cuda(void *arg) {
  atomic_store(&tids[(long)arg], syscall(SYS_gettid));
#ifdef FD_CLOBBER_NO_CUDA
  while (!atomic_load(&stop)) usleep(10000);
  return NULL;
#endif
  cuCtxSetCurrent(ctx);
  while (!atomic_load(&stop)) {
    cuMemsetD8(dptr, 1, 1 << 20);
    usleep(10000);
  }
  return NULL;
}

static void on_signal(int sig) {
  if (sig == SIGUSR1) atomic_store(&want_hold, 1);
  else if (sig == SIGUSR2) atomic_store(&want_check, 1);
  else if (sig == SIGWINCH) atomic_store(&want_control, 1);
  else atomic_store(&stop, 1);
}

#define LOAD(h, name) if (!(*(void **)&name = dlsym(h, #name))) { fprintf(stderr, "no %s\n", #name); return 2; }

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: fd_clobber DIR [SECONDS]\n"); return 2; }
  dir = argv[1];
  double until = now() + (argc > 2 ? atof(argv[2]) : 60);
  pause_us = argc > 3 ? atol(argv[3]) : 0;
  if (stat(dir, &dir_st) != 0) { perror(dir); return 2; }
#ifndef FD_CLOBBER_NO_CUDA
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  LOAD(h, cuInit) LOAD(h, cuDeviceGet) LOAD(h, cuDevicePrimaryCtxRetain) LOAD(h, cuCtxSetCurrent)
  *(void **)&cuMemAlloc = dlsym(h, "cuMemAlloc_v2");
  *(void **)&cuMemsetD8 = dlsym(h, "cuMemsetD8_v2");
  int dev;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
      !cuMemAlloc || !cuMemsetD8 || cuMemAlloc(&dptr, 256 << 20)) {
    fprintf(stderr, "CUDA setup failed\n");
    return 2;
  }
#endif
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGWINCH, &sa, NULL);
  pthread_t t[4];
  pthread_create(&t[0], NULL, lister, (void *)0);
  pthread_create(&t[1], NULL, lister, (void *)1);
  pthread_create(&t[2], NULL, opener, (void *)2);
  pthread_create(&t[3], NULL, cuda, (void *)3);
  while (!atomic_load(&tids[0]) || !atomic_load(&tids[1]) || !atomic_load(&tids[2]) || !atomic_load(&tids[3]))
    usleep(1000);
  printf("threads main=%ld lister=%ld lister=%ld opener=%ld cuda=%ld\n", (long)syscall(SYS_gettid),
         atomic_load(&tids[0]), atomic_load(&tids[1]), atomic_load(&tids[2]), atomic_load(&tids[3]));
  printf("ready %d\n", getpid());
  fflush(stdout);
  int nheld = 0;
  double tick = now() + 1;
  while (!atomic_load(&stop) && now() < until) {
    if (now() >= tick) {    /* liveness, for a caller that cannot see the process */
      printf("tick %.6f passes=%ld clobbers=%ld held_bad=%ld\n", now(), atomic_load(&passes),
             atomic_load(&clobbers), atomic_load(&held_bad));
      fflush(stdout);
      tick = now() + 1;
    }
    if (atomic_exchange(&want_hold, 0)) {
      for (nheld = 0; nheld < 32; nheld++) held[nheld] = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      printf("HOLD %.6f fds", now());
      for (int i = 0; i < nheld; i++) printf(" %d", held[i]);
      printf("\n");
      fflush(stdout);
    }
    if (atomic_exchange(&want_control, 0) && nheld > 0) {
      /* The control: take over a held number as a clobber would; the check must say HELD. */
      int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (nul >= 0 && dup3(nul, held[0], O_CLOEXEC) >= 0) printf("CONTROL %.6f fd=%d\n", now(), held[0]);
      if (nul >= 0) close(nul);
      fflush(stdout);
    }
    if (atomic_exchange(&want_check, 0)) {
      for (int i = 0; i < nheld; i++) {
        if (held[i] < 0) continue;
        if (same(held[i])) { close(held[i]); continue; }
        char now_is[512];
        fd_name(held[i], now_is, sizeof now_is);
        atomic_fetch_add(&held_bad, 1);
        printf("HELD %.6f fd=%d is no longer the directory: now=%s\n", now(), held[i], now_is);
      }
      nheld = 0;
      printf("CHECKED %.6f\n", now());
      fflush(stdout);
    }
    usleep(1000);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  printf("summary passes=%ld clobbers=%ld held_bad=%ld reidents=%ld\n", atomic_load(&passes),
         atomic_load(&clobbers), atomic_load(&held_bad), atomic_load(&reidents));
  return atomic_load(&clobbers) || atomic_load(&held_bad) ? 1 : 0;
}
