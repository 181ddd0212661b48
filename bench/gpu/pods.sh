#!/usr/bin/env bash
# GPU pods across two nodes on one machine (issue 28; bench/gpu/pods.py does the work,
# bench/gpu/README.md "GPU pods" says what comes back): bench/gpu/node.sh's calls and
# carry for pods.py, its state in /var/tmp/thaw-pods, pods.json, pods.log and
# pods-logs.tar.xz in $OUT.
#
#   On the GPU machine (`make carry-node` here first), the same command in consecutive
#   device calls, one per carry part, then without carry while it answers exit 4:
#     bash bench/gpu/pods.sh [pods.py args at the call that starts the run]
#   CPU rehearsal (tests/integration/test_gpu_pods_rehearsal.py):
#     bash bench/gpu/pods.sh --cpu --work DIR --out DIR [pods.py args]
THAW_NODE_NAME=pods exec bash "$(dirname "$0")/node.sh" "$@"
