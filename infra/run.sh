#!/usr/bin/env bash
# Runs the system locally, from nothing: installs and starts MariaDB and RabbitMQ if needed,
# builds paybus, applies migrations and checks both services answer.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

infra/local/start.sh
cargo build --release --locked -p paybus
paybus="$repo/target/release/paybus"
"$paybus" migrate
"$paybus" doctor
