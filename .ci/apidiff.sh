#!/usr/bin/env bash
# The public API check: apidiff (golang.org/x/exp) compares the module's
# public API at the last release, whose commit CHANGELOG.md names in an
# "api-baseline" comment, with the working tree. Every incompatible change
# it reports must be named under Changed or Removed in CHANGELOG.md's
# Unreleased section (an entry under Added does not excuse a break); main
# packages (cmd/, examples/) are not importable, so their changes do not
# count. Run it from the repository root; it needs the git history.
set -euo pipefail
module=github.com/gyre-ml/gyre
base=$(sed -n 's/^<!-- api-baseline: \([0-9a-f]\{7,40\}\) -->$/\1/p' CHANGELOG.md | head -n1)
if [ -z "$base" ]; then
  echo "CHANGELOG.md names no api-baseline commit"; exit 1
fi
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "the API baseline $base is not in this clone's history (a shallow clone?): fetch it first"; exit 1
fi
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach -q "$work/base" "$base"
(cd "$work/base" && apidiff -m -w "$work/base.api" "$module" >/dev/null 2>&1)
apidiff -m -w "$work/head.api" "$module" >/dev/null 2>&1
apidiff -m -incompatible "$work/base.api" "$work/head.api" > "$work/report" 2>/dev/null || true
# Unreleased's Changed and Removed subsections: from the Unreleased
# heading to the next release's, and within it from "### Changed" or
# "### Removed" to the next "###" heading.
unreleased=$(awk '/^## \[Unreleased\]/{in_rel=1; next} /^## \[/{in_rel=0}
  in_rel && /^### /{on=($0 ~ /^### (Changed|Removed)$/); next}
  in_rel && on' CHANGELOG.md)
missing=0
while IFS= read -r line; do
  case "$line" in
    "- "*) ;;
    *) continue ;;
  esac
  what=${line#- }
  what=${what%%: *}
  what=${what#./}
  what=${what#package }
  case "$what" in
    cmd/*|examples/*) continue ;; # main packages: nothing can import them
  esac
  if grep -qF -- "$what" <<<"$unreleased"; then
    echo "named in CHANGELOG.md: $line"
  else
    echo "NOT named under Changed or Removed in CHANGELOG.md's Unreleased section: $line"
    missing=1
  fi
done < "$work/report"
if [ "$missing" != 0 ]; then
  echo "apidiff: an incompatible change of the public API is not in CHANGELOG.md (Unreleased): name it under Changed or Removed, with what users must change"
  exit 1
fi
echo "apidiff: the public API against $base: every incompatible change is in CHANGELOG.md"
