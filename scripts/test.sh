#!/usr/bin/env bash
# Runs every test of the workspace.
#
# First it installs what the tests need from Debian's packages, when missing (as root, or with
# sudo): redis-server and redis-tools (the tests start their own redis-server processes on free
# loopback ports, so nothing needs to be running beforehand), the openssl tool (the TLS test makes
# its certificates with it), and libssl-dev with pkg-config (the Redis store's `rediss://` support
# builds on the system's OpenSSL), and a C compiler and linker (gcc: rustup does not bring one,
# and the OpenSSL bindings compile a little C).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if ! pkg-config --exists openssl 2>/dev/null; then missing+=(libssl-dev); fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing from Debian's packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "test.sh: run as root, or install sudo, to install: ${missing[*]}" >&2
      exit 1
    }
    # Plain sudo: it asks for a password on a terminal if it needs one.
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq || echo "test.sh: apt-get update failed; trying the cached package index" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
redis-server --version
# The build takes about 4.5 GB under target/ (README, "Development"); a full disk shows up as a
# linker's bus error or "No space left on device" in the middle of it, so say so first.
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir"
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
  echo "test.sh: warning: $((free_kb / 1024)) MB free for $target_dir; the test build takes about 4.5 GB" >&2
fi
# The scripts need Redis 7.0 or later (docs/redis.md): an older one fails the tests confusingly.
redis_major=$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')
if [ -z "$redis_major" ] || [ "$redis_major" -lt 7 ]; then
  echo "test.sh: redis-server 7.0 or later is needed (found: $(redis-server --version)); \
Debian 12 (bookworm) and later package it" >&2
  exit 1
fi

# The tests' redis-server processes keep their files in temporary directories, which a test
# process killed by a signal (Ctrl-C, a CI timeout) cannot remove: they go in one directory for
# the run, removed when the script ends, however it ends.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/ratelimit-tests.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets
echo "== doc tests"
cargo test --workspace --doc
echo "== tower-ratelimit with every feature (serde configuration)"
cargo test -p tower-ratelimit --all-features
echo "== tower-ratelimit without its default axum feature (no peer-address keys), with serde"
cargo test -p tower-ratelimit --no-default-features --features serde
echo "== the gateway over rediss:// (its tls feature), and its TLS settings checked with it"
cargo test -p example-gateway --features tls --test tls
cargo test -p example-gateway --features tls --test gateway bad_configurations
echo "== the Redis store and the gateway over rediss:// through rustls (their tls-rustls features): a TLS cluster with a private CA"
cargo test -p ratelimit-redis --features tls-rustls --test tls
echo "== the Redis store with both TLS features (a build may unify them): a rediss:// store without a CA is refused"
cargo test -p ratelimit-redis --features tls,tls-rustls --test tls
cargo test -p example-gateway --features tls-rustls --test tls
cargo test -p example-gateway --features tls-rustls --test gateway bad_configurations
