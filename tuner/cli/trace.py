"""``tuner trace inspect`` and ``tuner trace from-prometheus``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.cli.output import check_file_target
from tuner.cli.parser import trace_options
from tuner.errors import InputError, TunerError
from tuner.traces import from_prometheus, plot, profile, prometheus
from tuner.traces.concurrency import load_concurrency
from tuner.traces.formats import CONCURRENCY, decide_format, load_trace
from tuner.traces.model import busiest_window_start
from tuner.traces.prometheus_http import read_access
from tuner.traces.source import is_stdin, read_source


def cmd_trace_inspect(args: argparse.Namespace) -> int:
    """``tuner trace inspect``: what a trace asks of a server, in numbers and a figure."""
    service = profile.ServiceModel(args.prefill_tokens_per_s, args.tpot_ms / 1000)
    if service.prefill_tokens_per_s <= 0 or service.tpot_s <= 0 or args.window_s <= 0:
        raise InputError("--window-s, --tpot-ms and --prefill-tokens-per-s must be positive")
    stem = "stdin" if is_stdin(args.file) else args.file.stem
    png = None if args.no_png else args.png or Path(f"{stem}-inspect.png")
    if png:
        check_file_target(png, "--png")
    source = read_source(args.file)
    fmt = decide_format(source, args.format, args.columns)
    try:
        if fmt == CONCURRENCY:
            schedule = load_concurrency(source)
            figures = profile.profile_concurrency(schedule)
            if png:
                plot.plot_concurrency(schedule, png)
        else:
            trace = load_trace(source, fmt, **trace_options(args))
            figures = profile.profile_trace(trace, args.window_s, service)
            if png:
                window = (busiest_window_start(trace, args.window_s), args.window_s)
                plot.plot_trace(trace, png, window, service)
    except OSError as exc:
        raise TunerError(f"cannot write {png}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(figures | {"png": str(png) if png else None}, indent=2))
    else:
        print(profile.format_profile(figures))
        if png:
            print(f"{'plot':<18} {png}")
    return 0


def cmd_trace_from_prometheus(args: argparse.Namespace) -> int:
    """``tuner trace from-prometheus``: a trace rebuilt from a Prometheus server's vLLM series."""
    start_s = prometheus.parse_time(args.start)
    end_s = prometheus.parse_time(args.end)
    access = read_access(
        args.header,
        bearer_token_file=args.bearer_token_file,
        basic_auth_user=args.basic_auth_user,
        basic_auth_password_file=args.basic_auth_password_file,
        ca_file=args.ca_file,
        insecure=args.insecure,
    )
    for path, option in ((args.out, "--out"), (args.concurrency_out, "--concurrency-out")):
        if path is not None:
            check_file_target(path, option)
    scraped = prometheus.fetch(args.url, start_s, end_s, args.step_s, args.selector, access=access)
    rebuilt = from_prometheus.rebuild(scraped, args.seed)
    concurrency_out = args.concurrency_out or args.out.with_suffix(".concurrency.csv")
    from_prometheus.write_trace(args.out, rebuilt)
    from_prometheus.write_concurrency(concurrency_out, rebuilt)
    trace = rebuilt.trace
    print(f"wrote {args.out}: {len(trace)} requests over {trace.span_s:.0f} s")
    print(f"wrote {concurrency_out}: {len(rebuilt.concurrency)} samples of the running requests")
    return 0
