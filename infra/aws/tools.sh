#!/usr/bin/env bash
# Installs the AWS tooling paybus uses into a virtualenv of the repository's own
# (.local/aws-venv, git-ignored), so nothing is installed system-wide and a fresh clone needs
# only python3:
#   infra/aws/tools.sh lint      cfn-lint and AWS SAM's translator (validate and translate
#                                infra/aws/template.yaml offline: infra/aws/translate.py)
#   infra/aws/tools.sh package   cargo-lambda and zig (cross-builds the functions for arm64)
# Idempotent: a second run installs nothing. Prints the venv's bin folder.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$repo/.local/aws-venv"

# Versions the suite was checked with; bump deliberately (a new cfn-lint adds rules).
CFN_LINT_VERSION="1.51.0"
# cfn-lint's own dependency, pinned too: the template tests assert on its translation.
SAM_TRANSLATOR_VERSION="1.115.0"
CARGO_LAMBDA_VERSION="1.8.6"
ZIGLANG_VERSION="0.15.1"

if [[ ! -x "$venv/bin/pip" ]]; then
  python3 -m venv "$venv" >&2
fi

install() { # package==version
  if ! "$venv/bin/pip" show --quiet "${1%%==*}" >/dev/null 2>&1 ||
    [[ "$("$venv/bin/pip" show "${1%%==*}" | sed -n 's/^Version: //p')" != "${1##*==}" ]]; then
    echo "== installing $1 into $venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$1" >&2
  fi
}

case "${1:-}" in
  lint)
    install "cfn-lint==$CFN_LINT_VERSION"
    install "aws-sam-translator==$SAM_TRANSLATOR_VERSION"
    ;;
  package)
    install "cargo-lambda==$CARGO_LAMBDA_VERSION"
    install "ziglang==$ZIGLANG_VERSION"
    ;;
  *)
    echo "usage: $0 lint|package" >&2
    exit 2
    ;;
esac
echo "$venv/bin"
