#!/usr/bin/env bash
# Server CPU per request on the allowed and denied paths, ours and tower_governor's, measured
# with wrk against the `bench_server` example on 127.0.0.1.
#
# Run with: bash crates/tower-ratelimit/benches/wrk-denial.sh [seconds]
# Needs wrk (apt-get install -y wrk). Prints one line per mode: requests, server CPU seconds
# (user + system, from /proc), and server CPU microseconds per request.
set -euo pipefail
secs="${1:-5}"
port=3917
cargo build --release -q -p tower-ratelimit --example bench_server
bin="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release/examples/bench_server"
tick=$(getconf CLK_TCK)
printf '%-18s %10s %10s %12s\n' mode requests cpu_s cpu_us/req
for mode in bare ours-allowed ours-denied governor-allowed governor-denied; do
  "$bin" "$mode" "$port" >/dev/null &
  pid=$!
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
  # Spend the one-an-hour quota, so that the denied modes deny every measured request.
  curl -s -o /dev/null "http://127.0.0.1:$port/" || true
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  out=$(wrk -t1 -c16 -d"${secs}s" "http://127.0.0.1:$port/")
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  cpu=$(echo "scale=3; ($after - $before) / $tick" | bc)
  per=$(echo "scale=2; ($after - $before) * 1000000 / $tick / $reqs" | bc)
  printf '%-18s %10s %10s %12s  (non-2xx: %s)\n' "$mode" "$reqs" "$cpu" "$per" "${non2xx:-0}"
done
