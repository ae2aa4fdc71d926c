"""Who acts and when: `reconciler run` (the daemon), one pass, and the gateway beside them. One job a module:

  loop.py           the daemon's loop: waking, signals and shutdown, one pass at a time, status written after each
  reconcile.py      one pass as a flat sequence of steps (observe, decide, act, record); status written deferred
  revisions.py      which revision is in force: pull, read what is committed, load it, status/catalog.yaml
  watch.py          the file watcher thread (git refs or working-tree files changed)
  lock.py           one reconciler acting on a catalog at a time, daemon or apply (flock)
  election.py       under fleet.yaml `leader:`, who acts: the election and its pure judgement, over
  etcd.py           etcd's v3 JSON gateway
  log.py            the daemon's log, text or JSON lines
  pass_metrics.py   metrics and node events from a pass result (served by record.metrics.MetricsServer)
  gateway_proxy.py  `reconciler gateway`: the front over the LiteLLM in force, a second LiteLLM taking each
                    new litellm.yaml over, status/gateway/served.json
"""
