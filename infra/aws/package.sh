#!/usr/bin/env bash
# Packaging without SAM: cross-builds every Lambda of infra/aws/template.yaml (the catalog's
# functions, dead-letters, sweeper, api, migrate) for arm64 (Graviton, provided.al2023) with
# cargo-lambda and zips each `bootstrap`:
#   infra/aws/package.sh                  every binary, into dist/lambda/<binary>.zip
#   infra/aws/package.sh canary api       just these
# Needs only python3 and rustup: cargo-lambda and zig come from PyPI into .local/aws-venv
# (infra/aws/tools.sh package), the target from `rustup target add`. Upload a zip with
#   aws lambda update-function-code --function-name <name> --zip-file fileb://dist/lambda/<binary>.zip
# (the template's outputs name each function). Times and sizes measured here: infra/aws/README.md.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"

export PATH="$(infra/aws/tools.sh package):$PATH"
rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 ||
  rustup target list --installed | grep -qx aarch64-unknown-linux-gnu

if [[ $# -gt 0 ]]; then
  binaries=("$@")
else
  mapfile -t binaries < <(cargo run -q --locked -p paybus -- template --binaries)
fi
target="${CARGO_TARGET_DIR:-$repo/target}"
out="$repo/dist/lambda"
mkdir -p "$out"

bin_args=()
for binary in "${binaries[@]}"; do
  bin_args+=(--bin "$binary")
done
echo "== cargo lambda build --release --arm64 ${bin_args[*]}"
start=$(date +%s)
cargo lambda build --release --arm64 --locked --output-format zip "${bin_args[@]}"
echo "== built in $(($(date +%s) - start)) s"

for binary in "${binaries[@]}"; do
  cp "$target/lambda/$binary/bootstrap.zip" "$out/$binary.zip"
  printf '%-22s %8s bytes zipped, %9s bytes unzipped\n' "$binary" \
    "$(stat -c %s "$out/$binary.zip")" \
    "$(unzip -Zt "$out/$binary.zip" | awk '{print $3}')"
done
