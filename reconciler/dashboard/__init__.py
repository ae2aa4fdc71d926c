"""The dashboard (SPEC section 12): status/ as web pages, read-only, no SSH.

    files    status/ read on demand: each file parsed once per change, its last good parse kept
    views    what each page shows, computed from one snapshot of the files (pure)
    app      the ASGI app: routes, the read-only guard, templates (templates/, static/)
    server   uvicorn on a thread (the daemon's) or in the foreground (`reconciler dashboard`)
"""
