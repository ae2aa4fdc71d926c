"""SSH to nodes, on asyncssh: the only package that talks SSH.

One persistent connection per node, kept by a TransportPool across passes (the daemon probes
and applies over the same connections every pass), reopened with backoff when it breaks. All
connections of a pool live in one asyncio event loop in one thread (loop.py): an idle node
holds one socket and no thread, so thousands of nodes cost one process little. Callers stay
synchronous: SshTransport.run and Stream.request block the calling thread until the loop
answers, each bounded by the node's connect_timeout_s and command_timeout_s (sending stdin
included); Stream.submit gives a Future instead, so the probe waits on thousands at once
without a thread each.

The modules, each with one job:
- config:  where and as whom to connect (fleet.yaml over ~/.ssh/config, `ssh -G` for
           Include/Match); paramiko reads the config file format, nothing else of it is used
- trust:   known_hosts (refused/changed/revoked keys are permanent failures, named by
           fingerprint) and private keys
- loop:    the one event loop thread
- connect: TCP, ProxyJump chains, handshake and login; foreign errors -> TransportError, once
- remote:  commands and kept-open streams on a connection: output caps (a hostile node cannot
           grow our memory), the prologue that names each command's pid so one left running
           past its deadline is ended on the node when the node answers again
- node:    SshTransport (the transport.Transport a node gets, with backoff) and TransportPool
"""

from reconciler.observe.ssh.config import (
    DEFAULT_IDENTITIES,
    DEFAULT_KNOWN_HOSTS,
    OpenSshConfig,
    Target,
    load_ssh_config,
    parse_jump,
    resolve_target,
    tcp_port,
)
from reconciler.observe.ssh.connect import _Connector, _Shared
from reconciler.observe.ssh.node import PERMANENT_RECHECK_S, SshTransport, TransportPool
from reconciler.observe.ssh.remote import _PROLOGUE, _REAP, MAX_OUTPUT_BYTES, RemoteStream, wrapped
from reconciler.observe.ssh.trust import HostKey, HostKeyCheck, KnownHosts, fingerprint, load_known_hosts

__all__ = [
    "DEFAULT_IDENTITIES", "DEFAULT_KNOWN_HOSTS", "MAX_OUTPUT_BYTES", "PERMANENT_RECHECK_S", "HostKey", "HostKeyCheck",
    "KnownHosts", "OpenSshConfig", "RemoteStream", "SshTransport", "Target", "TransportPool", "_Connector", "_PROLOGUE",
    "_REAP", "_Shared", "fingerprint", "load_known_hosts", "load_ssh_config", "parse_jump", "resolve_target",
    "tcp_port", "wrapped",
]
