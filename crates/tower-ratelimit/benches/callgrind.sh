#!/usr/bin/env bash
# Instructions per request through each router of the `layer` benchmark, counted by callgrind.
# Unlike a timing, the count is the same from run to run, so a change of a few nanoseconds to the
# layer's path shows up as it is instead of drowning in the machine's noise. It counts
# instructions, not their cost: a cache miss is one load, a memmove of a few hundred bytes some
# tens of instructions.
#
# Run with: bash crates/tower-ratelimit/benches/callgrind.sh [router ...]
# Needs valgrind (apt-get install -y valgrind). About 3 s per router under valgrind. Without
# arguments: bare, the no-op layer, and ours, lean and tower_governor allowed, with and without
# the rate-limit fields. With CALLGRIND_KEEP=dir, callgrind's outputs (with per-instruction
# counts) are kept there, for `callgrind_annotate dir/<router>` (per function) and the like.
#
# It relies on the benchmark's `one` (one request sent and its body read) staying a function of
# its own and on `request` staying out of line; if either is inlined, no request is counted and
# the script says so.
set -euo pipefail
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is needed" >&2; exit 1; }

out=${CALLGRIND_KEEP:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${CALLGRIND_KEEP:-}" ] || trap 'rm -rf "$out"' EXIT
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../../.."

bin=$(cargo bench -p tower-ratelimit --bench layer --no-run --message-format=json 2>"$out/build.log" \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "layer" and m.get("executable"):
        print(m["executable"])') || true
[ -n "$bin" ] || { cat "$out/build.log" >&2; echo "callgrind.sh: could not build the layer benchmark" >&2; exit 1; }

if [ $# -eq 0 ]; then
  set -- bare noop \
    ours/allowed/headers lean/allowed/headers governor/allowed/headers \
    ours/allowed/no-headers lean/allowed/no-headers governor/allowed/no-headers
fi

cd crates/tower-ratelimit
for router in "$@"; do
  # Count only inside `one` (a request sent and its body read), and the requests by the calls of
  # `request`, which the benchmark keeps out of line for this.
  name=$(echo "$router" | tr / _)
  valgrind --tool=callgrind --dump-instr=yes --toggle-collect='layer::one::*' \
    --callgrind-out-file="$out/$name" \
    "$bin" --bench --exact "layer/$router" --profile-time 1 >"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log" >&2; echo "callgrind.sh: $router failed" >&2; exit 1; }
done
python3 - "$out" "$@" <<'EOF'
import re, sys

def per_request(path):
    """Instructions counted, divided by the calls of `layer::request`."""
    target, calls, total, pending = None, 0, None, False
    for line in open(path):
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            kind, i, name = m.groups()
            if name and name.strip() == "layer::request":
                target = i
            pending = kind == "cfn" and i == target
            continue
        if pending and line.startswith("calls="):
            calls += int(line.split("=")[1].split()[0])
            pending = False
        m = re.match(r"^(?:summary|totals):\s+(\d+)", line)
        if m:
            total = int(m.group(1))
    if not calls or total is None:
        sys.exit(f"callgrind.sh: no request counted in {path} (is it a router of the benchmark?)")
    return total / calls

out, routers = sys.argv[1], sys.argv[2:]
counts = {r: per_request(f"{out}/{r.replace('/', '_')}") for r in routers}
bare = counts.get("bare")
print(f"{'router':<28} {'instructions':>12} {'over bare':>10}")
for r in routers:
    over = f"{counts[r] - bare:>10.0f}" if bare is not None else ""
    print(f"{r:<28} {counts[r]:>12.0f} {over}")
if bare is not None:
    for mode in ["headers", "no-headers"]:
        gov = counts.get(f"governor/allowed/{mode}")
        for who in ["ours", "lean"]:
            ours = counts.get(f"{who}/allowed/{mode}")
            if gov is not None and ours is not None:
                print(f"{mode}: {who} allowed overhead / tower_governor's = "
                      f"{(ours - bare) / (gov - bare):.2f}")
EOF
