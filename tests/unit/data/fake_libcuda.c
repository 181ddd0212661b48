/*
 * A stand-in for libcuda.so.1 in tests of thaw-cuda-checkpoint (no GPU on CI).
 * Built with -DNO_CHECKPOINT_API it exports only cuInit/cuGetErrorName, like a
 * driver older than R555.
 *   FAKE_CUDA_STATE  the state cuCheckpointProcessGetState reports:
 *                    running | locked | checkpointed | failed (default running)
 *   FAKE_CUDA_FAIL   the operation that returns error 999 (CUDA_ERROR_UNKNOWN):
 *                    init | get-state | lock | checkpoint | restore | unlock
 *   FAKE_CUDA_LOG    a file each call appends "<op> <pid> [timeout]" to
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } lock_args;

static void note(const char *op, int pid, long timeout) {
  const char *p = getenv("FAKE_CUDA_LOG");
  if (!p) return;
  FILE *f = fopen(p, "a");
  if (!f) return;
  if (timeout >= 0) fprintf(f, "%s %d %ld\n", op, pid, timeout);
  else fprintf(f, "%s %d\n", op, pid);
  fclose(f);
}

static int failing(const char *op) {
  const char *f = getenv("FAKE_CUDA_FAIL");
  return f && strcmp(f, op) == 0 ? 999 : 0;
}

int cuInit(unsigned int flags) { (void)flags; note("init", 0, -1); return failing("init"); }

int cuGetErrorName(int r, const char **name) {
  *name = r == 999 ? "CUDA_ERROR_UNKNOWN" : "CUDA_SUCCESS";
  return 0;
}

#ifndef NO_CHECKPOINT_API
int cuCheckpointProcessGetState(int pid, int *state) {
  const char *s = getenv("FAKE_CUDA_STATE");
  note("get-state", pid, -1);
  if (!s || strcmp(s, "running") == 0) *state = 0;
  else if (strcmp(s, "locked") == 0) *state = 1;
  else if (strcmp(s, "checkpointed") == 0) *state = 2;
  else *state = 3;
  return failing("get-state");
}
int cuCheckpointProcessLock(int pid, lock_args *a) { note("lock", pid, a->timeoutMs); return failing("lock"); }
int cuCheckpointProcessCheckpoint(int pid, void *a) { (void)a; note("checkpoint", pid, -1); return failing("checkpoint"); }
int cuCheckpointProcessRestore(int pid, void *a) { (void)a; note("restore", pid, -1); return failing("restore"); }
int cuCheckpointProcessUnlock(int pid, void *a) { (void)a; note("unlock", pid, -1); return failing("unlock"); }
#endif
