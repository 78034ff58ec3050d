"""A study's fingerprint: what its trials were measured on and judged by.

Trials of one study compare only if they replayed the same window of the same trace, were
scored against the same SLOs and weights, searched the same space with the same fixed engine
arguments on the same model, and ran on the same vLLM and kind of device. The fingerprint holds
all of that, as the storage keeps it (JSON), and a resumed study is refused where it differs.
The device is kept without how many GPUs a worker sees (``environment.device_kind``): a study
measures layouts of several sizes (``tuner.study.plan.layouts``), each trial its own, and a
study recorded with a count (``2x NVIDIA H200``) reads as that kind.

The vLLM version and device are also recorded on each trial, when it is measured, so that the
configuration written names what the chosen trial ran on, whichever machine writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import optuna

from tuner.engine import environment
from tuner.errors import InputError
from tuner.study.plan.spec import StudySpec
from tuner.study.setup.objective import of_spec
from tuner.study.store.record import DEVICE, VLLM_VERSION

# The study user attribute that holds the fingerprint.
WORKLOAD_ATTR = "workload"


def measured_on() -> dict[str, str]:
    """The vLLM version and device of trials started on this machine (asks ``nvidia-smi``), by
    the names a trial records them under (``TrialRecord.measured_on``) and the fingerprint
    keeps them under too."""
    return {VLLM_VERSION: environment.vllm_version(), DEVICE: environment.device_name()}


def of_study(
    spec: StudySpec, workload: Mapping[str, Any], machine: Mapping[str, str]
) -> dict[str, Any]:
    """The fingerprint of a run: ``workload`` (the trace and window), what the spec scores and
    searches, and the ``machine`` its trials run on (empty when it adds none)."""
    space = {d.name: {k: v for k, v in asdict(d).items() if k != "name"} for d in spec.space}
    fields = {
        **workload,
        "model": spec.model,
        "engine_args": dict(spec.engine_args),
        "search_space": space,
        "slos": dict(spec.slos),
        "weights": dict(spec.weights),
        "max_error_rate": spec.max_error_rate,
        **_kind(machine),
    }
    fields |= of_spec(spec).fingerprint(spec)
    if spec.server is not None:
        # The app measured and how it was asked; absent for vLLM's server, as before.
        fields["server"] = spec.server.fingerprint()
    # As the storage gives it back: tuples become lists, integers in floats stay floats.
    loaded: dict[str, Any] = json.loads(json.dumps(fields))
    return loaded


def check_workload(study: optuna.Study, fingerprint: Mapping[str, Any]) -> str | None:
    """Refuse a study whose trials were measured or judged otherwise than ``fingerprint`` says
    (an ``InputError``); else what to say of keys it did not record, if anything.

    Compared on the keys both hold: the machine's (vLLM version, device) only when this run
    adds trials, and a study recorded before tuner checked the spec has only the trace and the
    window. Keys the study lacks are recorded now, and checked from then on; if the study has
    trials already, the line returned says which keys its earlier trials were not checked
    against.
    """
    recorded = study.user_attrs.get(WORKLOAD_ATTR)
    if recorded is None:
        study.set_user_attr(WORKLOAD_ATTR, dict(fingerprint))
        return None
    recorded = _kind(recorded)
    differ = differences(recorded, fingerprint)
    if differ:
        raise InputError(
            f"study {study.study_name!r} was measured another way ({'; '.join(differ)}): its "
            "trials would not compare with new ones; use --study NEWNAME (or delete the DB) to "
            "start a new study"
        )
    missing = [key for key in fingerprint if key not in recorded]
    if not missing:
        return None
    study.set_user_attr(WORKLOAD_ATTR, {**recorded, **fingerprint})
    if not study.trials:
        return None
    return (
        f"study {study.study_name!r} predates tuner checking {', '.join(sorted(missing))}: "
        f"its {len(study.trials)} trials were not checked against them; recorded now"
    )


def _kind(facts: Mapping[str, Any]) -> dict[str, Any]:
    """``facts`` with the device as its kind (``environment.device_kind``)."""
    device = facts.get(DEVICE)
    if not isinstance(device, str):
        return dict(facts)
    return {**facts, DEVICE: environment.device_kind(device)}


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for each key both hold with different values, in ``current``'s order;
    for a mapping, one per field that differs (``slos.ttft_p95_s: 2.0 -> 1.0``)."""
    found = []
    for key, new in current.items():
        if key not in recorded or recorded[key] == new:
            continue
        old = recorded[key]
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            fields = [*old, *(f for f in new if f not in old)]
            found += [
                f"{key}.{f}: {_shown(old, f)} -> {_shown(new, f)}"
                for f in fields
                if old.get(f) != new.get(f) or (f in old) != (f in new)
            ]
        else:
            found.append(f"{key}: {old!r} -> {new!r}")
    return found


def _shown(values: Mapping[str, Any], key: str) -> str:
    return repr(values[key]) if key in values else "absent"
