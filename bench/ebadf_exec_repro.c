/*
 * The two programs of bench/ebadf_exec_repro.py in one static binary (docs/gvisor-notes.md,
 * "EBADF listing a bind-mounted directory after a GPU restore").
 *
 *   ebadf serve DIR       the workload: what bench/gpu/server.py serve_spool does to its
 *                         bind-mounted spool, without Python and without the 2 ms sleep:
 *                         list DIR (opendir/readdir/closedir = openat + getdents64 + close),
 *                         answer every NAME.req with NAME.resp (read it, unlink it, write
 *                         .resp.partial, rename), and make/remove a scratch file every pass.
 *                         On EBADF exits 3, on ENOTDIR 4, any other failure 5, after writing
 *                         one line to DIR/../fail.log.
 *   ebadf helper KIND ... what `runsc exec` runs, shaped like thaw's CUDA helper (a binary on
 *                         a read-only bind mount, libraries mapped from another bind mount,
 *                         one line on stdout):
 *                           fast           print "running", exit 0
 *                           mmap FILE      map FILE (on a bind mount) privately, touch every
 *                                          page, print, exit without unmapping
 *                           fds DIR N      open N files and directories of DIR (a bind mount),
 *                                          read some, exit without closing them
 *                           sleep S        print, sleep S seconds (the driver kills it)
 *                           spool DIR      list DIR once and stat every entry (the exec'd
 *                                          process shares the workload's directory dentries)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char faillog[4096];

static void fail(const char *what, const char *path, long pass) {
  int e = errno;
  int code = e == EBADF ? 3 : e == ENOTDIR ? 4 : 5;
  FILE *f = fopen(faillog, "a");
  if (f) {
    fprintf(f, "FAIL pass=%ld %s %s: errno %d (%s)\n", pass, what, path, e, strerror(e));
    fclose(f);
  }
  fprintf(stderr, "FAIL pass=%ld %s %s: errno %d (%s)\n", pass, what, path, e, strerror(e));
  exit(code);
}

static __attribute__((noreturn)) void serve(const char *dir) {
  snprintf(faillog, sizeof faillog, "%s/../fail.log", dir);
  char path[4096], out[4096], buf[512];
  for (long pass = 0;; pass++) {
    DIR *d = opendir(dir);
    if (!d) {
      if (errno == ENOENT) continue;   /* the driver may be emptying it */
      fail("opendir", dir, pass);
    }
    char reqs[16][256];
    int nreq = 0;
    errno = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      size_t n = strlen(e->d_name);
      if (nreq < 16 && n > 4 && n < 200 && strcmp(e->d_name + n - 4, ".req") == 0)
        snprintf(reqs[nreq++], sizeof reqs[0], "%s", e->d_name);
      errno = 0;
    }
    if (errno != 0) fail("readdir", dir, pass);
    if (closedir(d) != 0) fail("closedir", dir, pass);
    for (int i = 0; i < nreq; i++) {
      snprintf(path, sizeof path, "%.3000s/%.250s", dir, reqs[i]);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (errno == ENOENT) continue;
        fail("open", path, pass);
      }
      ssize_t got = read(fd, buf, sizeof buf - 1);
      if (got < 0) fail("read", path, pass);
      close(fd);
      unlink(path);
      size_t n = strlen(reqs[i]);
      snprintf(out, sizeof out, "%.3000s/%.*s.resp.partial", dir, (int)(n - 4), reqs[i]);
      fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) fail("create", out, pass);
      dprintf(fd, "{\"pass\": %ld}\n", pass);
      close(fd);
      snprintf(path, sizeof path, "%.3000s/%.*s.resp", dir, (int)(n - 4), reqs[i]);
      if (rename(out, path) != 0) fail("rename", out, pass);
    }
    snprintf(path, sizeof path, "%.3000s/scratch.%ld", dir, pass % 4);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("create", path, pass);
    close(fd);
    snprintf(path, sizeof path, "%.3000s/scratch.%ld", dir, (pass + 2) % 4);
    unlink(path);
  }
}

static int helper(int argc, char **argv) {
  const char *kind = argv[2];
  if (strcmp(kind, "fast") == 0) {
    puts("running");
    return 0;
  }
  if (strcmp(kind, "mmap") == 0 && argc > 3) {
    int fd = open(argv[3], O_RDONLY | O_CLOEXEC);
    if (fd < 0) { perror(argv[3]); return 1; }
    struct stat st;
    fstat(fd, &st);
    volatile unsigned char *p = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    close(fd);
    unsigned sum = 0;
    for (off_t o = 0; o < st.st_size; o += 4096) sum += p[o];
    printf("running %u\n", sum);
    return 0;
  }
  if (strcmp(kind, "fds") == 0 && argc > 4) {
    int n = atoi(argv[4]), opened = 0;
    char path[4096], buf[64];
    DIR *d = opendir(argv[3]);
    if (!d) { perror(argv[3]); return 1; }
    struct dirent *e;
    while (opened < n && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      snprintf(path, sizeof path, "%.3000s/%.250s", argv[3], e->d_name);
      int fd = open(path, O_RDONLY);
      if (fd >= 0) {
        if (read(fd, buf, sizeof buf) < 0) { /* a directory: fine */ }
        opened++;
      }
      int dfd = open(argv[3], O_RDONLY | O_DIRECTORY);
      if (dfd >= 0) opened++;
    }
    printf("running %d\n", opened);
    return 0;   /* every fd left open: the exit closes them */
  }
  if (strcmp(kind, "sleep") == 0 && argc > 3) {
    puts("running");
    fflush(stdout);
    sleep(atoi(argv[3]));
    return 0;
  }
  if (strcmp(kind, "spool") == 0 && argc > 3) {
    char path[4096];
    struct stat st;
    DIR *d = opendir(argv[3]);
    if (!d) { perror(argv[3]); return 1; }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
      snprintf(path, sizeof path, "%.3000s/%.250s", argv[3], e->d_name);
      stat(path, &st);
      n++;
    }
    closedir(d);
    printf("running %d\n", n);
    return 0;
  }
  fprintf(stderr, "ebadf helper: unknown kind %s\n", kind);
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "serve") == 0) serve(argv[2]);
  if (argc > 2 && strcmp(argv[1], "helper") == 0) return helper(argc, argv);
  fprintf(stderr, "usage: ebadf serve DIR | ebadf helper fast|mmap FILE|fds DIR N|sleep S|spool DIR\n");
  return 2;
}
