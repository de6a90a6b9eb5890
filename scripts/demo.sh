#!/usr/bin/env bash
# make demo: record a real program's launch and show what warmstart learned.
set -euo pipefail
cd "$(dirname "$0")/.."
WS=./target/release/warmstart
APP=(python3 -c 'import json, email, asyncio, decimal, sqlite3')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== recording a cold launch of: ${APP[*]}"
"$WS" record -q -o "$out/warm.trace" -- "${APP[@]}"
"$WS" record --cold --from "$out/warm.trace" -o "$out/cold.trace" -- "${APP[@]}"
echo
"$WS" show "$out/cold.trace"
