#!/usr/bin/env bash
# Runs the system locally, from nothing: installs and starts MariaDB and RabbitMQ if needed,
# builds paybus, applies migrations, declares the topology, then runs every function, the
# dead-letter recorders and the sweeper in one process (`paybus run`) until Ctrl-C.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

infra/local/start.sh
cargo build --release --locked -p paybus
paybus="$repo/target/release/paybus"
"$paybus" migrate
"$paybus" topology
"$paybus" doctor
exec "$paybus" run
