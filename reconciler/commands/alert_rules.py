"""`reconciler alert-rules [--for DURATION]`: the Prometheus alerting rules shipped with the project."""

from __future__ import annotations

from reconciler.record.alerts import check_duration, rules_yaml
from reconciler.errors import UsageError


def main(args) -> int:
    if args.for_ is not None:
        try:
            check_duration(args.for_)
        except ValueError:
            raise UsageError(f"--for {args.for_!r}: expected a Prometheus duration such as 0s, 30s, 5m or 1h") from None
    print(rules_yaml(for_=args.for_), end="")
    return 0
