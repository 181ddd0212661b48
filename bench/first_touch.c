/*
 * first_touch: how fast a process reads memory it filled before a checkpoint,
 * the first time after a runsc restore and again (bench/first_touch.py).
 *
 *   first_touch DIR MIB
 * fills MIB MiB (one anonymous mapping), writes DIR/ready, then for every
 * DIR/go-N that appears reads the whole mapping twice (8-byte loads) and
 * writes DIR/result-N: "pass1_ns pass2_ns checksum". The question it answers
 * (docs/gpu.md): the CUDA restore right after `runsc restore` copies the
 * process's host backup to the GPU at half the rate it reaches in a sandbox
 * that has run since (strace shows no syscall in that copy).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t pass(const uint64_t *p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += p[i];
  return s;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: first_touch DIR MIB\n"); return 2; }
  const char *dir = argv[1];
  size_t bytes = (size_t)atol(argv[2]) << 20, n = bytes / 8;
  uint64_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); return 1; }
  for (size_t i = 0; i < n; i++) p[i] = i * 0x9e3779b97f4a7c15ull;
  char path[512];
  snprintf(path, sizeof path, "%s/ready", dir);
  FILE *f = fopen(path, "w");
  if (!f) { perror(path); return 1; }
  fclose(f);
  for (int k = 1;; ) {
    snprintf(path, sizeof path, "%s/go-%d", dir, k);
    if (access(path, F_OK) != 0) { usleep(2000); continue; }
    uint64_t t0 = now_ns(), s1 = pass(p, n), t1 = now_ns(), s2 = pass(p, n), t2 = now_ns();
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/result-%d.tmp", dir, k);
    snprintf(path, sizeof path, "%s/result-%d", dir, k);
    f = fopen(tmp, "w");
    if (!f) { perror(tmp); return 1; }
    fprintf(f, "%llu %llu %llu\n", (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t1),
            (unsigned long long)(s1 ^ s2));
    fclose(f);
    rename(tmp, path);
    k++;
  }
}
