"""Probing nodes: what each node really has, found without running anything it should not.

The node side is script.py (sent on stdin, stdlib only); this package's
management side sends it through an injected transport, concurrently, and turns
each node's JSON report into an ObservedNode joined with the operator's intent
from fleet.yaml (labels, cordoned/drained, fabric declarations, GPU class
override). A node that cannot be reached, or whose probe fails, is reported
`unreachable` with the reason, and never stops the others.
"""

from reconciler.observe.probe.collect import (
    FleetProbe,
    NodeProbe,
    probe_command,
    probe_fleet,
    probe_fleet_report,
    probe_node,
)
from reconciler.observe.probe.prober import FleetProber
from reconciler.observe.probe.report import observed_from_report

__all__ = [
    "FleetProbe",
    "FleetProber",
    "NodeProbe",
    "observed_from_report",
    "probe_command",
    "probe_fleet",
    "probe_fleet_report",
    "probe_node",
]
