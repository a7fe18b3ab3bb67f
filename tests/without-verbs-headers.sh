#!/usr/bin/env bash
# Run a command as a build machine without libibverbs-dev would: the system's verbs headers
# (/usr/include/infiniband, /usr/include/rdma) are hidden under empty tmpfs mounts in a private
# mount namespace (unshare; as a mapped root user when not root). Nothing outside the command
# sees the change. Used by tests/test_build.py and .ci/run to show that the build does not need
# them (it uses third_party/rdma-core).
#   tests/without-verbs-headers.sh pip wheel --no-deps -w dist .
set -euo pipefail
if [[ ${1:-} == --inside ]]; then
    shift
    for dir in /usr/include/infiniband /usr/include/rdma; do
        if [[ -d $dir ]]; then mount -t tmpfs -o size=1m,mode=755 rdmaxfer-hidden "$dir"; fi
    done
    exec "$@"
fi
if [[ $# -eq 0 ]]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
if [[ $(id -u) -eq 0 ]]; then
    exec unshare --mount --propagation private "$0" --inside "$@"
fi
exec unshare --map-root-user --mount --propagation private "$0" --inside "$@"
