"""A declarative GitOps reconciler for LLM serving fleets.

The flow of one pass (`reconciler apply`; the daemon repeats it), and the folders it runs through:

    catalog/  catalog files --load_catalog------> Catalog ---+
                                                             +--> decide/ plan (pure) --> Plan.actions
    observe/  fleet over SSH --probe_fleet------> Inventory -+                               |
                                                                                             v
    record/   status/, gateway files, events <--- PassResult <--- act/ Actor (effects on the nodes)
    control/  who runs a pass and when: reconcile.run_pass (one pass), the daemon's loop, the leader

`plan` and `validate` are the same pass stopped early, so a pull-request
check and the daemon cannot disagree.

The rooms, top layer first; a room imports only from the rooms below it (.importlinter holds every
contract, one for the rooms and one inside each, and CI checks it):

    cli                 argument parsing; __main__ runs it
    commands/           one module per command (apply, plan, explain, validate, status, nodes, logs,
                        run, engine_check, dashboard, gateway, events, alert_rules); plan_words and
                        plan_markdown put a plan in words and in a pull-request comment; _observe reads a
                        snapshot or probes; _status_files reads status/
    dashboard/          status/ as read-only web pages, served by commands (dashboard, run) and importing none:
                        it shares the `status` JSON and words (record.status_view) and the rejection groups
                        (decide.placement) with them: files (status/ read, cached, last good kept);
                        what each page shows, pure: the snapshot cross-referenced (index) over the fleet
                        grid's GPU cells (cells) and an unplaced replica's rejections grouped (rejections),
                        the pages over it (overview, models, fleet) and what the URL narrows them to
                        (filters); the history's charts as inline SVG, pure (charts); app (Starlette routes,
                        the read-only guard, templates/, static/), server (uvicorn on a thread or in the
                        foreground)
    control/            who acts and when: one pass as a flat sequence of steps, status written deferred
                        (reconcile); the daemon's loop and signals (loop), the revision in force
                        (revisions), the watcher (watch), the lock (lock), its log (log), metrics from a
                        pass (pass_metrics), garbage collection between passes (collector); under
                        fleet.yaml `leader:`, the election and its pure judgement
                        (election) over etcd's v3 JSON gateway (etcd); `reconciler gateway`'s front over
                        the LiteLLM in force, a second LiteLLM taking each new litellm.yaml over (gateway_proxy)
    act/                effects on the nodes, and judging what they did:
      actor/              the pass's effects, through a Launcher, at once: the Actor (dispatch) over a
                          replace and its drain (replacing), weights fetched first (weights), a start or
                          restart (starting), the wait for Ready (waiting), stops (stopping), all over
                          the working state and its bookkeeping (work)
      observed, scaling   how a replica of an earlier pass is doing; the pass's autoscale step (each Ready
                          replica's load read once, through engine_metrics; decide.autoscale decides)
      engine_metrics      requests running and waiting, from an engine's own /metrics (draining, autoscaling)
      canary_checks       a canary's checks measured: its request sent to canary and stable copies, PromQL
                          through Prometheus's HTTP API; every fault a failed measurement in words
      canary_pass         the canary step of a pass: each rollout's copies judged, its checks measured when
                          due, the rollout moved on (decide.canary decides) and the daemon's next wake
      readiness           pure phase judgement + the health request
      launcher/           getting ranks onto nodes: the protocol and its outcomes (base); the node agent
                          (node_agent, stdlib only, runs on the node, fences a deposed leader's epoch, with
                          its /proc facts in agent_proc and its records and logs in agent_files) over any
                          transport (ssh_launcher), or Slurm jobs (slurm_launcher), with Slurm's view
                          folded into the probed inventory (slurm_fold)
      fetch/              copying weights to a node that lacks them (agent runs on the node)
    record/             what a pass leaves (beside act/, neither imports the other):
      eventlog            the event log and history samples on disk beside the memory: JSON lines,
                          bounded and rotated, read back filtered, followed (SPEC section 15)
      memory              what a pass hands the next (each replica's backoff, grace periods, drains,
                          rollouts), kept between one-shot applies (or in etcd under `leader:`)
      memory_document     the pass memory as a JSON-able document and back (unreadable: forgotten)
      status/             status/ from one PassResult: the pass's files (write) from the documents, pure
                          (documents), and what a plan predicts (predict); status/gateway/ with hand edits
                          detected (gateway_files); the autoscaled counts read back for planning
                          (read_back); deterministic YAML, atomic, only on change (files), written
                          straight from the document where PyYAML would write the same bytes (emit)
      metrics             the daemon's Prometheus metrics
      events, history,    pure: a pass's events from its PassResult against what the last pass left, and
      alerts              reading them back (filters, --since); one history sample per pass; the
                          Prometheus alerting rules over the daemon's metrics (`reconciler alert-rules`)
      gateway             status/gateway/'s contents: the LiteLLM config and Prometheus targets, from what
                          is Ready; what `reconciler gateway` serves (Served) and whether a hand-off is done
      status_view         status/ documents read back as values and words, for `status` and the dashboard
    decide/             pure decisions, no I/O, no clock:
      scheduling          the order actions need when they run at once, and the buffers their effects go to
      outcomes            the typed results of a pass: Decision, ReplicaState, PassMemory, PassResult
      plan                desired x observed -> ordered actions
      plan_values         what a plan is: the Plan, a replica that waits and why (Waiting), a serving
                          copy draining before it stops (Drain, drain_key)
      copies              what runs, for the plan: node records grouped into one copy per replica
      rollout, backoff    how a spec change rolls out: surge or in place, one at a time; the one backoff:
                          per replica how its tries went (crashes, failed starts), when it may be tried
                          next, and whether a try due now waits
      canary              a canary rollout's state (Progressing, Promoting, Complete, Aborted) and how a
                          pass moves it from its canary copies and the checks' measurements
      placement/          where replicas go (every rejection kept): the Placer (placer) over the
                          explanations (summary, unfittable, rejections), its candidate indexes
                          (indexes), the filters (rules) and the free capacity (capacity)
      autoscale           the count the load wants inside the range git holds, and its status block
    observe/            what is, as the nodes answer:
      probe/              the node-side probe program: one pass, the session, the payload (script), its
                          pure parsers (parse) and GPU health's (health), the node's files and children
                          (system), its GPUs (gpus) and everything else it reads (facts); asking a
                          node or the fleet (collect), the daemon's prober of the fleet (prober), and
                          a node's report read into an ObservedNode (report)
      ssh/                asyncssh in one event loop (loop): connecting (connect), a node's transport
                          (node), long-lived commands (remote), host keys (trust), OpenSSH config (config)
      inventory/          the snapshot: its file and document read into an Inventory (reading), an
                          Inventory written as a document (writing), a document checked (validation)
      transport,          transports (argv in, bytes out); snapshot arithmetic (pure); Slurm's text
      snapshot, slurm     outputs parsed (pure)
    catalog/            desired state: read YAML with positions (documents), check it (schema_check,
                        rules for a model, fleet_rules for fleet.yaml), build the frozen Catalog (build), the
                        directory as a whole (load), its
                        git revisions (gitrev)
    engines/            one adapter per engine (pure: vllm, sglang, llamacpp, command, over base),
                        their option tables (flags, parsers/*.json), and the exact argv of each rank (render)
    owner               the catalog's owner id (stable across clones), which every record on a node carries
    pyyaml_bounded      PyYAML's loaders, refusing first a file nested deep enough to overflow them
    model, errors,      the shared vocabulary at the root: frozen values; the exception tree; the JSON
    schemas, constants  Schemas (schema/, inside the package); names and exit codes
    host, vocabulary    one value for an address, parsed once; the StrEnums every state is spelled with
    agent_keys          the keys of the node agent's rank records and answers, named once (stdlib only:
                        sent at the head of the agent's text and of the probe's payload, which reads the records)
    frozen              @frozen: a frozen dataclass whose __init__ sets its fields in one step (hot values)
    teardown            what a one-shot command leaves to the process's exit instead of freeing it
    tiny_server         the stand-in model server of the single-machine example (no reconciler imports)

Decisions (decide/, engines/, readiness' judgements) do no I/O; effects sit at the edges and come in
through injected seams (transports, a launcher, a health check, a clock), so tests drive real
processes without mocking module paths.
"""

__version__ = "0.1.0"
