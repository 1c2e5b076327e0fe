#!/usr/bin/env bash
# Runs every test of the workspace. Installs redis-server/redis-tools from Debian's packages if
# they are missing (as root, or with sudo); the tests start their own redis-server processes on
# free loopback ports, so nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "== installing redis-server and redis-tools (Debian packages)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi
# The TLS tests make their certificates with the openssl command-line tool.
if ! command -v openssl >/dev/null 2>&1; then
  echo "== installing openssl (Debian package)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssl >/dev/null
fi
# The Debian package starts a system redis-server on 6379; the tests do not use it.
redis-server --version

echo "== cargo test (workspace, all targets)"
cargo test --workspace --all-targets
echo "== doc tests"
cargo test --workspace --doc
echo "== tower-ratelimit with every feature (serde configuration)"
cargo test -p tower-ratelimit --all-features
