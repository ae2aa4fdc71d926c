"""The dashboard (SPEC section 12): status/ as web pages, read-only, no SSH.

    files    status/ read on demand: each file parsed once per change, its last good parse kept
    what each page shows, computed from one snapshot of the files (pure: no I/O, no HTTP; the pages are
    these values rendered by templates, and tests can read them directly; everything a node or a catalog
    wrote is data here, the templates escape it):
      index       the snapshot cross-referenced, built once per version of the files
      cells       the fleet grid's cells: what one GPU is doing
      rejections  an unplaced replica's rejections grouped as `plan --format markdown` groups them
      overview    the overview page: the revision in force, whether it is HEAD's, the fleet counted
      models      the models page: each model the filters keep, its replicas and rejections
      fleet       the fleet page: the nodes the filters keep, a page of grid rows at a time
      filters     what the URL narrows a page to, and which rows of a long page it shows
    app      the ASGI app: routes, the read-only guard, templates (templates/, static/)
    server   uvicorn on a thread (the daemon's) or in the foreground (`reconciler dashboard`)
"""
