"""``tuner compile-key``: which searched engine arguments change vLLM's compile key."""

from __future__ import annotations

import argparse

from tuner.cli.spec import for_own_server
from tuner.engine import environment
from tuner.study.plan import key_dependence
from tuner.study.plan.space import capture_pin
from tuner.study.plan.spec import load_spec
from tuner.study.setup.prepare import write_dummy_model


def cmd_compile_key(args: argparse.Namespace) -> int:
    """Hash each searched dimension's values with vLLM's own config hashing, as the searched
    trials run them (with the pinned capture range, if any), and without the pin; for the
    user's own server, as a study of it takes the spec (``for_own_server``)."""
    spec = for_own_server(load_spec(args.spec), args.spec)
    write_dummy_model(spec)
    pinned = capture_pin(spec, environment.is_cpu_build())
    variants = {"searched trials": {**spec.engine_args, **pinned}}
    if pinned:
        pins = ", ".join(f"{k}={v}" for k, v in pinned.items())
        variants = {f"searched trials ({pins})": variants["searched trials"]}
        variants["without the pin"] = dict(spec.engine_args)
    found = key_dependence.key_dependence(spec.model, list(variants.values()), spec.space)
    print(f"vLLM {environment.vllm_version()}: VllmConfig.compute_hash() at each dimension's ends")
    for label, dependences in zip(variants, found, strict=True):
        print(f"{label}:")
        for dep in dependences:
            verdict = "changes the key" if dep.changes_key else "same key"
            values = ", ".join("default" if v is None else str(v) for v in dep.values)
            keys = ", ".join(k[:10] for k in dep.keys)
            print(f"  {dep.name:<46} {verdict:<16} {values}: {keys}")
    return 0
