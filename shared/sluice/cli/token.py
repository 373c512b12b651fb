"""``sluice token``: mint a local admin JWT with the configured HS256 secret."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sluice.cli.output import emit
from sluice.ops.access import DEFAULT_TTL, ROLES, mint_token, parse_ttl


def cmd_token(args: argparse.Namespace) -> int:
    from sluice.core.settings import Settings

    settings = Settings.from_env()
    ttl = parse_ttl(args.ttl) if args.ttl else DEFAULT_TTL
    token = mint_token(settings, args.roles.split(","), subject=args.subject, ttl=ttl)
    if args.json:
        emit({"token": token, "subject": args.subject, "roles": args.roles.split(","),
              "ttlSeconds": int(ttl.total_seconds())})
        return 0
    print(token)
    print(f"sluice token: {args.subject} with roles {args.roles}, valid "
          f"{int(ttl.total_seconds())} s. Send it as 'Authorization: Bearer <token>', or as the "
          "__session cookie.", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("token", help="mint a local admin JWT (needs SLUICE_ADMIN_JWT_SECRET)")
    p.add_argument("--roles", required=True,
                   help=f"comma-separated roles: {', '.join(sorted(ROLES))}")
    p.add_argument("--ttl", help="lifetime: 90s, 30m, 12h, 7d (default 12h, at most 30d)")
    p.add_argument("--subject", default="local-dev", help="the sub claim (default local-dev)")
    p.set_defaults(func=cmd_token)
