/*
 * thaw-cuda-checkpoint: toggles a CUDA process between running and
 * checkpointed through the CUDA driver checkpoint API (cuCheckpointProcess*),
 * with libcuda loaded at run time (no CUDA toolkit needed to build it).
 *
 * runsc runs it inside the sandbox (runsc checkpoint --cuda-checkpoint-path,
 * gVisor pkg/sentry/control/state_cuda.go) as:
 *   cuda-checkpoint --get-state --pid N   print running|locked|checkpointed|failed
 *   cuda-checkpoint --toggle --pid N      running -> locked -> checkpointed, or
 *                                         checkpointed -> restored -> running
 * and operators can step through it by hand:
 *   --action lock|checkpoint|restore|unlock --pid N [--timeout MS]
 * --timing adds one line to stderr with the seconds each step took
 * ("thaw-cuda-checkpoint timing: dlopen=0.000812 cuInit=0.104000 ...
 * total=1.230000"; parsed by nvproxy/helper.py parse_timing): how much of a
 * toggle is the helper's fixed cost (loading libcuda, cuInit) and how much
 * the driver's work (issue 17; NVIDIA/nvcf#437 measured seconds per spawn).
 * THAW_CUDA_CHECKPOINT_TIMING=FILE in the environment appends the same line,
 * with the mode, pid and the wall-clock second it started, to FILE (and not to
 * stderr unless --timing): runsc runs the helper at restore with the
 * container's environment and keeps its output only in a debug log
 * (state_cuda.go invokeCudaCheckpoint), so that is how a benchmark sees the
 * steps of the toggle runsc starts; runsc reads --get-state's stdout and
 * stderr as one, so nothing more may go there.
 *
 * Exit codes (twin: nvproxy/helper.py EXIT_*):
 *   0 ok, 1 the driver refused the operation (its error name is printed),
 *   2 usage error, 3 libcuda.so.1 could not be loaded,
 *   4 the driver has no checkpoint API (needs R555 or later),
 *   5 the process is in a state the toggle cannot move from.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
/* Every *Args struct of the API is 64 bytes whose fields we leave zero
 * (no lock timeout unless given, no GPU remapping on restore). */
typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } lock_args;
typedef struct { unsigned long long reserved[8]; } plain_args;

enum { ST_RUNNING = 0, ST_LOCKED = 1, ST_CHECKPOINTED = 2, ST_FAILED = 3 };
enum { EXIT_OK = 0, EXIT_DRIVER = 1, EXIT_USAGE = 2, EXIT_NO_LIBCUDA = 3, EXIT_NO_API = 4, EXIT_STATE = 5 };

static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuGetErrorName)(CUresult, const char **);
static CUresult (*p_getState)(int, int *);
static CUresult (*p_lock)(int, lock_args *);
static CUresult (*p_checkpoint)(int, plain_args *);
static CUresult (*p_restore)(int, plain_args *);
static CUresult (*p_unlock)(int, plain_args *);

/* --timing: the steps' durations, printed once at exit. */
static int timing;          /* the steps are timed (--timing or the timing file) */
static int timing_stderr;   /* --timing: the line goes to stderr */
static char timing_buf[256];
static size_t timing_len;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void took(const char *step, double since) {
  if (!timing || timing_len >= sizeof timing_buf) return;
  int n = snprintf(timing_buf + timing_len, sizeof timing_buf - timing_len, " %s=%.6f", step, now() - since);
  if (n > 0) timing_len += (size_t)n;
}

static const char *state_name(int s) {
  switch (s) {
  case ST_RUNNING: return "running";
  case ST_LOCKED: return "locked";
  case ST_CHECKPOINTED: return "checkpointed";
  case ST_FAILED: return "failed";
  default: return "unknown";
  }
}

static int fail(const char *what, int pid, CUresult r) {
  const char *name = NULL;
  if (p_cuGetErrorName == NULL || p_cuGetErrorName(r, &name) != 0 || name == NULL) name = "unknown";
  if (pid > 0)
    fprintf(stderr, "thaw-cuda-checkpoint: %s of pid %d failed: %s (%d)\n", what, pid, name, r);
  else
    fprintf(stderr, "thaw-cuda-checkpoint: %s failed: %s (%d)\n", what, name, r);
  return EXIT_DRIVER;
}

static int load(void) {
  const char *lib = getenv("THAW_LIBCUDA");
  double t = now();
  void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  took("dlopen", t);
  if (h == NULL) {
    fprintf(stderr, "thaw-cuda-checkpoint: cannot load %s: %s (is the NVIDIA driver mounted in this container?)\n",
            lib && *lib ? lib : "libcuda.so.1", dlerror());
    return EXIT_NO_LIBCUDA;
  }
  p_cuInit = dlsym(h, "cuInit");
  p_cuGetErrorName = dlsym(h, "cuGetErrorName");
  p_getState = dlsym(h, "cuCheckpointProcessGetState");
  p_lock = dlsym(h, "cuCheckpointProcessLock");
  p_checkpoint = dlsym(h, "cuCheckpointProcessCheckpoint");
  p_restore = dlsym(h, "cuCheckpointProcessRestore");
  p_unlock = dlsym(h, "cuCheckpointProcessUnlock");
  if (!p_cuInit || !p_getState || !p_lock || !p_checkpoint || !p_restore || !p_unlock) {
    fprintf(stderr, "thaw-cuda-checkpoint: this libcuda has no cuCheckpointProcess* API (driver R555 or later needed)\n");
    return EXIT_NO_API;
  }
  t = now();
  CUresult r = p_cuInit(0);
  took("cuInit", t);
  if (r != 0) return fail("cuInit", 0, r);
  return EXIT_OK;
}

static int do_action(const char *action, int pid, unsigned int timeout_ms) {
  CUresult r = 0;
  double t = now();
  int rc = EXIT_OK;
  if (strcmp(action, "lock") == 0) {
    lock_args a; memset(&a, 0, sizeof a); a.timeoutMs = timeout_ms;
    r = p_lock(pid, &a);
  } else if (strcmp(action, "checkpoint") == 0) {
    plain_args a; memset(&a, 0, sizeof a);
    r = p_checkpoint(pid, &a);
  } else if (strcmp(action, "restore") == 0) {
    plain_args a; memset(&a, 0, sizeof a);
    r = p_restore(pid, &a);
  } else if (strcmp(action, "unlock") == 0) {
    plain_args a; memset(&a, 0, sizeof a);
    r = p_unlock(pid, &a);
  } else {
    fprintf(stderr, "thaw-cuda-checkpoint: unknown --action %s (want lock, checkpoint, restore or unlock)\n", action);
    return EXIT_USAGE;
  }
  took(action, t);
  if (r != 0) rc = fail(action, pid, r);
  return rc;
}

static int toggle(int pid, unsigned int timeout_ms) {
  int st = -1, rc;
  double t = now();
  CUresult r = p_getState(pid, &st);
  took("get-state", t);
  if (r != 0) return fail("get-state", pid, r);
  switch (st) {
  case ST_RUNNING:
    if ((rc = do_action("lock", pid, timeout_ms)) != 0) return rc;
    /* fall through */
  case ST_LOCKED:
    return do_action("checkpoint", pid, timeout_ms);
  case ST_CHECKPOINTED:
    if ((rc = do_action("restore", pid, timeout_ms)) != 0) return rc;
    return do_action("unlock", pid, timeout_ms);
  default:
    fprintf(stderr, "thaw-cuda-checkpoint: pid %d is %s; toggle moves only running or checkpointed processes\n",
            pid, state_name(st));
    return EXIT_STATE;
  }
}

static int run(const char *mode, const char *action, int pid, unsigned int timeout_ms) {
  int rc = load();
  if (rc != EXIT_OK) return rc;
  if (strcmp(mode, "--get-state") == 0) {
    int st = -1;
    double t = now();
    CUresult r = p_getState(pid, &st);
    took("get-state", t);
    if (r != 0) return fail("get-state", pid, r);
    printf("%s\n", state_name(st));
    return EXIT_OK;
  }
  if (strcmp(mode, "--toggle") == 0) return toggle(pid, timeout_ms);
  return do_action(action, pid, timeout_ms);
}

static int usage(const char *msg) {
  if (msg) fprintf(stderr, "thaw-cuda-checkpoint: %s\n", msg);
  fprintf(stderr, "usage: thaw-cuda-checkpoint (--get-state | --toggle | --action lock|checkpoint|restore|unlock)"
                  " --pid N [--timeout MS] [--timing]\n");
  return EXIT_USAGE;
}

static int parse_uint(const char *s, long max, long *out) {
  char *end; errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *s == '\0' || *end != '\0' || v < 0 || v > max) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = NULL, *action = NULL;
  long pid = -1, timeout = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    const char *eq = strchr(a, '=');
    char key[32];
    if (eq && (size_t)(eq - a) < sizeof key) { memcpy(key, a, eq - a); key[eq - a] = 0; a = key; val = eq + 1; }
    if (strcmp(a, "--timing") == 0 && !val) {
      timing = timing_stderr = 1;
    } else if (strcmp(a, "--get-state") == 0 || strcmp(a, "--toggle") == 0) {
      if (mode) return usage("give one of --get-state, --toggle, --action");
      mode = a;
    } else if (strcmp(a, "--action") == 0 || strcmp(a, "--pid") == 0 || strcmp(a, "--timeout") == 0) {
      if (!val) { if (++i >= argc) return usage("a flag is missing its value"); val = argv[i]; }
      if (strcmp(a, "--action") == 0) {
        if (mode) return usage("give one of --get-state, --toggle, --action");
        mode = "--action"; action = val;
      } else if (strcmp(a, "--pid") == 0) {
        if (parse_uint(val, 0x7fffffff, &pid) != 0 || pid == 0) return usage("--pid wants a positive integer");
      } else if (parse_uint(val, 0xffffffffL, &timeout) != 0) {
        return usage("--timeout wants milliseconds (a non-negative integer)");
      }
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(NULL);
      return EXIT_OK;
    } else {
      fprintf(stderr, "thaw-cuda-checkpoint: unknown argument %s\n", argv[i]);
      return usage(NULL);
    }
  }
  const char *timing_file = getenv("THAW_CUDA_CHECKPOINT_TIMING");
  if (timing_file && *timing_file) timing = 1;
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  if (!mode) return usage("nothing to do");
  if (pid <= 0) return usage("--pid is required");
  /* Check the action before loading libcuda, so a typo is a usage error
   * (exit 2) on every machine, with or without a driver. */
  if (action && strcmp(action, "lock") != 0 && strcmp(action, "checkpoint") != 0 &&
      strcmp(action, "restore") != 0 && strcmp(action, "unlock") != 0) {
    fprintf(stderr, "thaw-cuda-checkpoint: unknown --action %s (want lock, checkpoint, restore or unlock)\n", action);
    return usage(NULL);
  }
  double start = now();
  int rc = run(mode, action, (int)pid, (unsigned int)timeout);
  if (timing_stderr) fprintf(stderr, "thaw-cuda-checkpoint timing:%s total=%.6f\n", timing_buf, now() - start);
  if (timing_file && *timing_file) {
    FILE *f = fopen(timing_file, "a");
    if (f) {
      fprintf(f, "thaw-cuda-checkpoint timing: mode=%s pid=%ld rc=%d started=%lld.%06ld%s total=%.6f\n",
              action ? action : mode + 2, pid, rc, (long long)wall.tv_sec, wall.tv_nsec / 1000, timing_buf,
              now() - start);
      fclose(f);
    }
  }
  return rc;
}
