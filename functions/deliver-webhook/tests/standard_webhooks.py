"""Verifies deliveries with the ecosystem's own libraries, not paybus's code.

Usage: standard_webhooks.py <deliveries.json>
deliveries.json: [{"body": str, "headers": {name: value}, "accept": [whsec...],
                   "reject": [whsec...]}, ...]
Each delivery must verify with `standardwebhooks.Webhook(secret).verify(body, headers)` and
`svix.webhooks.Webhook(secret).verify(body, headers)` for every secret of "accept", and be
refused by both for every secret of "reject". Prints one line per check; exits 1 on any miss.
"""

import json
import sys

import standardwebhooks
import svix.webhooks

LIBRARIES = {
    "standardwebhooks": lambda secret: standardwebhooks.Webhook(secret),
    "svix": lambda secret: svix.webhooks.Webhook(secret),
}


def verifies(library, secret, body, headers):
    try:
        LIBRARIES[library](secret).verify(body, headers)
        return True
    except Exception as error:  # both raise their own WebhookVerificationError
        print(f"  {library}: refused ({type(error).__name__}: {error})")
        return False


def main():
    with open(sys.argv[1], encoding="utf-8") as file:
        deliveries = json.load(file)
    misses = 0
    for n, delivery in enumerate(deliveries):
        body, headers = delivery["body"], delivery["headers"]
        for expected, secrets in ((True, delivery["accept"]), (False, delivery["reject"])):
            for i, secret in enumerate(secrets):
                for library in LIBRARIES:
                    ok = verifies(library, secret, body, headers) == expected
                    what = "accepts" if expected else "refuses"
                    print(f"delivery {n}: {library} {what} secret {i}: {'ok' if ok else 'MISS'}")
                    misses += not ok
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
