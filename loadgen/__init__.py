"""wattserve's load generator: open/closed-loop KServe v2 load, HDR latency, server-side
window statistics from /metrics, SLO search, reports, and the study runner."""
