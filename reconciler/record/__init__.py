"""What a pass leaves: status/ (status/), the gateway files' contents (gateway) and status/ read back
(status_view), the pass memory kept between passes (memory), the daemon's Prometheus metrics (metrics),
the event log and history (events, eventlog, history) and the shipped alert rules (alerts)."""
