#!/usr/bin/env bash
# Reference numbers from perftest between the two rxe devices of the test VM; run it inside
# the VM, e.g.
#
#   tests/rxe/run-in-vm.sh -- tests/rxe/perftest-ref.sh -n 200 -o bench/ref.jsonl 2 4096 65536
#
# Usage: perftest-ref.sh [-n ITERS] [-t bw|lat|both] [-d DEPTH] [-T SECONDS] [-r RETRIES]
#                        [-o FILE] SIZE...
#   -n ITERS     iterations per test (default 200; perftest's -n; -D duration mode is unreliable
#                under TCG)
#   -t WHICH     ib_write_bw, ib_write_lat or both (default both)
#   -d DEPTH     ib_write_bw's send queue depth (perftest's --tx-depth; default perftest's 128)
#   -T SECONDS   time limit of each server and client process (default 120)
#   -r RETRIES   connection attempts per test (default 3)
#   -o FILE      also append the JSON lines to FILE
#   SIZE...      message sizes in bytes (default: 2 4096 65536)
#
# The server runs on the second device of RDMAXFER_RXE_DEVICES (rxe1, 10.77.0.2), the client on
# the first (rxe0), both with GID index RDMAXFER_GID_INDEX (1, the IPv4-mapped RoCE v2 GID).
# Prints one JSON object per test on stdout (diagnostics go to stderr):
#   {"tool":"ib_write_bw","bytes":65536,"iters":200,"bw_Gbit_per_s":0.15,"bw_peak_Gbit_per_s":0.16,"msg_rate_mpps":0.0003}
#   (with -d, also "depth":DEPTH)
#   {"tool":"ib_write_lat","bytes":2,"iters":200,"lat_us_typical":105.2,"lat_us_avg":110.3,
#    "lat_us_t99":180.1,"lat_us_min":90.0,"lat_us_max":400.2}
#   {"tool":"ib_write_bw","bytes":2,"iters":200,"error":"..."}   (after the last failed attempt)
# Exit status: 0 when every test produced numbers, 1 otherwise, 2 on bad usage.
# shellcheck disable=SC2329  # functions called indirectly (traps, check, wait_for)
set -euo pipefail

iters=200
which=both
depth=""
limit=120
retries=3
out=""
while getopts "n:t:d:T:r:o:h" opt; do
    case $opt in
    n) iters=$OPTARG ;;
    t) which=$OPTARG ;;
    d) depth=$OPTARG ;;
    T) limit=$OPTARG ;;
    r) retries=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n '2,/^[^#]/{/^# shellcheck/d; /^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
sizes=("$@")
((${#sizes[@]})) || sizes=(2 4096 65536)
case $which in
both) tools=(ib_write_bw ib_write_lat) ;;
bw | ib_write_bw) tools=(ib_write_bw) ;;
lat | ib_write_lat) tools=(ib_write_lat) ;;
*) echo "perftest-ref: -t wants bw, lat or both" >&2; exit 2 ;;
esac

read -r -a devs <<< "${RDMAXFER_RXE_DEVICES:-rxe0 rxe1}"
read -r -a addrs <<< "${RDMAXFER_RXE_ADDRS:-10.77.0.1 10.77.0.2}"
gid=${RDMAXFER_GID_INDEX:-1}
client_dev=${devs[0]}
server_dev=${devs[1]}
server_addr=${addrs[1]}

work=$(mktemp -d "${TMPDIR:-/tmp}/perftest-ref.XXXXXX")
server_pid=""
cleanup() {
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2> /dev/null || true
        wait "$server_pid" 2> /dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

listening() { # listening PORT: a TCP socket is listening on PORT (no process start per poll)
    local hex f line
    hex=$(printf ':%04X ' "$1")
    for f in /proc/net/tcp /proc/net/tcp6; do
        [[ -r $f ]] || continue
        while IFS= read -r line; do
            [[ $line == *"$hex"*" 0A "* ]] && return 0
        done < "$f"
    done
    return 1
}

emit() {
    printf '%s\n' "$1"
    [[ -z $out ]] || printf '%s\n' "$1" >> "$out"
}

# parse TOOL SIZE FILE: turn perftest's result line into the JSON object
parse() {
    local tool=$1 size=$2 file=$3 line
    local -a f
    # the result line is the one that starts with the message size
    line=$(grep -E "^[[:space:]]*${size}[[:space:]]+[0-9]+[[:space:]]+[0-9.]+" "$file" | tail -n1) || return 1
    read -r -a f <<< "$line"
    if [[ $tool == ib_write_bw ]]; then
        # #bytes #iterations BW_peak[Gb/s] BW_average[Gb/s] MsgRate[Mpps]
        ((${#f[@]} >= 5)) || return 1
        printf '{"tool":"%s","bytes":%s,"iters":%s,"bw_Gbit_per_s":%s,"bw_peak_Gbit_per_s":%s,"msg_rate_mpps":%s%s}' \
            "$tool" "${f[0]}" "${f[1]}" "${f[3]}" "${f[2]}" "${f[4]}" "${depth:+,\"depth\":$depth}"
    else
        # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%   [usec]
        ((${#f[@]} >= 9)) || return 1
        printf '{"tool":"%s","bytes":%s,"iters":%s,"lat_us_typical":%s,"lat_us_avg":%s,"lat_us_t99":%s,"lat_us_t999":%s,"lat_us_min":%s,"lat_us_max":%s}' \
            "$tool" "${f[0]}" "${f[1]}" "${f[4]}" "${f[5]}" "${f[7]}" "${f[8]}" "${f[2]}" "${f[3]}"
    fi
}

port=$((18515 + RANDOM % 1000))
failed=0
for tool in "${tools[@]}"; do
    for size in "${sizes[@]}"; do
        opts=(-x "$gid" -n "$iters" -s "$size" -F)
        [[ $tool == ib_write_bw ]] && opts+=(--report_gbits)
        [[ $tool == ib_write_bw && -n $depth ]] && opts+=("--tx-depth=$depth")
        result="" err="no attempt"
        for ((attempt = 1; attempt <= retries; attempt++)); do
            port=$((port + 1)) # a fresh port per attempt: no clash with a dying server
            timeout --kill-after=5 "$limit" "$tool" -d "$server_dev" "${opts[@]}" -p "$port" \
                > "$work/server.out" 2>&1 &
            server_pid=$!
            for ((i = 0; i < 300; i++)); do # up to 30 s for the server to listen
                listening "$port" && break
                kill -0 "$server_pid" 2> /dev/null || break
                sleep 0.1
            done
            client_rc=0
            if kill -0 "$server_pid" 2> /dev/null; then
                timeout --kill-after=5 "$limit" "$tool" -d "$client_dev" "${opts[@]}" -p "$port" \
                    "$server_addr" > "$work/client.out" 2>&1 || client_rc=$?
            else
                client_rc=255
                echo "(not started: the server had exited)" > "$work/client.out"
            fi
            if ((client_rc != 0)); then
                kill "$server_pid" 2> /dev/null || true
            fi
            server_rc=0
            wait "$server_pid" || server_rc=$?
            server_pid=""
            if ((client_rc == 0)) && result=$(parse "$tool" "$size" "$work/client.out"); then
                break
            fi
            result=""
            err="attempt $attempt: client status $client_rc, server status $server_rc"
            {
                echo "perftest-ref: $tool $size bytes: $err"
                sed 's/^/  client| /' "$work/client.out" | tail -n 8
                sed 's/^/  server| /' "$work/server.out" | tail -n 8
            } >&2
            sleep 1
        done
        if [[ -n $result ]]; then
            emit "$result"
        else
            failed=1
            emit "$(printf '{"tool":"%s","bytes":%s,"iters":%s,"error":"%s"}' "$tool" "$size" "$iters" "$err")"
        fi
    done
done
exit "$failed"
