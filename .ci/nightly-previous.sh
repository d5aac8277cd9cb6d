#!/usr/bin/env bash
# Download the merged store of the latest earlier nightly run into DIR: tonight's regression baseline.
#
#   .ci/nightly-previous.sh DIR
#
# Runs inside the nightly workflow's report job (GH_TOKEN, GITHUB_REPOSITORY, GITHUB_RUN_ID and
# GITHUB_REF_NAME set). It walks back over the last completed nightly runs of this branch, whatever their
# conclusion (a night that found regressions still carries the history), and takes the first one whose
# `nightly-store` artifact can be downloaded. Finding none is not an error: the first nightly, or one
# after the artifacts expired, is judged against the committed results/ only, and says so.
set -euo pipefail

dir="${1:?usage: $0 DIR}"
mkdir -p "$dir"
say() { echo "nightly-previous: $*" >&2; }

if [ -z "${GH_TOKEN:-}" ] || ! command -v gh >/dev/null 2>&1; then
    say "no GitHub CLI or token here; no previous nightly store"
    exit 0
fi
workflow="${NIGHTLY_WORKFLOW:-nightly.yml}"
ids=$(gh run list --repo "$GITHUB_REPOSITORY" --workflow "$workflow" --branch "$GITHUB_REF_NAME" \
    --status completed --limit 30 --json databaseId --jq '.[].databaseId')
for id in $ids; do
    [ "$id" = "${GITHUB_RUN_ID:-}" ] && continue
    if gh run download "$id" --repo "$GITHUB_REPOSITORY" --name nightly-store --dir "$dir" 2>/dev/null; then
        say "baseline: the merged store of nightly run $id"
        exit 0
    fi
done
say "no earlier nightly store found; judging against the committed results only"
