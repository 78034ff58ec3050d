"""A server of the user's own: their application around vLLM's ``AsyncLLM``, started per trial.

Many services do not run ``vllm serve``: they build the engine from ``AsyncEngineArgs`` in their
own app, behind their own endpoint. For them tuner runs the app's command (``ServerCommand``),
``{port}`` and ``{config}`` filled in per trial: ``{config}`` is a YAML whose keys are the
trial's ``AsyncEngineArgs`` fields (``tuner.flags.engine_fields_yaml``), the file the app
reads. The app runs as its own process group that dies with tuner (``CommandLauncher``), a
``LocalServer`` stopped as ``vllm serve`` is (``tuner.engine.local``): SIGTERM to the group, then
SIGKILL to what is left.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tuner.engine.handle import EngineFailed
from tuner.engine.launchers import Launch, Launcher, spawn
from tuner.engine.local import LOCAL_HOST, LocalServer, free_port
from tuner.engine.process import Engine
from tuner.flags import engine_fields_yaml

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
    """Runs a launch's words as given (``Launch.argv``: the whole command), each server a
    ``LocalServer``: its own process group in tuner's session that dies with tuner
    (``tuner.engine.zygote.die_with``), as ``ProcessLauncher``'s; ``EngineFailed`` where the
    command cannot be run."""

    def launch(self, server: Launch) -> LocalServer:
        launched_at = time.monotonic()
        port = free_port()
        argv = server.argv(LOCAL_HOST, port)
        with server.log.open("ab") as out:
            try:
                popen = spawn(argv, out, server.env)
            except OSError as exc:
                # A command that does not run (no such program, not executable) starts no
                # server: the trial's, not the study's, failure.
                raise EngineFailed(f"the server command did not start: {exc}", "") from None
        return LocalServer(
            popen.pid, popen, port, server.log, server.name, server.health_path, launched_at
        )

    def close(self) -> None:
        pass


@dataclass
class OwnEngine(Engine):
    """The app started by ``command`` with a trial's engine arguments: an ``Engine`` whose
    config is the app's engine-config file, whose arguments are the command's words and whose
    health is the command's path."""

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

    def server_argv(self, host: str, port: int) -> list[str]:
        """The app's command to listen at ``port`` (it binds where it binds), its engine-config
        file written."""
        assert self.command is not None
        self.config_path.write_text(self.command.config_text({"model": self.model, **self.args}))
        return self.command.argv(port, str(self.config_path.resolve()))
