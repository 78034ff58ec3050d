"""A server of the user's own: their application around vLLM's ``AsyncLLM``, started per trial.

Many services do not run ``vllm serve``: they build the engine from ``AsyncEngineArgs`` in their
own app, behind their own endpoint. For them tuner runs the app's command (``ServerCommand``),
``{port}`` and ``{config}`` filled in per trial: ``{config}`` is a YAML whose keys are the
trial's ``AsyncEngineArgs`` fields (``tuner.flags.engine_fields_yaml``), the file the app
reads. The app runs as its own process group that dies with tuner (``CommandLauncher``) and is
stopped as ``vllm serve`` is (``tuner.engine.process.Engine.stop``): SIGTERM to the group, then
SIGKILL to what is left.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tuner.engine.launchers import EngineFailed, Launcher, ServerProcess, spawn
from tuner.engine.process import Engine, free_port, server_env
from tuner.flags import engine_fields_yaml

logger = logging.getLogger(__name__)

PORT = "{port}"
CONFIG = "{config}"
# What tuner's lines call a server started by its own command.
OWN_SERVER_NAME = "your server"
# The port the written configuration's command names: the app's own choice once tuned.
SERVE_PORT = 8000


@dataclass(frozen=True)
class ServerCommand:
    """The command that starts the app, ``{port}`` and ``{config}`` in it (each at least once),
    and the path that answers 200 once the app serves."""

    command: str
    health_path: str = "/health"

    def __post_init__(self) -> None:
        for placeholder in (PORT, CONFIG):
            if placeholder not in self.command:
                raise ValueError(f"the server command has no {placeholder}: {self.command!r}")
        if not shlex.split(self.command):
            raise ValueError("the server command is empty")
        if not self.health_path.startswith("/"):
            raise ValueError(f"the health path must start with /, got {self.health_path!r}")

    def argv(self, port: int | str, config: str) -> list[str]:
        """The command's words with ``{port}`` and ``{config}`` filled in (no shell)."""
        return [
            word.replace(PORT, str(port)).replace(CONFIG, config)
            for word in shlex.split(self.command)
        ]

    def serve_command(self, config: str) -> str:
        """How a person starts the app on the configuration at ``config``."""
        return self.command.replace(PORT, str(SERVE_PORT)).replace(CONFIG, shlex.quote(config))

    def config_text(self, fields: Mapping[str, Any]) -> str:
        """The engine-config file of these engine arguments, as the app reads it."""
        return engine_fields_yaml(fields)

    def engine(
        self,
        model: str,
        args: Mapping[str, Any],
        workdir: Path,
        launcher: Launcher,
        env: Mapping[str, str],
    ) -> OwnEngine:
        """The app, for one trial's engine arguments, started by ``launcher`` (a
        ``CommandLauncher``)."""
        return OwnEngine(model, args, workdir, launcher=launcher, env=env, command=self)


@dataclass
class CommandLauncher:
    """Runs a ``ServerCommand``'s words as given, each server its own process group in tuner's
    session that dies with tuner (``tuner.engine.zygote.die_with``), as ``ProcessLauncher``;
    ``EngineFailed`` where the command cannot be run."""

    def launch(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str], serve_command: bool = False
    ) -> ServerProcess:
        with log.open("ab") as out:
            try:
                return spawn(argv, out, env)
            except OSError as exc:
                # A command that does not run (no such program, not executable) starts no
                # server: the trial's, not the study's, failure.
                raise EngineFailed(f"the server command did not start: {exc}", "") from None

    def close(self) -> None:
        pass


@dataclass
class OwnEngine(Engine):
    """The app started by ``command`` with a trial's engine arguments: an ``Engine`` whose
    config is the app's engine-config file and whose health is the command's path."""

    server_name: ClassVar[str] = OWN_SERVER_NAME

    command: ServerCommand | None = None
    launcher: Launcher = field(default_factory=CommandLauncher)

    def __post_init__(self) -> None:
        if self.command is None:
            raise ValueError("an OwnEngine needs the app's command")
        self.health_path = self.command.health_path

    @property
    def config_path(self) -> Path:
        return self.workdir / "engine-config.yaml"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        assert self.command is not None
        self.port = self.port or free_port()
        self.config_path.write_text(self.command.config_text({"model": self.model, **self.args}))
        argv = self.command.argv(self.port, str(self.config_path.resolve()))
        logger.info("starting %s on port %d: %s", argv[0], self.port, dict(self.args))
        self.times.start_s = time.monotonic()
        self._server = self.launcher.launch(argv, self.log_path, server_env(self.env))
