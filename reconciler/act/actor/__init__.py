"""The actor: carries out plan actions on the nodes, through a Launcher. Effects only.

A replica is not "placed" until a process runs on every node the plan named
and the ranks found each other (the seed's lesson). So:

- a replica's ranks start as one: workers first, head last (the head waits
  for its workers), and if any rank fails to start, the ranks already started
  are stopped again, so nothing is left half-started;
- a rank never starts on a GPU a foreign process uses, or whose memory is
  mostly taken, and the refusal names the process and the MiB;
- records on the nodes are the memory: after a restart, whatever runs is
  adopted as it is (the node agent answers "already running" instead of
  launching a second copy).

Every action returns an ActionOutcome and records Decisions; what to do is
the plan's, whether it serves is readiness.py's (observed.py for a replica of
an earlier pass), the snapshot arithmetic is snapshot.py's.

The actions of a pass run at once (`act_all`, a bounded pool), each command
under its node's own deadline, so a node that stops answering holds up only
the actions on it. What has to stay in order does: an action waits for the
earlier ones about the same replica or about a GPU or port it takes or frees
(scheduling.py: a stop that frees GPUs before the start that takes them; Slurm
submissions in plan order); inside one action the steps are as before (a stop-first replace stops,
then starts; ranks start in start_order). Each action writes its effects to a
buffer of its own, merged in plan order, so the decisions, the snapshot after
the pass and status read as if the actions had run one after another.

The modules, top first (each imports only from those below it; .importlinter holds it):

    dispatch            the Actor: every action of a pass at once (act_all), each sent to its handler
    replacing, weights  a replace, old copy first or new copy first (and the old one left to drain);
                        weights copied to the nodes that lack them, before anything starts
    starting, waiting   a start (and a restart: a stop, then a start), ranks rolled back as one;
                        waiting for what the pass started to be Ready (readiness.py judges)
    stopping            ranks stopped: a stop, a restart's or a replace's, a start past its timeout
    work                the working state: each action's effects buffer, decisions, states, records
"""
