"""The report's HTML: the verdict first, then every trial, the landscape, history and cost; in
a capacity study, each configuration's latency against offered rate after the trials.

Pure: builds one self-contained page (figures embedded as ``data:`` URIs, no script, no link
off the page) from a ``StudyReport`` and the PNG bytes of its figures.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape

from tuner.engine.environment import command_to_serve
from tuner.report.data import (
    FEASIBLE,
    INFEASIBLE,
    PRUNED,
    VALUED_BY,
    VALUES,
    StudyReport,
    TrialRow,
    cost,
    in_seconds,
    not_measurement_share,
    value_of,
)
from tuner.report.plots import label_of
from tuner.report.presenters import (
    FIGURES,
    RATE_PRESENTER,
    RATES,
    RATES_FIGURE,
    VALUE,
    Presenter,
    presenter_of,
)
from tuner.report.rate_curves import MOST_CURVES, CurveSet, rate_curves_of
from tuner.report.verdict import chosen_is_baseline, confirmation_part, listed, said
from tuner.study.measure.trial import ENGINE_START_S, TRIAL_S
from tuner.study.result.emit import SERVE_WITH, THIS_FILE
from tuner.study.result.words import words_of
from tuner.study.store.record import RATES_ATTR, RESOLVED_ATTR
from tuner.study.store.storage import dashboard_target

# Figures in the verdict after the SLOs: user attribute, label, scale, digits, unit.
THROUGHPUT = (
    ("throughput_req_per_s", "throughput", 1.0, 2, " req/s"),
    ("throughput_output_tokens_per_s", "output tokens", 1.0, 0, " tok/s"),
)
# Figures in the trials table.
TABLE_FIGURES = ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s", "throughput_req_per_s")
# Where a request's time went, in the verdict: label, tuner's client's mean, vLLM's own mean
# (means: exact from vLLM's histograms, where its quantiles are interpolated in buckets).
TIME_ROWS = (
    ("time to first token", "ttft_mean_s", "server_ttft_mean_s"),
    ("  waiting in vLLM's queue", None, "server_queue_mean_s"),
    ("  prefill", None, "server_prefill_mean_s"),
    ("decode", None, "server_decode_mean_s"),
    ("end to end", "e2e_mean_s", "server_e2e_mean_s"),
)
# A capacity trial's user attributes: how many rates it measured, whether it ended resolved.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
td { white-space: nowrap; } td.text { white-space: normal; min-width: 12em; }
th:first-child, td.text { text-align: left; }
td.ok { background: #e3f4e3; } td.miss { background: #f8dddd; }
tr.chosen td { font-weight: bold; }
pre { background: #f4f4f4; padding: 0.8em; overflow-x: auto; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; }
"""


def fmt(metric: str, value: float | None) -> str:
    """A figure as the page shows it (ms, req/s, a share or a score), "n/a" if not measured."""
    if value is None:
        return "n/a"
    if metric == "error_rate":
        return f"{value:.1%}"
    if metric in VALUED_BY:
        return words_of(VALUED_BY[metric]).text(value)
    for key, _, scale, digits, unit in THROUGHPUT:
        if key == metric:
            return f"{value * scale:.{digits}f}{unit}"
    if in_seconds(metric):
        ms = value * 1000
        return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"
    return f"{value:g}"


def short_label(metric: str) -> str:
    """A figure's name as the tables show it (their cells carry the unit)."""
    return label_of(metric).removesuffix(" (ms)")


def _columns(report: StudyReport) -> list[tuple[TrialRow, str]]:
    """The verdict's trials: the chosen one, the baseline, each candidate's latest trial."""
    by_number = {r.number: r for r in report.rows}
    roles: dict[int, list[str]] = {}
    if report.chosen is not None:
        best = "unconfirmed" if report.unconfirmed_because else "best"
        roles[report.chosen] = [best if report.meets_slos else "closest"]
    if report.chosen is not None and chosen_is_baseline(report):
        roles[report.chosen].append(report.baseline_name)  # one of the baseline's measurements
    elif report.baseline is not None:
        roles.setdefault(report.baseline, []).append(report.baseline_name)
    if report.closest is not None:
        roles.setdefault(report.closest, []).append("closest searched")
    for row in report.rows:
        if row.kind.startswith("candidate") and row.outcome != "interrupted":
            roles.setdefault(row.number, []).append(row.kind)
    return [(by_number[n], f"trial {n}: " + ", ".join(r)) for n, r in roles.items()]


def _cell(row: TrialRow, metric: str, limit: float | None) -> str:
    value = row.figure(metric)
    text = fmt(metric, value)
    if row.outcome == PRUNED and value is not None and metric not in VALUES:
        text = f"&ge; {text}"
    if limit is None or value is None or (row.outcome == PRUNED and value <= limit):
        # A pruned trial's figure is a lower bound: under the limit, it says nothing.
        return f"<td>{text}</td>"
    return f'<td class="{"ok" if value <= limit else "miss"}">{text}</td>'


def _windows_cell(row: TrialRow) -> str:
    """How many rates a capacity trial measured; ``unresolved`` where its search stopped (at
    its probe limit, floor or ceiling) before its passing and failing rates were close."""
    windows = row.figure(RATES_ATTR)
    if windows is None:
        return "<td></td>"
    return f"<td>{windows:.0f}{' (unresolved)' if row.figure(RESOLVED_ATTR) == 0.0 else ''}</td>"


def verdict_section(report: StudyReport) -> str:
    """The page's verdict: the configuration chosen against the baseline, or why none was."""
    columns = _columns(report)
    if report.chosen is None:
        first = next((r for r in report.rows if r.outcome in ("failed", "interrupted")), None)
        why = f"trial {first.number}: {escape(first.reason)}" if first else "no trial finished"
        return f'<section id="verdict"><h2>Verdict</h2><p>No trial served the window. {why}</p>'
    chosen = next(r for r in report.rows if r.number == report.chosen)
    head = "".join(f"<th>{escape(label)}</th>" for _, label in columns)
    slo_rows = []
    for metric, limit in report.slos.items():
        cells = "".join(_cell(row, metric, limit) for row, _ in columns)
        slo_rows.append(
            f"<tr><th>{escape(short_label(metric))}</th><td>{fmt(metric, limit)}</td>{cells}</tr>"
        )
    metric = report.objective.metric
    value = "".join(_cell(row, metric, None) for row, _ in columns)
    windows = "".join(_windows_cell(row) for row, _ in columns)
    parts = {
        VALUE: [f"<tr><th>{escape(label_of(metric))}</th><td></td>{value}</tr>"],
        RATES: [f"<tr><th>rates measured</th><td></td>{windows}</tr>"],
        FIGURES: slo_rows,
    }
    shown = presenter_of(report.objective)
    body = [row for part in shown.rows for row in parts[part]]
    note = ""
    if shown.figures_at:
        note = (
            f'<p class="note">Each trial\'s SLO metrics and throughput are {shown.figures_at}.</p>'
        )
    outcomes = "".join(
        f'<td class="{"ok" if row.outcome == FEASIBLE else "miss"}">{row.outcome}</td>'
        for row, _ in columns
    )
    body.append(f"<tr><th>meets every SLO</th><td></td>{outcomes}</tr>")
    for key, label, *_ in THROUGHPUT:
        cells = "".join(_cell(row, key, None) for row, _ in columns)
        body.append(f"<tr><th>{label}</th><td></td>{cells}</tr>")
    return (
        f'<section id="verdict"><h2>Verdict</h2><p>{said(report, chosen)}</p>'
        f"{confirmation_part(report)}"
        f'<table id="verdict-table"><tr><th></th><th>SLO</th>{head}</tr>{"".join(body)}</table>'
        f"{note}{time_part(columns)}{spent_part(report)}"
        f"{configuration_part(report, chosen.number)}</section>"
    )


def time_part(columns: Sequence[tuple[TrialRow, str]]) -> str:
    """Where a request's time went in each verdict trial: tuner's client's means beside vLLM's
    own (its histograms' exact means), vLLM's split into queue, prefill and decode; nothing
    where no trial has vLLM's figures."""

    def ms(value: float | None) -> str:
        return "" if value is None else f"{value * 1000:.1f} ms"

    if not any(row.figure("server_e2e_mean_s") is not None for row, _ in columns):
        return ""
    head = "".join(f'<th colspan="2">{escape(label)}</th>' for _, label in columns)
    sub = "<th>tuner's client</th><th>vLLM</th>" * len(columns)
    body = []
    for label, client, server in TIME_ROWS:
        cells = "".join(
            f"<td>{ms(row.figure(client)) if client else ''}</td><td>{ms(row.figure(server))}</td>"
            for row, _ in columns
        )
        body.append(f"<tr><th>{escape(label)}</th>{cells}</tr>")
    return (
        '<h3>Where a request\'s time went</h3><p class="note">Means over the window (at the '
        "capacity, in a capacity study). vLLM's figures are its own histograms' exact means, from "
        "its <code>/metrics</code> before and after the window; end to end, tuner's client adds "
        "the API server's work, the network and its own delay to vLLM's.</p>"
        f'<table id="time-table"><tr><th></th>{head}</tr><tr><th></th>{sub}</tr>'
        f"{''.join(body)}</table>"
    )


def spent_part(report: StudyReport) -> str:
    """Where the chosen trial's time went (and the baseline's), as ``tuner run`` says it;
    nothing where no trial recorded vLLM's figures."""
    if not report.time_spent:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in report.time_spent)
    return f'<ul id="time-spent">{items}</ul>'


def configuration_part(report: StudyReport, chosen: int) -> str:
    """The configuration file written for the chosen trial, or why it is not there."""
    config = report.configuration
    if config is None:
        return ""
    path = escape(str(config.path))
    if not config.written:
        note = (
            f"No {path} yet (<code>tuner run --n-trials 0</code> with this study writes it, "
            f"with the model); trial {chosen}'s engine arguments:"
        )
    elif config.trial == chosen:
        note = f"<code>tuner run</code> wrote trial {chosen} to {path}:"
    else:
        note = (
            f"{path} is not from this trial (it says trial {config.trial}); "
            "<code>tuner run --n-trials 0</code> with this study writes this one."
        )
    command = escape(served_with(config.text, str(config.path)))
    return (
        f'<h3>Configuration</h3><p>{note}</p><pre id="config">{escape(config.text)}</pre>'
        f"<p>Serve it with <code>{command}</code></p>"
    )


def served_with(text: str, path: str) -> str:
    """How to serve the configuration at ``path``: its header's own line (``vllm serve``, or
    the user's app), else ``vllm serve``."""
    for line in text.splitlines():
        if line.startswith(SERVE_WITH):
            command = line.removeprefix(SERVE_WITH)
            return command.replace(f"'{THIS_FILE}'", path).replace(THIS_FILE, path)
    return command_to_serve(path)


def trials_section(report: StudyReport) -> str:
    """Every trial as a row; where trials search rates (a capacity study), the value and the
    rates measured after its outcome, else (a latency study's score) the value after its
    figures."""
    names = [p.name for p in report.parameters]
    metric = report.objective.metric
    presenter = presenter_of(report.objective)
    heads = {
        VALUE: [words_of(report.objective).name],
        RATES: ["rates measured"],
        FIGURES: [*map(short_label, TABLE_FIGURES)],
    }
    head = ["trial", "kind", *names, "outcome"]
    head += [h for part in presenter.rows for h in heads[part]]
    head += ["engine start s", "trial s", "why it failed or was pruned"]
    rows = []
    for row in report.rows:
        shown = [value_of(row, name) for name in names]
        cells = [f'<td class="text">{row.kind}</td>']
        cells += [f"<td>{'default' if v is None else escape(str(v))}</td>" for v in shown]
        cells.append(f'<td class="text">{row.outcome}</td>')
        parts = {
            VALUE: [_cell(row, metric, None)],
            RATES: [_windows_cell(row)],
            FIGURES: [_cell(row, m, report.slos.get(m)) for m in TABLE_FIGURES],
        }
        cells += [cell for part in presenter.rows for cell in parts[part]]
        for phase in (ENGINE_START_S, TRIAL_S):
            seconds = row.seconds(phase)
            cells.append(f"<td>{'' if seconds is None else f'{seconds:.1f}'}</td>")
        cells.append(f'<td class="text">{escape(row.reason)}</td>')
        mark = ' class="chosen"' if row.number == report.chosen else ""
        rows.append(f"<tr{mark}><td>{row.number}</td>{''.join(cells)}</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    note = (
        f'<p class="note">Each trial\'s latency and throughput are {presenter.figures_at}; '
        "unresolved: its search stopped (at its probe limit, floor or ceiling) before its "
        "passing and failing rates were within the resolution.</p>"
        if RATES in presenter.rows
        else ""
    )
    return (
        f'<section id="trials"><h2>Trials</h2>{note}<table id="trials-table"><tr>{header}</tr>'
        f"{''.join(rows)}</table></section>"
    )


def _img(images: Mapping[str, bytes], name: str, alt: str) -> str:
    if name not in images:
        return f'<p class="note">No {escape(alt)}: no trial to draw.</p>'
    data = base64.b64encode(images[name]).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}" title="{name}">'


def rates_caption(drawn: CurveSet, shown: Presenter = RATE_PRESENTER) -> str:
    """What the rate figure shows (its star as ``shown`` says), and which configurations it
    leaves out."""
    panels = listed([short_label(m) for m in drawn.metrics])
    said = (
        f"{panels} of each configuration at each rate it replayed: a filled dot met every SLO, "
        "a cross missed one, a hollow triangle was stopped early once an SLO was lost for "
        f"certain (its figures are lower bounds); the star is {shown.star}; dashed: the SLO."
    )
    if drawn.left_out:
        added = len(drawn.curves) > MOST_CURVES
        baseline = " and the baseline" if added else " (the baseline among them)"
        trials = listed([str(n) for n in drawn.left_out])
        said += (
            f" Drawn: the {MOST_CURVES} configurations of the highest capacity{baseline}; left "
            f"out, with less capacity: trial{'s' if len(drawn.left_out) > 1 else ''} {trials} "
            "(see the table)."
        )
    return said


def rates_section(report: StudyReport, images: Mapping[str, bytes]) -> str:
    """Latency against offered rate, where the study's presenter draws it (a study whose trials
    search rates); nothing elsewhere."""
    shown = presenter_of(report.objective)
    if RATES_FIGURE not in shown.figures:
        return ""
    drawn = rate_curves_of(report, shown.rate_panels)
    return (
        '<section id="rates"><h2>Latency against offered rate</h2>'
        f'<p class="note">{rates_caption(drawn, shown)}</p>'
        f"{_img(images, 'rates.png', 'latency against offered rate')}</section>"
    )


def figures_section(report: StudyReport, images: Mapping[str, bytes]) -> str:
    """The figures (inline PNGs) and what share of the trials' time was not measurement."""
    share = not_measurement_share(cost(report.rows))
    cost_text = (
        f"{share:.0%} of the trials' time was not measurement (engine start, warm-up, stop)."
        if share is not None
        else ""
    )
    value = words_of(report.objective).name
    at = f" (at each trial's {value})" if presenter_of(report.objective).figures_at else ""
    parts: Sequence[str] = (
        rates_section(report, images),
        '<section id="landscape"><h2>Landscape</h2><p class="note">Each searched parameter '
        f"against the {value}, TTFT p95 and TPOT p95{at}; dashed: the SLO; pruned trials show "
        "what they had reached when stopped.</p>",
        _img(images, "landscape.png", "landscape")
        if report.parameters
        else '<p class="note">No parameter was searched yet.</p>',
        '</section><section id="history"><h2>Search history</h2>',
        _img(images, "trials.png", "figures per trial"),
        _img(images, "history.png", f"{value} history"),
        f'</section><section id="cost"><h2>Trial cost</h2><p>{cost_text}</p>',
        _img(images, "cost.png", "trial cost"),
        "</section>",
    )
    return "".join(parts)


def _measured_by(report: StudyReport) -> str:
    """Which tuner build, vLLM and device measured which trials; nothing where none is known."""
    if not report.measured_by:
        return ""
    lines = "<br>".join(escape(line) for line in report.measured_by)
    return f'<p class="note">Measured by {lines}</p>'


def render(report: StudyReport, images: Mapping[str, bytes]) -> str:
    """The whole HTML page, self-contained."""
    counts = {o: sum(r.outcome == o for r in report.rows) for o in (FEASIBLE, INFEASIBLE, PRUNED)}
    others = len(report.rows) - sum(counts.values())
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    if others:
        summary += f", {others} failed or unfinished"
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>tuner report: {escape(report.name)}</title><style>{STYLE}</style></head><body>"
        f'<h1>Study {escape(report.name)}</h1><p class="note">{len(report.rows)} trials in '
        f"{escape(report.storage)}: {summary}. Every figure is also in optuna-dashboard: "
        f"<code>optuna-dashboard {escape(dashboard_target(report.storage))}</code></p>"
        f"{_measured_by(report)}"
        f"{verdict_section(report)}{trials_section(report)}{figures_section(report, images)}"
        "</body></html>\n"
    )
