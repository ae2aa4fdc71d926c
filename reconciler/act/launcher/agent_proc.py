"""The node agent's /proc facts: processes, their groups, who listens on a port. Stdlib only.

Part of the node agent's text (ssh_launcher.AGENT_MODULES: agent_keys, agent_proc, agent_files,
then node_agent, as one program on `python3 -I -S -`); see node_agent.py.
"""

import errno
import os

if "Record" not in globals():
    # Not on a node: there, the text of agent_keys.py precedes this one and has defined it already.
    from reconciler.agent_keys import Record


def proc_stat(pid):
    """(state, pgrp, session, start_time) of pid, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the LAST ')'.
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    return rest[0], int(rest[2]), int(rest[3]), int(rest[19])


def running(stat):
    # A zombie has exited; it only waits for its parent to read its status.
    return stat is not None and stat[0] not in ("Z", "X")


def rank_alive(record):
    pid = record.get(Record.PID)
    if not isinstance(pid, int) or pid <= 0:
        return False
    stat = proc_stat(pid)
    return running(stat) and stat[3] == record.get(Record.START_TIME)


def group_members(pgid):
    """Live pids in process group or session `pgid` (an engine's workers stay in both)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = proc_stat(int(name))
        if running(stat) and (stat[1] == pgid or stat[2] == pgid):
            members.append(int(name))
    return sorted(members)


def listening_inodes(port):
    """Socket inodes LISTENing on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != "0A":  # 0A: TCP_LISTEN
                continue
            if int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def holds_socket(pid, wanted):
    """Whether process `pid` has an fd open on one of these `socket:[inode]` links."""
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd_dir + "/" + fd) in wanted:
                return True
        except OSError:
            continue
    return False


def socket_holders(inodes):
    """(pid, command name) of processes holding any of these socket inodes, where /proc lets us see."""
    wanted = {"socket:[%s]" % i for i in inodes}
    if not wanted:
        return []
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return sorted((pid, read_comm(pid)) for pid in pids if holds_socket(pid, wanted))


def read_comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def port_problem(port):
    """None when `port` is free to serve on, else a sentence naming the port and its holder."""
    import socket
    taken = False
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this node
        try:
            # Engines set SO_REUSEADDR too: a TIME_WAIT left by a stopped engine is no conflict.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                taken = True
        finally:
            s.close()
    inodes = listening_inodes(port)
    if not taken and not inodes:
        return None
    holders = socket_holders(inodes)
    if holders:
        who = ", ".join("pid %d (%s)" % h for h in holders)
        return "port %d is in use by %s" % (port, who)
    return "port %d is in use" % port
