#!/usr/bin/env bash
# The Redis server's cost of the token-bucket and GCRA scripts at two commits, measured side by
# side on one redis-server: `redis-benchmark -P 16` sends EVALSHA of each script (the prelude,
# the algorithm and its helpers, assembled as crates/ratelimit-redis/src/scripts.rs does) on
# random keys of 100,000 users, in interleaved rounds, and INFO commandstats gives each run's
# usec_per_call. Prints each round and the per-round ratio new / old with its median.
#
# Run with: bash scripts/lua-ab.sh OLD_REV NEW_REV [ROUNDS]   (e.g. 0d9b9e4 HEAD 9)
# Needs redis-server and redis-benchmark (redis-tools). Loopback only; about 3 s per run.
set -euo pipefail
old=${1:?usage: lua-ab.sh OLD_REV NEW_REV [ROUNDS]}
new=${2:?usage: lua-ab.sh OLD_REV NEW_REV [ROUNDS]}
rounds=${3:-9}
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() { redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
python3 - "$old" "$new" "$dir" <<'PY'
import subprocess, sys
old, new, out = sys.argv[1:4]
def source(rev, alg):
    get = lambda f: subprocess.run(
        ["git", "show", f"{rev}:crates/ratelimit-redis/src/lua/{f}"],
        capture_output=True, text=True, check=True).stdout
    own, mark = get(alg + ".lua"), "--@helpers\n"
    fast, general = own.split(mark, 1) if mark in own else ("", own)
    return get("prelude.lua") + fast + get("helpers.lua") + general
for rev, name in [(old, "old"), (new, "new")]:
    for alg in ["token_bucket", "gcra"]:
        open(f"{out}/{name}_{alg}.lua", "w").write(source(rev, alg))
PY
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
scripts="old_token_bucket new_token_bucket old_gcra new_gcra"
declare -A sha
for s in $scripts; do sha[$s]=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$dir/$s.lua")"); done
bench() { # script, requests
  local t=gc; case $1 in *token*) t=tb;; esac
  # Server time, cost 1, one quota, no slack, then burst 10, scale 100000, refill 1, capacity
  # 1000000: 10 requests a second with a burst of 10, as the redis_store benchmark sends.
  redis-benchmark -h 127.0.0.1 -p "$port" -P 16 -n "$2" -r 100000 -q EVALSHA "${sha[$1]}" 1 \
    "rl:{user:__rand_int__}:$t:$1" s 1 1 0 10 100000 1 1000000
}
# Every user's key made first, so that every round updates states rather than creating some.
for s in $scripts; do bench "$s" 300000 >/dev/null; done
for round in $(seq "$rounds"); do
  for s in $scripts; do
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    bench "$s" 300000 >/dev/null
    usec=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' \
      | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
    echo "$round $s $usec"
  done
done | tee "$dir/rounds"
python3 - "$dir/rounds" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, s, u = line.split()
    rows[(int(r), s)] = float(u)
for alg in ["token_bucket", "gcra"]:
    ratios = [rows[(r, "new_" + alg)] / rows[(r, "old_" + alg)]
              for r in sorted({r for r, _ in rows})]
    med = lambda n: statistics.median(v for (r, s), v in rows.items() if s == n + "_" + alg)
    print(f"{alg}: usec_per_call median old {med('old'):.2f}, new {med('new'):.2f}; "
          f"new/old per round {' '.join(f'{x:.2f}' for x in ratios)}, "
          f"median {statistics.median(ratios):.3f}")
PY
