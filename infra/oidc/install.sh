#!/usr/bin/env bash
# panva's oidc-provider (npm, pinned in infra/oidc/package-lock.json) for the suite's OpenID
# Connect provider (paybus_testkit::oidc) and for local development, installed into
# the repository's git-ignored .local/oidc with the machine's Node.
#
# .local/oidc is a runnable copy of this folder: package.json and package-lock.json are copied
# there and installed with `npm ci`, which installs exactly the locked tree (and fails if the
# two disagree) but reads the lock only from the folder it installs into. provider.mjs is
# copied beside them because Node resolves `import 'oidc-provider'` from the importing file's
# own folder, so the script must sit next to the node_modules it uses.
#
# Idempotent: a second run finds the same lock installed (a stamp holds the lock's hash),
# refreshes the copy of provider.mjs, and returns in well under a second.
# Prints the variables the tests read (source-able); infra/test.sh exports them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="$repo/.local/oidc"
# oidc-provider 9 asks for Node 22 (it warns on older releases); 20 is what these machines
# ship, and everything the suite does with it works there.
min_node_major=20

node="$(command -v node || true)"
npm="$(command -v npm || true)"
if [[ -z $node || -z $npm ]]; then
  echo "node and npm are missing (the OpenID provider of the tests runs on Node >= $min_node_major):" \
    "apt-get install nodejs npm" >&2
  exit 1
fi
node_major="$("$node" -p 'process.versions.node.split(".")[0]')"
if ((node_major < min_node_major)); then
  echo "$node is Node $("$node" --version); the OpenID provider of the tests needs Node >= $min_node_major" >&2
  exit 1
fi

mkdir -p "$target"
stamp="$target/.installed"
lock_hash="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f $stamp || $(cat "$stamp") != "$lock_hash" || ! -d $target/node_modules/oidc-provider ]]; then
  echo "installing oidc-provider into $target (npm ci)" >&2
  cp "$here/package.json" "$here/package-lock.json" "$target/"
  (cd "$target" && "$npm" ci --no-audit --no-fund --loglevel=error >&2)
  echo "$lock_hash" >"$stamp"
fi
if ! cmp -s "$here/provider.mjs" "$target/provider.mjs"; then
  cp "$here/provider.mjs" "$target/provider.mjs"
fi

echo "export PAYBUS_TEST_NODE=$node"
echo "export PAYBUS_TEST_OIDC_PROVIDER=$target/provider.mjs"
