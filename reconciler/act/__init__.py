"""Effects on the nodes, and judging what they did: the actor (actor/) over the launcher that gets
ranks running (launcher/: the node agent over SSH, or Slurm) and the weights fetcher (fetch/); how a
replica of an earlier pass is doing (observed) and whether a start is Ready (readiness); the engines'
own load (engine_metrics), the pass's autoscale step (scaling) and a canary's checks (canary_checks)."""
