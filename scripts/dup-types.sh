#!/usr/bin/env bash
# Public type names defined more than once in the workspace: every `pub struct|enum|trait|type|
# union NAME` under crates/*/src (pub(crate) and narrower left out), grouped by name, one
# `NAME file:line` per definition. Exit status 1 when there is any. Usage: dup-types.sh [REPO]
#   EXCLUDE (env, an extended regex on the file path) leaves paths out, e.g. a module that is
#   being moved: EXCLUDE='^crates/gdr/src/mq/' scripts/dup-types.sh
set -uo pipefail
cd "${1:-$(dirname "$0")/..}" || exit 2
defs=$(grep -rnE --include='*.rs' \
    '^\s*pub\s+(struct|enum|trait|type|union)\s+[A-Za-z_][A-Za-z0-9_]*' crates/*/src |
    { if [ -n "${EXCLUDE:-}" ]; then grep -vE "$EXCLUDE"; else cat; fi; } |
    sed -E 's/^([^:]+):([0-9]+):\s*pub\s+(struct|enum|trait|type|union)\s+([A-Za-z0-9_]+).*/\4 \1:\2/' |
    sort)
dups=$(awk '{print $1}' <<<"$defs" | uniq -d)
[ -z "$dups" ] && exit 0
for n in $dups; do
    grep "^$n " <<<"$defs"
    echo
done
exit 1
