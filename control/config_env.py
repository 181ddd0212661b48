"""The THAW_* environment variables that are not settings (control/config.py check_env
refuses every other THAW_* name)."""
from __future__ import annotations

# THAW_* variables that are not settings: each is read by one tool of thaw's own,
# never by load(). Every other THAW_* variable in load()'s environment is refused
# as an unknown key in a file is (issue 33): a misspelt THAW_STORE_ENDPOINT would
# otherwise leave the default in force without a word. tests/unit/test_config.py
# checks that every THAW_* name the repository spells is a key's or is here.
ENV_NOT_KEYS: dict[str, str] = {
    "THAW_CONFIG": "the config file (load)",
    "THAW_REAL_RUNSC": "the runsc the stand-in runs, for test harnesses (go/internal/standin/config.go)",
    "THAW_BUILD_DIR": "where ci/*.sh and the tests find the build",
    "THAW_LIBCUDA": "the libcuda the CUDA helper loads, for tests (nvproxy/helper.py)",
    "THAW_CUDA_CHECKPOINT_TIMING": "the CUDA helper's timing file (nvproxy/cuda_checkpoint)",
    "THAW_DEMO_MODEL_MB": "the demo workload's model size (control/dev/workloads/demo_server.py)",
    "THAW_CRI_SUBNET": "ci/cri.sh's pod subnet",
    "THAW_CRI_CDI_DIRS": "ci/cri.sh's CDI directories", "THAW_CRI_RUNSC_FLAGS": "ci/cri.sh's more runsc flags",
    "THAW_PYTHON": "the Python ci/release.sh builds the wheel with",
    "THAW_FAULTS_OUT": "fault tests' results file (tests/integration/faults)",
    "THAW_FAULTS_KILLS": "fault tests' kill count (tests/integration/faults)",
    "THAW_FAULTS_SEED": "fault tests' seed (tests/integration/faults)",
    "THAW_NODE_AGAIN": "bench/gpu/node.sh", "THAW_NODE_DRIVER": "bench/gpu/node.sh",
    "THAW_NODE_LIST": "bench/gpu/node.sh", "THAW_NODE_PARTS": "bench/gpu/node.sh",
    "THAW_NODE_SITE": "bench/gpu/node.sh", "THAW_NODE_STATE": "bench/gpu/node.sh",
    "THAW_NODE_WAIT_S": "bench/gpu/node.sh", "THAW_NODE_NAME": "bench/gpu/node.sh (pods.sh: pods)",
    "THAW_BENCH_BUDGET_S": "bench/gpu/run-*.sh", "THAW_BENCH_WORK": "bench/gpu/run-*.sh",
    "THAW_BENCH_UNPACK_ONLY": "bench/gpu/run-models.sh (run-fd-clobber.sh unpacks the carry)",
    "THAW_BENCH_GOFER_READERS": "bench/gpu/verified.py (experiments)",
    "THAW_BENCH_GOFER_READ_KIB": "bench/gpu/verified.py (experiments)",
    "THAW_LIFECYCLE_WORK": "bench/gpu/lifecycle.sh",
    "THAW_SPEED_MODELS": "bench/gpu/run-speed.sh", "THAW_SPEED_VARIANTS": "bench/gpu/run-speed.sh",
    "THAW_SPEED_8B_VARIANTS": "bench/gpu/run-speed.sh", "THAW_SPEED_BUDGET_S": "bench/gpu/run-speed.sh",
    "THAW_SPEED_DROP_CACHES": "bench/gpu/run-speed.sh",
    "THAW_FETCH": "bench/fetch_check_cost.py",
    "THAW_SOAK_COMMIT": "bench/gpu/soak.py: thaw's commit on the device copy (no .git there)",
    "THAW_SOAK_CYCLES": "the CPU soak's cycles per door (tests/integration/test_soak.py, docs/testing.md)",
}
