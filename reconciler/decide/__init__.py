"""Pure decisions: desired x observed -> what to do. Placement (placement/), the plan (plan) over what
runs grouped into copies (copies), how a change rolls out (rollout) and a canary's state machine
(canary), the one backoff (backoff), the count the load wants (autoscale), the typed outcomes a pass
hands on (outcomes), and the order actions need when they run at once (scheduling). No I/O, no clock."""
