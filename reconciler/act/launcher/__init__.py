"""How ranks get onto nodes: one small interface, so nothing above it cares who launched them.

Two implementations: the SSH launcher (`SshLauncher`) sends the node agent
(`node_agent.py`, stdlib-only) over any Transport, so it works for `transport: local`
nodes and SSH nodes alike; the Slurm launcher (`slurm_launcher.SlurmLauncher`) submits
one job per replica through sbatch and finds it again with squeue (SPEC section 8).
`slurm_launcher.fleet_launcher` picks per node. Placement, rendering and status only
ever see `RankLaunch` in and the outcomes below out.
"""

from reconciler.act.launcher.base import StartOutcome, StopOutcome, RankState, LogChunk, Launcher
from reconciler.act.launcher.ssh_launcher import SshLauncher

__all__ = ["StartOutcome", "StopOutcome", "RankState", "LogChunk", "Launcher", "SshLauncher"]
