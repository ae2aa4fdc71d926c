"""status/: what the reconciler writes back into the catalog (SPEC section 2), one concern a module:

    write           status/ for one pass, from its PassResult (write_pass), and status/catalog.yaml
    documents       the documents themselves, pure: a model's file, endpoints.yaml, catalog.yaml
    predict         what a plan predicts a pass leaves (phases, failure kinds, messages, revisions)
    gateway_files   status/gateway/: the LiteLLM config and Prometheus targets, hand edits detected;
                    what `reconciler gateway` serves
    read_back       what status/ holds that a pass plans with: the autoscaled counts in force
    files           deterministic YAML, written atomically, only when content changes
"""
