"""Testing: a stand-in for vLLM's OpenAI server whose latencies are known (``standin``), for
tests and benchmarks where the point is tuner and not vLLM: tuner's own, and an embedding
program's. Started in a process of its own (``start``), or installed as vLLM's ``api_server``
module for ``tuner run`` to start (``install_as_vllm``). No module of tuner outside this
package imports it.

The names offered to code outside tuner are in ``__all__``, each imported from its module when
first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.testing.launch import Started, install_as_vllm, start
    from tuner.testing.standin import Settings, body_key, main, serve

_FACE = {
    "Settings": "tuner.testing.standin",
    "Started": "tuner.testing.launch",
    "body_key": "tuner.testing.standin",
    "install_as_vllm": "tuner.testing.launch",
    "main": "tuner.testing.standin",
    "serve": "tuner.testing.standin",
    "start": "tuner.testing.launch",
}

__all__ = [
    "Settings",
    "Started",
    "body_key",
    "install_as_vllm",
    "main",
    "serve",
    "start",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
