# shellcheck shell=bash
# Sourced by CI before `cargo test`: Debian's chromium for tests/integration/html.rs, which then must run
# (GACC_REQUIRE_BROWSER=1 turns a missing browser into a failure instead of a skip).
command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
export GACC_REQUIRE_BROWSER=1
