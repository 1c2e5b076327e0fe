#!/usr/bin/env bash
# Instructions per request through each router of the `layer` benchmark, counted by callgrind.
# Unlike a timing, the count is the same from run to run, so a change of a few nanoseconds to the
# layer's path shows up as it is instead of drowning in the machine's noise. It counts work, not
# time: a cache miss or a memmove of 400 bytes is one instruction or a few here.
#
# Run with: bash crates/tower-ratelimit/benches/callgrind.sh [router ...]
# Needs valgrind (apt-get install -y valgrind). Each router takes 10-20 s under valgrind. Without
# arguments: bare, the no-op layer, and ours, lean and tower_governor allowed, with and without
# the rate-limit fields.
set -euo pipefail
cd "$(dirname "$0")/../../.."
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is needed" >&2; exit 1; }

bin=$(cargo bench -p tower-ratelimit --bench layer --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "layer" and m.get("executable"):
        print(m["executable"])')
[ -n "$bin" ] || { echo "callgrind.sh: could not build the layer benchmark" >&2; exit 1; }

if [ $# -eq 0 ]; then
  set -- bare noop \
    ours/allowed/headers lean/allowed/headers governor/allowed/headers \
    ours/allowed/no-headers lean/allowed/no-headers governor/allowed/no-headers
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd crates/tower-ratelimit
for router in "$@"; do
  # Count only inside `one` (a request sent and its body read), and the requests by the calls of
  # `request`, which the benchmark keeps out of line for this.
  valgrind --tool=callgrind --toggle-collect='layer::one::*' \
    --callgrind-out-file="$out/$(echo "$router" | tr / _)" \
    "$bin" --bench "$router" --profile-time 1 >/dev/null 2>&1
done
python3 - "$out" "$@" <<'EOF'
import re, sys

def per_request(path):
    """Instructions counted, divided by the calls of `layer::request`."""
    fn_ids, target, calls, total, pending = {}, None, 0, None, False
    for line in open(path):
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if m:
            kind, i, name = m.groups()
            if name:
                fn_ids[i] = name
                if name.strip() == "layer::request":
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
        sys.exit(f"callgrind.sh: no request counted in {path}")
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
