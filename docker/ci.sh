#!/usr/bin/env bash
# Build docker/Dockerfile from this checkout and run docker/compose.yaml's two-container demo
# over TCP: `serve` publishes the all-MiniLM-L6-v2 weights, `pull` reads every tensor into
# NumPy arrays and writes them out, and the pulled file must equal the image's byte for byte.
# CI runs this (.ci/run); run it as root on a Debian 12 machine:  docker/ci.sh
#
# Engine: docker when its daemon answers, otherwise podman (apt packages podman, runc and
# mmdebstrap installed if missing; podman-compose from PyPI into the temporary directory).
# No image registry is needed: the base image is made with mmdebstrap from the Debian mirror
# this machine's apt uses. RDMAXFER_BASE_IMAGE=IMAGE uses a Debian 12 image the engine has
# or can pull instead (it is kept). RDMAXFER_DEMO_RUNS=N runs the demo N times (default 1).
# pip inside the build reaches the package index the way this machine's pip does: its index,
# proxy and timeout settings and its CA bundle go in as build secrets (never into a layer).
# On exit, whatever happened, the containers, network and images it made and its temporary
# directory (podman's configuration: CONTAINERS_CONF) are removed; on the host only the apt
# packages remain.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

start=$SECONDS
step() { printf '\n---- docker/ci.sh: %s (%s, +%ds)\n' "$*" "$(date -u +%H:%M:%S)" $((SECONDS - start)); }
fail() {
    echo "docker/ci.sh: $*" >&2
    exit 1
}
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

tmp=$(mktemp -d /tmp/rdmaxfer-docker.XXXXXX)
tag=ci-$$
image=rdmaxfer:$tag
base=${RDMAXFER_BASE_IMAGE:-}
project=rdmaxfer-$tag
engine=
compose=()
made=()
demo_up=

cleanup() {
    local status=$?
    [[ -z $demo_up ]] || "${compose[@]}" down -t 10 > /dev/null 2>&1 || true
    if [[ -n $engine ]]; then
        local left
        mapfile -t left < <("$engine" ps -aq --filter "label=com.docker.compose.project=$project" 2> /dev/null)
        [[ ${#left[@]} -eq 0 ]] || "$engine" rm -f "${left[@]}" > /dev/null 2>&1 || true
        [[ ${#made[@]} -eq 0 ]] || "$engine" rmi -f "${made[@]}" > /dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT

apt_install() {
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q "$@" > /dev/null || {
        timeout 600 apt-get update -q > /dev/null &&
            DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q "$@" > /dev/null
    }
}

# Writes $tmp/pip.conf for the build from this machine's pip settings (its local paths, such as
# file:// indexes, find-links and constraints, are left out: the build cannot see them) and
# prints the CA bundle the build's pip is to trust (empty: none).
pip_build_config() {
    python3 - "$tmp/pip.conf" << 'EOF'
import ast, os, subprocess, sys

listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
).stdout
rank = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence for `pip install`
found = {}
for line in listing.splitlines():
    name, _, raw = line.partition("=")
    section, _, key = name.rpartition(".")
    key = "timeout" if key == "default-timeout" else key
    if section in rank and rank[section] >= found.get(key, (-1, ""))[0]:
        found[key] = (rank[section], ast.literal_eval(raw))
settings = {k: v for k, (_, v) in found.items() if k in ("proxy", "trusted-host", "timeout", "retries")}
remote = ("http://", "https://")
if found.get("index-url", (0, ""))[1].startswith(remote):
    settings["index-url"] = found["index-url"][1]
extra = [u for u in found.get("extra-index-url", (0, ""))[1].split() if u.startswith(remote)]
if extra:
    settings["extra-index-url"] = " ".join(extra)
cert = found.get("cert", (0, ""))[1] or "/etc/ssl/certs/ca-certificates.crt"
if os.path.isfile(cert):
    settings["cert"] = "/run/secrets/pipca"
    print(cert)
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items())))
EOF
}

step "container engine"
if command -v docker > /dev/null && timeout 30 docker info > /dev/null 2>&1; then
    engine=docker
    if docker compose version > /dev/null 2>&1; then
        compose=(docker compose)
    elif command -v docker-compose > /dev/null; then
        compose=(docker-compose)
    else
        fail "docker has no compose: install the docker-compose-plugin package"
    fi
else
    if command -v docker > /dev/null; then
        echo "docker: the client is here but no daemon answers (docker info failed): using podman"
    fi
    engine=podman
    need=()
    for tool in podman runc; do command -v "$tool" > /dev/null || need+=("$tool"); done
    [[ ${#need[@]} -eq 0 ]] || apt_install "${need[@]}"
    # podman's own settings, for this script only: runc (crun refuses hybrid cgroup
    # hierarchies), cgroupfs without systemd, and container ulimits no higher than podman's
    # own, which runc cannot raise: the hard nofile here (podman's default of 1048576 fails
    # where it is lower) and nproc at most 32768 (podman 4.3 runs itself with that).
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    [[ $nofile != unlimited && $nofile -lt 1048576 ]] || nofile=1048576
    [[ $nproc != unlimited && $nproc -lt 32768 ]] || nproc=32768
    {
        echo "[containers]"
        echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
        echo "[engine]"
        echo 'runtime = "runc"'
        echo 'events_logger = "file"'
        [[ -d /run/systemd/system ]] || echo 'cgroup_manager = "cgroupfs"'
    } > "$tmp/containers.conf"
    export CONTAINERS_CONF=$tmp/containers.conf
    python3 -m venv "$tmp/compose-venv"
    "$tmp/compose-venv/bin/pip" install -q podman-compose==1.6.0
    compose=("$tmp/compose-venv/bin/podman-compose")
fi
compose+=(-p "$project" -f docker/compose.yaml)
export RDMAXFER_IMAGE=$image
"$engine" --version

if [[ -z $base ]]; then
    step "base image: Debian 12 minbase from this machine's mirror (mmdebstrap)"
    command -v mmdebstrap > /dev/null || apt_install mmdebstrap
    # The bookworm suites this machine's apt fetches (empty: mmdebstrap's deb.debian.org).
    # shellcheck disable=SC2016
    mapfile -t mirrors < <(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
        'Identifier: Packages' |
        awk '$2 ~ /^bookworm(-updates|-security)?$/ && $3 == "main" { print "deb " $1 " " $2 " main" }' |
        sort -u)
    base=rdmaxfer-base:$tag
    made+=("$base")
    # Like Docker's debian:*-slim: merged /usr by symlinks, without the usrmerge
    # package and the perl it pulls in, and no manuals, documentation (copyrights kept) or
    # translations. Its chatter goes to a log, shown if it fails.
    {
        mmdebstrap --variant=minbase --quiet --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            bookworm - "${mirrors[@]}" 2> "$tmp/mmdebstrap.log" || {
            cat "$tmp/mmdebstrap.log" >&2
            false
        }
    } | "$engine" import - "$base" > /dev/null
    base_size=$("$engine" image inspect -f '{{.Size}}' "$base")
    echo "$base: $((base_size / 1000000)) MB"
fi

step "build $image from this checkout (base $base)"
build=(-f docker/Dockerfile -t "$image" --build-arg "BASE_IMAGE=$base"
    --secret "id=pipconf,src=$tmp/pip.conf")
ca=$(pip_build_config)
[[ -z $ca ]] || build+=(--secret "id=pipca,src=$ca")
for var in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [[ -z ${!var:-} ]] || build+=(--build-arg "$var=${!var}")
done
if [[ $engine == podman ]]; then
    # docker format: the image keeps its SHELL; no intermediate images; BuildKit reads the
    # ignore file next to the Dockerfile by itself, podman needs it named.
    build+=(--format docker --layers=false --ignorefile docker/Dockerfile.dockerignore)
fi
made+=("$image")
"$engine" build "${build[@]}" .
size=$("$engine" image inspect -f '{{.Size}}' "$image")
echo "image $image: $((size / 1000000)) MB"
# shellcheck disable=SC2016
"$engine" run --rm --entrypoint bash "$image" -c \
    'for c in cc gcc g++ c++ cpp clang; do ! command -v "$c" || exit 1; done' ||
    fail "the final stage has a compiler (above); it belongs in the build stage only"

# The compose file's health check gates pull. podman 4.3 runs health checks from systemd
# timers only (without systemd it logs "unable to get systemd connection", harmless here), so
# run it here; docker runs it every 2 s by itself.
healthy() {
    if [[ $engine == podman ]]; then
        podman healthcheck run "$1" > /dev/null 2>&1
    else
        [[ $(docker inspect -f '{{.State.Health.Status}}' "$1") == healthy ]]
    fi
}

# One run of the demo: serve up, wait until healthy, pull into $tmp/data, compare with the
# image's file, stop serve (SIGTERM: exit code 0 within 5 s), everything down.
demo() {
    local serve wait_start deadline stop_start stop_s code pulled=$tmp/data/pulled/model.safetensors
    demo_up=1
    "${compose[@]}" up -d --no-build serve
    serve=$("$engine" ps -aq --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=serve")
    [[ -n $serve ]] || fail "compose started no serve container"
    wait_start=$EPOCHREALTIME
    deadline=$((SECONDS + 60))
    until healthy "$serve"; do
        if [[ $("$engine" inspect -f '{{.State.Status}}' "$serve") != running ]]; then
            "$engine" logs "$serve" >&2 || true
            fail "serve exited before it was healthy"
        fi
        ((SECONDS < deadline)) || fail "serve not healthy after 60 s"
        sleep 0.5
    done
    echo "serve healthy after $(seconds_since "$wait_start") s"
    rm -rf "$tmp/data"
    mkdir -m 0777 "$tmp/data" # pull runs as uid 1000
    "${compose[@]}" run --rm --no-deps -T -v "$tmp/data:/data" pull
    cmp "$pulled" "$tmp/image.safetensors" || fail "the pulled weights differ from the image's"
    echo "pulled file bit-exact: $(stat -c %s "$pulled") bytes, sha256 $(sha256sum < "$pulled" | cut -c1-64)"

    stop_start=$EPOCHREALTIME
    "$engine" stop -t 10 "$serve" > /dev/null
    stop_s=$(seconds_since "$stop_start")
    code=$("$engine" inspect -f '{{.State.ExitCode}}' "$serve")
    echo "serve: $("$engine" logs "$serve" 2>&1 | tail -n 1); stopped in $stop_s s, exit code $code"
    [[ $code == 0 ]] || fail "serve exited with $code on SIGTERM"
    [[ ${stop_s%.*} -lt 5 ]] || fail "serve took $stop_s s to stop on SIGTERM"
    "${compose[@]}" down -t 10 > /dev/null 2>&1
    demo_up=
}

"$engine" run --rm --entrypoint cat "$image" /opt/model/model.safetensors > "$tmp/image.safetensors"
echo "the image's weights: sha256 $(sha256sum < "$tmp/image.safetensors" | cut -c1-64)"
chmod 0755 "$tmp"
runs=${RDMAXFER_DEMO_RUNS:-1}
for ((run = 1; run <= runs; run++)); do
    step "demo over TCP, run $run of $runs: serve, its health check, pull, bit-exact, SIGTERM"
    demo
done

echo "docker/ci.sh: passed with $engine in $((SECONDS - start)) s (image $((size / 1000000)) MB, demo runs $runs)"
