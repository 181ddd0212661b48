#!/usr/bin/env bash
# A restore soak on one GPU node (issue 32 item 3; bench/gpu/soak.py does the work,
# bench/gpu/README.md "GPU soak" says what comes back): bench/gpu/node.sh's calls and
# carry for soak.py, its state in /var/tmp/thaw-soak, soak.json and soak.log in $OUT.
#   On the GPU machine (`make carry-node` here first): the same command in consecutive
#   device calls, one per carry part, then without carry while it answers exit 4:
#     THAW_SOAK_COMMIT=<thaw commit> bash bench/gpu/soak.sh [soak.py args at the first call]
#   CPU rehearsal (tests/integration/test_gpu_node_rehearsal.py):
#     bash bench/gpu/soak.sh --cpu --work DIR --out DIR --soak 12
THAW_NODE_NAME=soak exec bash "$(dirname "$0")/node.sh" "$@"
