"""A declarative GitOps reconciler for LLM serving fleets.

The flow of one pass (`reconciler apply`; the daemon repeats it):

    catalog files --catalog.load_catalog--> Catalog ---+
                                                       +--> plan.plan (pure) --> Plan.actions
    fleet over SSH --probe.probe_fleet----> Inventory -+          |
                                                                  v
              status/ <--status.py-- PassResult <--reconcile.run_pass-- actor.Actor (effects)

`plan` and `validate` are the same pass stopped early, so a pull-request
check and the daemon cannot disagree.

The modules, top layer first; a module imports only from the layers below it
(.importlinter holds every contract, and CI checks it):

    cli, commands/      argument parsing and wiring; one module per command
    daemon/             the loop and signals (loop), the revision in force (revisions), the
                        watcher (watch), the lock (lock), the log (events), metrics (observe)
    reconcile           one pass as a flat sequence of steps; status written deferred
    actor               the pass's effects: start, stop, replace, restart, through a Launcher, at once
    observed,           how a replica of an earlier pass is doing; the order actions need when they
    scheduling,         run at once, and the buffers their effects go to; the autoscale step (each
    scaling             Ready replica's load read once, through engine_metrics, then autoscale.decide)
    readiness, memory,  pure phase judgement + the health request; what a pass hands the
    outcomes            next; the typed results (Decision, ReplicaState, PassResult)
    catalog/, probe/,   read and validate YAML; probe nodes; write status; launch ranks
    status, launcher/,  (SSH node agent); ssh/ (asyncssh, one event loop); git; metrics
    ssh, gitrev, metrics
    plan                desired x observed -> ordered actions (pure)
    placement/, render  where replicas go (pure, every rejection kept); the exact argv of each rank
    engines/            one adapter per engine (pure)
    inventory,          the snapshot document <-> Inventory; transports (argv in, bytes out);
    transport, snapshot snapshot arithmetic (pure); autoscale: the count the load wants inside
    autoscale           the range git holds, and its status block (pure)
    model, errors       frozen values; the exception tree
    host                one value for an address, parsed once

Decisions (placement, plan, render, engines, readiness' judgements) do no I/O;
effects sit at the edges and come in through injected seams (transports, a
launcher, a health check, a clock), so tests drive real processes without
mocking module paths.
"""

__version__ = "0.1.0"
