"""What is: the nodes as they answer. The probe (probe/: the node-side program and its parsers, asking
the fleet), SSH in one event loop (ssh/), the transports (transport), the snapshot read, checked and
written (inventory/), snapshot arithmetic (snapshot), and Slurm's text outputs parsed (slurm)."""
