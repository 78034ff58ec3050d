"""Traces: the request trace model, its file formats and readers, concurrency traces, the
replay window (workload), traces rebuilt from Prometheus, and a trace's profile and plot."""
