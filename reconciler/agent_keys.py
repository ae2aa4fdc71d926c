"""The node agent's keys, named once: those of a rank's record on a node and of the agent's answers.

The agent (launcher/node_agent.py) writes a record per rank, `<state_dir>/replicas/<name>.json`,
and answers each request with one JSON object; the probe (probe/facts.py) reads the records on
the node, and the management side reads what both send back (probe/report.py,
launcher/ssh_launcher.py). Every one of them spells a key through the names below.

This text is sent to nodes at the head of both programs (first in ssh_launcher.AGENT_MODULES;
in script.PAYLOAD_MODULES right after parse.py, whose `from __future__` line must open the
program), where the modules after it find these names already defined; on the management side
it is imported like any module. So it imports nothing, defines nothing but constants, and keeps
to Python 3.8 syntax.

The values are the on-disk and wire format: records written by an older agent are still on
nodes and are read through these same names, so a value never changes (tests/test_agent_keys.py
holds them to the literal set).
"""

MANAGER = "llm-reconciler"  # the value of Record.MANAGED_BY in every record of ours


class Record:
    """The keys of a rank's record, as the agent writes it (node_agent.new_record)."""

    ID = "id"  # the replica
    MODEL = "model"
    PROFILE = "profile"
    RANK = "rank"
    NNODES = "nnodes"
    SPEC_HASH = "spec_hash"
    PID = "pid"
    PGID = "pgid"
    START_TIME = "start_time"  # field 22 of /proc/<pid>/stat: a reused pid is not the engine
    STARTED_AT = "started_at"  # wall clock, seconds
    PORT = "port"
    GPUS = "gpus"
    ARGV = "argv"
    ENV_KEYS = "env_keys"  # the names of its environment's additions, never their values
    LOG = "log"
    MANAGED_BY = "managed_by"
    REVISION = "revision"  # the catalog commit it was started from (null when unknown)
    OWNER = "owner"  # only in the record of a catalog with an owner

    # Added by the readers, never written: whether its process still runs (agent status and
    # probe), its log's last lines (agent status) and the record's file name (probe).
    ALIVE = "alive"
    LOG_TAIL = "log_tail"
    FILE = "file"


# Every key a record is written with; OWNER only where the request carried one.
RECORD_KEYS = (
    Record.ID, Record.MODEL, Record.PROFILE, Record.RANK, Record.NNODES, Record.SPEC_HASH, Record.PID,
    Record.PGID, Record.START_TIME, Record.STARTED_AT, Record.PORT, Record.GPUS, Record.ARGV,
    Record.ENV_KEYS, Record.LOG, Record.MANAGED_BY, Record.REVISION, Record.OWNER,
)


class Answer:
    """The keys of the agent's answers (one JSON object per request)."""

    OK = "ok"
    REASON = "reason"  # why not ok
    FAILURE = "failure"  # of a refusal no retry mends: "permanent"
    PORT_IN_USE = "port_in_use"  # start: the port a foreign listener holds
    ALREADY_RUNNING = "already_running"  # start: adopted, not launched
    PID = "pid"
    PGID = "pgid"
    LOG = "log"  # start, logs, output: the log's path on the node
    START_TIME = "start_time"
    REVISION = "revision"
    RANKS = "ranks"  # stop: one entry per rank (RANK, PID, OK, DETAIL); status: the records
    RANK = "rank"
    DETAIL = "detail"  # stop: what became of the rank
    EXISTS = "exists"  # logs, output: whether the file is there
    LINES = "lines"
    OFFSET = "offset"  # where the next read of an appended log starts
    FENCED = "fenced"  # start, stop, fence: refused for an old epoch; the highest epoch this node has seen
