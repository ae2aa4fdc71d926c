"""`reconciler gateway [CATALOG] [--address 127.0.0.1:4000] [-- EXTRA LITELLM ARGS]`: the real LiteLLM
proxy on status/gateway/litellm.yaml, following it with no connection refused and no stream cut, and
telling the pass what it serves (SPEC 13; reconciler/control/gateway_proxy.py says how)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

from reconciler.commands import catalog_dir
from reconciler.constants import Exit
from reconciler.errors import UsageError

DEFAULT_ADDRESS = "127.0.0.1:4000"


def main(args) -> int:
    root = catalog_dir(args.catalog, "gateway")
    litellm = os.environ.get("LLMFLEET_LITELLM") or shutil.which("litellm")
    if not litellm:
        raise UsageError("litellm is not on PATH: install the LiteLLM proxy (pip install 'litellm[proxy]==1.106.12')")
    if not os.environ.get("LITELLM_MASTER_KEY"):
        raise UsageError("LITELLM_MASTER_KEY is not set: LiteLLM needs its master key from the environment")
    extra = list(getattr(args, "litellm_args", None) or [])
    for flag in ("--config", "--port", "--host", "-c"):
        if flag in extra:
            raise UsageError(f"{flag} after --: reconciler gateway sets LiteLLM's {flag.strip('-')} itself")
    from reconciler.control.gateway_proxy import Gateway, bind

    sock = bind(args.address)
    host, port = sock.getsockname()[:2]
    gateway = Gateway(root, litellm, extra)
    print(f"reconciler gateway: following {gateway.file} at http://{host}:{port}; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    asyncio.run(gateway.run(sock))
    return Exit.OK
