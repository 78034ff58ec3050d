"""``tuner run --server-url URL``: a server someone else started, measured once as it is.

tuner did not start that server, so it can set none of its engine arguments: nothing is
searched, no configuration is written (tuner measured none it could write), and the server is
left running. The one measurement is a trial of the spec's objective (the window replayed at
the trace's speed, or the capacity search), made on a ``tuner.engine.url_server.UrlServer``
(``tuner.study.result.run.Run.measure``) in a study held in memory; its line is printed and the
exit status says whether it met the SLOs.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import httpx
import optuna

from tuner.cli.exits import EXIT_FAILED, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.inputs import read_trace, study_of, workload_of
from tuner.cli.progress import RunLines
from tuner.cli.run import run_config
from tuner.cli.spec import checked_spec, load_study_spec
from tuner.engine.url_server import UrlLauncher
from tuner.errors import InputError
from tuner.study.result.run import Run
from tuner.study.setup.objective import of_spec
from tuner.study.setup.prepare import model_of
from tuner.study.store.record import TrialRecord
from tuner.study.trials import search
from tuner.urls import shown_url

# What a search, a confirmation or a stored study would take: none is made of a server tuner
# did not start.
NOT_FOR_A_URL = (
    "server_command", "confirm_only", "n_trials", "time_budget_s", "report", "json",
)  # fmt: skip


def cmd_server_url(args: argparse.Namespace) -> int:
    """Measure the server at ``--server-url`` once with the spec's objective; 0 where it met the
    SLOs, 3 where it served but missed them, 1 where it served nothing."""
    given = [f"--{name.replace('_', '-')}" for name in NOT_FOR_A_URL if getattr(args, name)]
    if given:
        raise InputError(
            "--server-url measures a server tuner did not start once, searching nothing and "
            f"storing no study: {', '.join(given)} does not apply"
        )
    url = args.server_url
    if not url.startswith(("http://", "https://")):
        raise InputError(f"--server-url {shown_url(url)}: not an http:// or https:// URL")
    try:
        httpx.URL(url)
    except httpx.InvalidURL:
        # httpx's words name a piece of the URL (a password cut at its '#' read as the port).
        raise InputError(
            f"--server-url {shown_url(url)}: not a URL httpx can read (a '#', '/', '?' or '@' "
            "in its password is written %23, %2F, %3F, %40)"
        ) from None
    name = study_of(args)
    read = read_trace(args)
    spec = load_study_spec(args, name, read.trace)
    spec = checked_spec(args, name, spec, read.trace is not None, measures=False)
    # One measurement: at the trace's speed where the spec says auto, as no calibration is run.
    config = replace(run_config(args, name, spec), n_trials=1)
    workload = workload_of(args, config, spec, read, model_of(spec))
    print(
        f"server: {shown_url(url)}, not started by tuner: measured once as it is, nothing "
        "searched, no configuration written, the server left running"
    )
    storage = optuna.storages.InMemoryStorage()
    study = search.open_study(name, storage, spec.seed, objective=of_spec(spec))
    lines = RunLines(spec)
    run = Run(study, spec, workload, config, lines, launcher=UrlLauncher(url))
    with lines.showing():
        trial = run.measure({})
    recorded = TrialRecord.of(trial)
    figures = recorded.figures
    served = f"{figures.get('requests_ok', 0.0):.0f} of {figures.get('requests', 0.0):.0f}"
    if recorded.feasible:
        print(f"{shown_url(url)}: {served} requests served; it met the SLOs")
        return EXIT_MEETS_SLOS
    if figures.get("requests_ok", 0.0) > 0:
        print(f"{shown_url(url)}: {served} requests served; it missed the SLOs")
        return EXIT_MISSES_SLOS
    print(f"{shown_url(url)}: it served no request")
    return EXIT_FAILED
