#!/usr/bin/env bash
# Runs the whole benchmark set and rewrites the generated section of docs/benchmarks.md (between
# <!-- BEGIN GENERATED --> and <!-- END GENERATED -->; nothing outside the markers is touched).
#
#   scripts/bench.sh            the full set (about 15 minutes on 2 cores)
#   scripts/bench.sh --quick    short runs, to check the script itself (figures not for the docs:
#                               the section and the plot go to target/bench-results/ instead)
#   scripts/bench.sh --report-only   rewrite the section from the last run's raw outputs
#
# Environment: BENCH_SKIP_CRITERION=1 reuses the criterion results already in target/criterion
# (and the last redis_store output) instead of running the micro-benchmarks again.
#
# Micro level (criterion): ratelimit-core's memory_store, tower-ratelimit's layer,
# ratelimit-redis's redis_store (next to redis-benchmark on the same server).
# System level: the ratelimit-load tool (crates/ratelimit-load, docs/load-tool.md).
# Raw outputs (JSON, text, the uptime before and after each run) go to target/bench-results/.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

QUICK=0
REPORT_ONLY=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi
if [ "${1:-}" = "--report-only" ]; then REPORT_ONLY=1; fi
OUT=target/bench-results
mkdir -p "$OUT" docs/benchmarks
# Where the report goes: the docs, except for a quick run, whose figures are not for them.
DOC=docs/benchmarks.md
SVG=docs/benchmarks/seed-fleet.svg
if [ $QUICK = 1 ]; then DOC="$OUT/benchmarks-quick.md"; SVG="$OUT/seed-fleet.svg"; fi
if [ $REPORT_ONLY = 0 ]; then
rm -f "$OUT"/*.json "$OUT"/*.cmd "$OUT"/*.load
touch "$OUT/start.stamp"

for tool in redis-server redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "bench.sh: $tool is needed" >&2; exit 1; }
done

# The load average from /proc (`uptime` is in procps, which minimal images lack).
load() { cut -d' ' -f1-3 /proc/loadavg | sed 's/ /, /g'; }

# --- the machine ---------------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
  echo "memory: $(free -h | awk '/^Mem:/ {print $2}')"
  echo "kernel: $(uname -r)"
  echo "redis: $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
  echo "rustc: $(rustc --version)"
  echo "quick: $QUICK"
} > "$OUT/machine.txt"

# --- micro level: criterion ------------------------------------------------------------------
if [ "${BENCH_SKIP_CRITERION:-0}" != 1 ]; then
  echo "== cargo bench -p ratelimit-core --bench memory_store" >&2
  load > "$OUT/memory_store.load"
  cargo bench -p ratelimit-core --bench memory_store > "$OUT/memory_store.txt" 2>&1 \
    || echo "bench.sh: this benchmark failed; see its output in $OUT" >&2
  load >> "$OUT/memory_store.load"

  echo "== cargo bench -p tower-ratelimit --bench layer" >&2
  load > "$OUT/layer.load"
  cargo bench -p tower-ratelimit --bench layer > "$OUT/layer.txt" 2>&1 \
    || echo "bench.sh: this benchmark failed; see its output in $OUT" >&2
  load >> "$OUT/layer.load"

  echo "== cargo bench -p ratelimit-redis --bench redis_store" >&2
  load > "$OUT/redis_store.load"
  BENCH_SECS=$([ $QUICK = 1 ] && echo 1 || echo 3) \
    cargo bench -p ratelimit-redis --bench redis_store > "$OUT/redis_store.txt" 2>&1 \
    || echo "bench.sh: this benchmark failed; see its output in $OUT" >&2
  load >> "$OUT/redis_store.load"
fi

# --- system level: the load tool -------------------------------------------------------------
echo "== cargo build --release -p ratelimit-load" >&2
cargo build --release -p ratelimit-load >&2
LOADTOOL=target/release/ratelimit-load

# run NAME ARGS...: one run of the tool, its command, its JSON and the load around it.
run() {
  local name=$1
  shift
  echo "== ratelimit-load $*" >&2
  # The command as a user would type it: arguments with spaces in single quotes.
  local shown="" a
  for a in "$@"; do
    case "$a" in *" "*) shown="$shown '$a'" ;; *) shown="$shown $a" ;; esac
  done
  echo "cargo run --release -p ratelimit-load --$shown" > "$OUT/$name.cmd"
  load > "$OUT/$name.load"
  "$LOADTOOL" "$@" --json --quiet > "$OUT/$name.json"
  load >> "$OUT/$name.load"
}

if [ $QUICK = 1 ]; then
  SEED_SECS=5; MODE_SECS=3; STEP_SECS=2; SAT_SECS=2; STEPS=5000,20000; FLEET_STEPS=10000,20000
else
  SEED_SECS=30; MODE_SECS=20; STEP_SECS=10; SAT_SECS=5
  STEPS=5000,10000,20000,30000,40000,60000,80000,100000,120000,140000
  FLEET_STEPS=10000,20000,30000,40000,45000,50000
fi

# 1. The seed fleet at the store level: 20 gateways (each its own RedisStore and connection), one
#    local Redis, 100,000 users, 100 a minute each, 50,000 decisions a second.
run seed --target store --store redis --gateways 20 --users 100000 --limit 100/minute \
  --rate 50000 --duration "$SEED_SECS" --svg "$SVG"

# 1a. The same, with Redis's `hz 100`: every key here expires within a second of its last
#     check (the time to refill one token), so Redis's active expiry deletes tens of thousands of
#     keys a second; at the default hz 10 it does so in 100 ms bursts that stall every client.
run seed-hz100 --target store --store redis --gateways 20 --users 100000 --limit 100/minute \
  --rate 50000 --duration "$SEED_SECS" --redis-config 'hz 100'

# 1b. The same at the default hz, with a minute of expiry slack: users come back every 2 s on
#     average, so their keys outlive the gaps and Redis has next to nothing to expire.
run seed-slack --target store --store redis --gateways 20 --users 100000 --limit 100/minute \
  --rate 50000 --duration "$SEED_SECS" --expiry-slack-ms 60000

# 1c. The same fleet, the rate stepped up: the highest rate with p99 under 2 ms.
run seed-sweep --target store --store redis --gateways 20 --users 100000 --limit 100/minute \
  --steps "$FLEET_STEPS" --duration "$STEP_SECS" --p99-target-ms 2
run seed-sweep-hz100 --target store --store redis --gateways 20 --users 100000 \
  --limit 100/minute --steps "$FLEET_STEPS" --duration "$STEP_SECS" --p99-target-ms 2 \
  --redis-config 'hz 100'

# 1d. The same fleet offered twice the seed rate (100,000/s): where it falls short, the achieved
#     rate is the most this machine decides through the Redis path (next to redis-benchmark's
#     ceiling); where it keeps up, it is only a lower bound, and the report says so.
run saturation --target store --store redis --gateways 20 --users 100000 --limit 100/minute \
  --rate 100000 --duration "$SAT_SECS"

# 2. The same fleet by mode, with hot users (Zipf) and 100 abusive users sending 100x: the
#    traffic the round-trip reductions are for.
MODES="exact denial-cache leasing coalesce"
for mode in $MODES; do
  run "mode-$mode" --target store --store redis --gateways 20 --users 100000 \
    --limit 100/minute --rate 50000 --duration "$MODE_SECS" --dist zipf:1.0 --abusive 100 \
    --mode "$mode"
done

# 3. Over HTTP: bare axum, the layer on the memory store, the layer on Redis; the rate steps up
#    until p99 exceeds 10 ms (or under 95% of the rate is achieved).
for store in none memory redis; do
  run "http-$store" --target http --store "$store" --users 100000 --limit 100/minute \
    --steps "$STEPS" --duration "$STEP_SECS" --p99-target-ms 10
done

fi # REPORT_ONLY
MODES="exact denial-cache leasing coalesce"

# --- the report ------------------------------------------------------------------------------
command -v python3 >/dev/null || { echo "bench.sh: python3 is needed" >&2; exit 1; }
[ -e "$OUT/start.stamp" ] || { echo "bench.sh: no run in $OUT to report on (run bench.sh first)" >&2; exit 1; }
python3 - "$OUT" "$MODES" "$DOC" <<'PY'
import glob, json, os, re, sys

out, modes, doc = sys.argv[1], sys.argv[2].split(), sys.argv[3]
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"

def read(name, default=""):
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return default

def load_of(name):
    lines = read(name + ".load").splitlines()
    if len(lines) == 2:
        return f"load average (1, 5, 15 min) before: {lines[0]}; after: {lines[1]}"
    return "load average: not recorded"

def cmd(name):
    return read(name + ".cmd")

STAMP = os.path.getmtime(os.path.join(out, "start.stamp"))
stale = set()

def predates(path):
    """Whether `path` was written before this run of bench.sh started (False if missing)."""
    try:
        return os.path.getmtime(path) < STAMP
    except OSError:
        return False

def estimate(group, bench):
    path = f"target/criterion/{group}/{bench}/new/estimates.json"
    if predates(path):
        stale.add(group)
    try:
        with open(path) as f:
            return json.load(f)["mean"]["point_estimate"]
    except (OSError, KeyError, ValueError):
        return None

def stale_note(group):
    if group in stale:
        w("")
        w("_These criterion results predate this run of `bench.sh` (the benchmark was skipped or "
          "failed): they come from an earlier run on this machine._")

def ms(us):
    return f"{us / 1000:.2f}"

def num(x):
    return f"{x:,.0f}"

g = []
w = g.append
w(BEGIN)
w("")
w("_Generated by `scripts/bench.sh`; do not edit between the markers. Raw outputs: "
  "`target/bench-results/`._")
w("")
w("### Machine")
w("")
w("```text")
w(read("machine.txt"))
w("```")
w("")
w("The load tool, the in-process gateways and `redis-server` share these CPUs: every figure "
  "below is for the whole system on one machine, not for a dedicated Redis host.")
w("")

def interleaved(name, lines, start="Interleaved minimum", until="\nMany clients",
                intro="The benchmark's interleaved-minimum ratios (steadier on a shared machine):"):
    """The benchmark's own interleaved-minimum block from `start`, if its output has one, up to
    `until` if given (the layer's many-clients blocks follow its own and are reported apart)."""
    inter = read(name)
    if start not in inter:
        return
    block = inter[inter.index(start):]
    if until:
        block = block.split(until)[0]
    block = block.splitlines()
    block = [l for l in block if l.strip() and not l.startswith(("Gnuplot", "Benchmarking"))]
    w("")
    if intro:
        w(intro)
        w("")
    w("```text")
    w("\n".join(block[:lines]))
    w("```")

# Micro level: memory store against governor.
w("### Memory store against governor (criterion)")
w("")
w("Command: `cargo bench -p ratelimit-core --bench memory_store` "
  f"({load_of('memory_store')}).")
w("")
w("| case | threads | ours, ns per check | governor, ns per check | governor / ours |")
w("|---|---:|---:|---:|---:|")
for case in ["hot_key", "1M_keys"]:
    for threads in ["1", "2"]:
        o = estimate("memory_store", f"ours_{case}/{threads}")
        t = estimate("memory_store", f"governor_{case}/{threads}")
        if o is None or t is None:
            continue
        w(f"| {case} | {threads} | {o:.1f} | {t:.1f} | {t / o:.2f} |")
w("")
w("Criterion mean of one check per iteration; with 2 threads, both run at once and the time is "
  "the wall time per check across both threads.")
stale_note("memory_store")
interleaved("memory_store.txt", 5)
w("")

# Micro level: the layer.
w("### Layer against bare axum and tower_governor (criterion)")
w("")
w(f"Command: `cargo bench -p tower-ratelimit --bench layer` ({load_of('layer')}).")
w("")
bare = estimate("layer", "bare")
w("| router | ns per request | over bare axum, ns | / bare |")
w("|---|---:|---:|---:|")
for name in ["bare", "noop", "ours_allowed_headers", "lean_allowed_headers", "governor_allowed_headers",
             "ours_denied_headers", "lean_denied_headers", "governor_denied_headers",
             "ours_allowed_no-headers", "lean_allowed_no-headers", "governor_allowed_no-headers",
             "ours_denied_no-headers", "lean_denied_no-headers", "governor_denied_no-headers"]:
    v = estimate("layer", name)
    if v is None or bare is None:
        continue
    label = name.replace("_", " / ")
    w(f"| {label} | {v:.0f} | {v - bare:.0f} | {v / bare:.2f} |")
w("")
w("`ours` is the default policy (a `Verdict` in the response extensions, the body wrapped in "
  "`ResponseBody`); `lean` is configured as tower_governor is, with neither "
  "(`Policy::verdict(false)`, `RateLimitLayer::same_body()`). `noop` is a layer that only "
  "passes the request on and wraps the inner future: what axum charges any layer.")
stale_note("layer")
interleaved("layer.txt", 28)
w("")
w("Many clients (the `clients` group of the same benchmark): each request comes from the next of "
  "10 thousand or a million peer addresses, each with a quota it never spends (a burst of a "
  "million, one more a second), so every client keeps a state in the store, as a gateway's "
  "clients do.")
w("")
w("| clients | router | ns per request | over bare axum, ns |")
w("|---|---|---:|---:|")
for size in ["10k", "1M"]:
    cbare = estimate("clients", f"{size}_bare")
    for name in ["bare", "ours_allowed_headers", "lean_allowed_headers", "governor_allowed_headers",
                 "lean_allowed_no-headers", "governor_allowed_no-headers"]:
        v = estimate("clients", f"{size}_{name}")
        if v is None or cbare is None:
            continue
        w(f"| {size} | {name.replace('_', ' / ')} | {v:.0f} | {v - cbare:.0f} |")
stale_note("clients")
interleaved("layer.txt", 24, start="Many clients", until=None, intro=None)
w("")

# Micro level: Redis store against redis-benchmark.
w("### Redis store against `redis-benchmark` EVALSHA on the same server")
w("")
w(f"Command: `cargo bench -p ratelimit-redis --bench redis_store` ({load_of('redis_store')}).")
w("")
redis_txt = read("redis_store.txt")
lines = [l for l in redis_txt.splitlines()
         if l.startswith(("|", "==", "redis-benchmark ", "redis-server ", "at "))
         or "ceiling" in l]
if lines:
    w("```text")
    w("\n".join(lines))
    w("```")
else:
    w("_No output recorded._")
if predates(os.path.join(out, "redis_store.txt")):
    w("")
    w("_This output predates this run of `bench.sh` (the benchmark was skipped): it comes "
      "from an earlier run on this machine, and so does the ceiling the system-level "
      "figures below are compared with._")
ceiling = None
m = re.search(r"== token_bucket.*?\|\s*redis-benchmark[^|]*\|\s*([\d.]+)", redis_txt, re.S)
if m:
    ceiling = float(m.group(1))
w("")

def report(name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None

# System level: the seed fleet.
w("### The seed fleet at the store level")
w("")
r = report("seed")
if r:
    lat = r["latency_us"]
    ex = r["exactness"]
    w(f"Command: `{cmd('seed')}` ({load_of('seed')}).")
    w("")
    w("| figure | value |")
    w("|---|---:|")
    w(f"| target rate, decisions/s | {num(r['target_rate'])} |")
    w(f"| achieved rate, decisions/s | {num(r['achieved_rate'])} "
      f"({100 * r['achieved_rate'] / r['target_rate']:.1f}% of target) |")
    w(f"| completed / scheduled | {num(r['completed'])} / {num(r['scheduled'])} |")
    w(f"| started over 1 ms behind schedule | {num(r['late_starts'])} "
      f"({100 * r['late_starts'] / max(r['completed'], 1):.2f}%) |")
    w(f"| latency p50 / p90 / p99 / p99.9 / max, ms | {ms(lat['p50'])} / {ms(lat['p90'])} / "
      f"**{ms(lat['p99'])}** / {ms(lat['p99.9'])} / {ms(lat['max'])} |")
    w(f"| errors | {r['errors']} |")
    w(f"| users seen / most admitted for one user / bound | {num(ex['users_seen'])} / "
      f"{ex['max_admitted']} / {ex['bound']} |")
    tested = ex.get("users_tested")
    w(f"| denied | {num(r['denied'])} |")
    if tested is not None:
        w(f"| users who sent more than the bound (the only ones that test exactness) | "
          f"{num(tested)} |")
    untested = " (not tested: no user sent more than the bound)" if tested == 0 else ""
    w(f"| **users admitted above their limit** | **{ex['users_above_bound']}**{untested} |")
    if "users_above_in_some_interval" in ex:
        w(f"| users admitted above the bound of some interval within the run | "
          f"{ex['users_above_in_some_interval']}{untested} |")
    if r.get("redis_calls_per_request") is not None:
        w(f"| Redis EVALSHA calls per decision | {r['redis_calls_per_request']:.3f} |")
    sat = report("saturation")
    # A rate that kept up with what was offered is a lower bound, not a ceiling.
    sat_bound = bool(sat) and sat["achieved_rate"] >= 0.95 * sat["target_rate"]
    at_least = "≥ " if sat_bound else ""
    if sat:
        w(f"| most decisions/s through the Redis path (offered {num(sat['target_rate'])}/s, "
          f"below) | {at_least}{num(sat['achieved_rate'])}"
          f"{' (all that was offered: a lower bound)' if sat_bound else ''} |")
    if ceiling:
        w(f"| `redis-benchmark -P 16` EVALSHA ceiling, same script, same server | "
          f"{num(ceiling)}/s |")
    if ceiling and sat:
        w(f"| Redis path / Redis's own ceiling | {at_least}{sat['achieved_rate'] / ceiling:.2f} |")
    def seed_verdict(run):
        e = run["exactness"]
        met = (run["latency_us"]["p99"] < 2000
               and run["achieved_rate"] >= 0.95 * run["target_rate"]
               and e["users_above_bound"] == 0
               and e.get("users_above_in_some_interval", 0) == 0 and run["errors"] == 0
               and run["completed"] == run["scheduled"])
        if not met:
            return "NOT met"
        if e.get("users_tested") == 0:
            return "met for rate and latency; exactness not tested by this workload"
        return "met"
    verdict = seed_verdict(r)
    hz, slack = report("seed-hz100"), report("seed-slack")
    variants = [(run, what) for run, what in [(hz, "with Redis at `hz 100`"),
                                               (slack, "with a minute of expiry slack")] if run]
    w("")
    w(f"Target (50,000/s with p99 under 2 ms, nobody above the limit): **{verdict}** in this run "
      "with Redis's and the store's defaults"
      + "".join(f"; {what} (below): **{seed_verdict(run)}**" for run, what in variants)
      + ". Latency is counted from each request's scheduled time (open loop), so time spent "
      "queued behind a slow request counts.")
    w("")
    w("![p50 and p99 latency per second](benchmarks/seed-fleet.svg)")
    def variant(name, v, how):
        """The opening of a variant's paragraph: its command, load, rate and latencies."""
        vl = v["latency_us"]
        w("")
        return (f"The same run {how} (`{cmd(name)}`; {load_of(name)}): "
                f"{num(v['achieved_rate'])}/s achieved, latency p50 / p90 / p99 / p99.9 / max "
                f"{ms(vl['p50'])} / {ms(vl['p90'])} / **{ms(vl['p99'])}** / {ms(vl['p99.9'])} / "
                f"{ms(vl['max'])} ms, {v['exactness']['users_above_bound']} users above their limit")
    if hz:
        w(variant("seed-hz100", hz, "with Redis at `hz 100` instead of the default 10")
          + f"; p99 {ms(hz['latency_us']['p99'])} ms against {ms(lat['p99'])} ms "
          "at the default `hz` in this run. "
          "Every key here expires within a second of its last check, so Redis's active expiry "
          "deletes tens of thousands of keys a second; a higher `hz` does that in smaller slices "
          "(see docs/operations.md), which on this shared machine has helped in some runs and "
          "not in others.")
    if slack:
        w(variant("seed-slack", slack, "at the default `hz` with a minute of expiry slack")
          + ". A user comes back "
          "every 2 s on average here, so with the slack its key is still there and Redis has "
          "almost nothing to expire; the decisions are the same (an expired key and a fresh one "
          "answer alike), and each idle key stays a minute longer in Redis's memory "
          "(`RedisStoreBuilder::expiry_slack`, docs/operations.md).")
    if sat:
        w("")
        w(f"Run at twice the seed rate: `{cmd('saturation')}` ({load_of('saturation')}); "
          "only its rate is shown (where it falls short of the offered rate, the latencies only "
          "measure the queue; where it keeps up, the rate is a lower bound). The ceiling comes from "
          "the redis_store benchmark above (`redis-benchmark` pipelining 16 commands, with no "
          "client work per decision), run on the same machine.")
    for name, what in [("seed-sweep", "Stepping the rate up"),
                       ("seed-sweep-hz100", "The same with Redis at `hz 100`")]:
        sw = report(name)
        if not sw:
            continue
        steps = ", ".join(
            f"{num(st['target_rate'])}/s: p99 {ms(st['latency_us']['p99'])} ms, "
            f"{num(st['achieved_rate'])}/s achieved{'' if st['sustained'] else ' ✗'}"
            for st in sw["steps"])
        best = sw.get("sustained_rate")
        w("")
        w(f"{what} (`{cmd(name)}`; {load_of(name)}): highest rate "
          f"with p99 under 2 ms: **{num(best) + '/s' if best else 'none of the steps'}**. "
          f"Steps: {steps}.")
else:
    w("_Not run._")
w("")

# System level: modes.
w("### Fleet by mode: hot users and abusers")
w("")
w("Same fleet (20 gateways, one Redis, 100,000 users, 100/minute, 50,000 decisions/s), users "
  "drawn from Zipf(1.0) with 100 abusive users sending 100 times a normal user's rate.")
w("")
w("| mode | achieved/s | p50 ms | p99 ms | p99.9 ms | denied | errors | Redis calls per decision "
  "| users who sent more than the bound | users above exact bound | above bound + tolerance "
  "| above (bound + tolerance) in some interval | load average before / after |")
w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
cmds = []
for mode in modes:
    r = report("mode-" + mode)
    if not r:
        continue
    lat, ex = r["latency_us"], r["exactness"]
    per = r.get("redis_calls_per_request")
    tol = ex.get("tolerance", 0)
    above_tol = f"{ex['users_above_tolerance']} (+{tol})" if tol else "—"
    loads = read("mode-" + mode + ".load").splitlines()
    loads = " / ".join(l.split(",")[0] for l in loads)
    per = f"{per:.3f}" if per is not None else "n/a"
    # A failed request may hide an admission (docs/load-tool.md): the exactness columns hold
    # only for the requests answered; a run cut short says so.
    errors = num(r["errors"]) + (" (cut short)" if r.get("timed_out") else "")
    w(f"| {mode} | {num(r['achieved_rate'])} | {ms(lat['p50'])} | {ms(lat['p99'])} | "
      f"{ms(lat['p99.9'])} | {num(r['denied'])} | {errors} | {per} | "
      f"{num(ex['users_tested']) if 'users_tested' in ex else '—'} | {ex['users_above_bound']} | "
      f"{above_tol} | {ex.get('users_above_in_some_interval', '—')} | {loads} |")
    cmds.append(cmd("mode-" + mode))
w("")
w("Commands:")
w("")
w("```sh")
w("\n".join(cmds))
w("```")
w("")
w("Only users who sent more than the bound can be over-admitted, so they are the ones these "
  "columns test (the abusive users and the hottest of the Zipf users). Two checks per user: "
  "the admissions of the whole run against the bound for the run's length, and the admissions "
  "within every interval from one admission's request to another's answer against the bound "
  "for that interval's length (conservative: an admission counts only if both its request and "
  "its answer fall inside), which also catches a burst that the rest of the run makes up for.")
w("")
w("Leasing's tolerance is its documented bound (exact bound plus one lease of at most 64 units); "
  "the denial cache and coalescing change no decision, so their tolerance is 0.")
w("")

# System level: HTTP.
w("### Over HTTP: highest rate with p99 under 10 ms")
w("")
w("One axum gateway in the same process as the load (127.0.0.1, HTTP/1.1 keep-alive, 64 "
  "connections), 100,000 users, 100/minute, key from `x-api-key`. Each step runs the schedule "
  "for its duration; the sweep stops at the first step that misses p99 ≤ 10 ms, 95% of the "
  "rate, or 0.1% errors.")
w("")
sweeps = {}
w("| server | highest sustained rate/s | / bare axum | most achieved/s (last step) | / bare axum | steps (target/s: p99 ms) | load average before / after |")
w("|---|---:|---:|---:|---:|---|---|")
for store, label in [("none", "bare axum"), ("memory", "layer, memory store"),
                     ("redis", "layer, Redis store")]:
    s = report("http-" + store)
    if not s:
        continue
    sweeps[store] = s
    base = sweeps.get("none", {}).get("sustained_rate")
    rate = s.get("sustained_rate")
    ratio = f"{rate / base:.2f}" if rate and base else "—"
    # A step's errors (503s of a failing store are answered fast) and a cut-short step are
    # shown: neither is throughput.
    def step_text(st):
        text = f"{num(st['target_rate'])}: {ms(st['latency_us']['p99'])}"
        if st.get("errors"):
            text += f" ({num(st['errors'])} errors)"
        if st.get("timed_out"):
            text += " (cut short)"
        return text + ("" if st["sustained"] else " ✗")
    steps = ", ".join(step_text(st) for st in s["steps"])
    loads = read("http-" + store + ".load").splitlines()
    loads = " / ".join(l.split(",")[0] for l in loads)
    top = max(st["achieved_rate"] for st in s["steps"])
    base_top = max((st["achieved_rate"] for st in sweeps.get("none", {}).get("steps", [])),
                   default=None)
    top_ratio = f"{top / base_top:.2f}" if base_top else "—"
    w(f"| {label} | {num(rate) if rate else 'none'} | {ratio} | {num(top)} | {top_ratio} | "
      f"{steps} | {loads} |")
w("")
w("The sustained rate moves in the sweep's steps, and each step is one sample of a noisy "
  "machine. The most achieved is a throughput ceiling only where a step fell clearly short of "
  "its offered rate; where every step kept up (achieved within 5% of offered) and the sweep "
  "stopped on latency, it is only a lower bound.")
w("")
w("Commands:")
w("")
w("```sh")
w("\n".join(cmd("http-" + s) for s in ["none", "memory", "redis"] if cmd("http-" + s)))
w("```")
w("")
w(END)

generated = "\n".join(g)
if os.path.exists(doc):
    text = open(doc).read()
else:
    text = ""
if BEGIN in text and END in text:
    head = text[:text.index(BEGIN)]
    tail = text[text.index(END) + len(END):]
    text = head + generated + tail
else:
    text = text.rstrip("\n") + ("\n\n" if text else "") + generated + "\n"
with open(doc, "w") as f:
    f.write(text)
print(f"bench.sh: wrote the generated section of {doc}", file=sys.stderr)
PY
