"""Serve every promoted capsule of one base model with Ray Serve: one frozen base, tasks mixed per batch.

    python -m pipelines.serve --model tiny-t5 [--tasks rte,cb | --all] [--alias champion]
                              [--tracking-uri http://127.0.0.1:5000] [--port 8000] [--poll-s 30]
                              [--token-file PATH | --no-auth] [--max-body-bytes 1048576]

Each replica loads the base model once and the capsules of ``capt-<model-slug>-<task>@<alias>`` into one
`capt.CapsuleBank`; ``POST http://127.0.0.1:8000/`` with ``{"task": "rte", "inputs": [raw rows]}`` and
``Authorization: Bearer <token>`` answers labels, per-label scores (rank evaluation) and the registry
version that answered. Requests for different tasks are batched together (`serve.batch`). Every ``--poll-s``
seconds the replicas read the registry again (`pipelines.serving.app.Reloader`): a moved alias's capsule is loaded
without a restart, with ``--all`` a task given the alias later is added, a deleted model's task is dropped.
``GET /tasks`` lists what is served, ``GET /health`` answers without the token; the token comes from
``--token-file``, CAPT_SERVE_TOKEN or a new file whose path the start-up line prints
(`pipelines.serving.auth`); routes: `pipelines.serving.routes` (FastAPI, through Serve's ingress); request limits:
`pipelines.serving.limits`.

Without ``--tracking-uri`` / MLFLOW_TRACKING_URI it serves from the local store of ``make demo``
(outputs/mlflow), started here; without RAY_ADDRESS it starts a local Ray. HTTP listens on 127.0.0.1
unless ``--host`` says otherwise; ``--debug`` logs every port the driver and its local Ray listen on, with its
guard (`pipelines.serving.exposure`: the replicas' gRPC servers listen on every interface, behind Ray's token), and
a port beyond loopback that nothing guards is always a warning. Under ``ray job submit`` the same command deploys
onto the cluster; infra/serve.yaml deploys it with ``serve deploy`` instead (infra/README.md). Ctrl-C shuts Serve
down.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from capt.tasks.registry import TASK_NAMES
from pipelines.cli_errors import add_debug_flag, configure_logging, run_cli
from pipelines.serving.auth import TOKEN_ENV, Token, find_token
from pipelines.serving.exposure import OPEN, describe, head_limit_problem, node_env, serving_listeners
from pipelines.serving.settings import ServeSettings
from pipelines.serving.source import RegistrySource, ServeError
from pipelines.tracking import TrackingError

logger = logging.getLogger("pipelines.serve")  # the same name when run with -m (`--debug` lowers "pipelines")

def chosen_tasks(source: RegistrySource, tasks: str | None, every: bool) -> list[str]:
    """--tasks as a list, or with --all every task of the model whose registered model has the alias."""
    if not every:
        return [t.strip() for t in (tasks or "").split(",") if t.strip()]
    registered = source.registered_tasks()
    with_alias = [t for t in registered if source.check_alias(t) is not None]
    if not with_alias:
        source.check(registered or list(TASK_NAMES[:1]))  # raises the paragraph that says what is missing
    return with_alias


def refuse_unservable(source: RegistrySource, versions: dict[str, int]) -> None:
    """ServeError naming the reason when the base model of the versions to serve cannot be served (before Ray
    starts: a replica would fail the same way a minute later)."""
    tagged = set(source.base_models(versions).values()) - {None}
    for base in sorted(tagged) or [source.model]:
        problem = servable_problem(base)
        if problem is not None:
            raise ServeError(f"--model {source.model!r}: its capsules (trained on {base!r}) cannot be served: "
                             f"{problem}. Use the task's own predictor instead (verified before it runs): "
                             "pipelines.tracking.load_capsule_model("
                             f"'models:/{source.name('<task>')}@{source.alias}').predict(rows).")


def servable_problem(name: str) -> str | None:
    """Why the capsules of base model `name` cannot share one served bank (None when they can). The model is built
    on the meta device (no weights, no memory): what matters is its structure, e.g. whether an encoder classifier's
    head is one linear layer the bank can gather."""
    from pipelines.models.shape import model_shape, read_model_config

    try:
        spec = model_shape(name).spec
    except ValueError as err:  # unreadable config or an unsupported model_type, named
        return str(err)
    if not spec.classifier_head:  # text-to-text models answer with words: any task shares the batch
        return None
    import torch
    import transformers

    from capt.heads import linear_head_problem

    with torch.device("meta"):  # structure only: no weights are allocated
        model = getattr(transformers, spec.auto_model_class).from_config(read_model_config(name))
    return linear_head_problem(model)


def serve_until_stopped(settings: ServeSettings, host: str, port: int, token: Token | None) -> None:
    """Deploy on Ray Serve with HTTP on host:port, then wait for SIGINT/SIGTERM and shut Serve down."""
    from ray import serve

    from pipelines.serving.app import deployment

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    serve.start(http_options={"host": host, "port": port})
    try:
        try:
            serve.run(deployment(settings), name="capt", route_prefix="/", blocking=False)
        except RuntimeError as err:  # a replica's constructor failed; Serve's message ends with its error
            reason = [line for line in str(err).splitlines() if line.strip()][-1].strip()
            raise ServeError(f"The Serve application did not start: its replica failed with {reason} (--debug "
                             "shows Serve's whole message; replica logs are in the Ray session's logs).") from err
        _log_listeners(port, token is not None)
        if problem := head_limit_problem(host, port):
            logger.warning("%s", problem)
        print(startup_line(settings, host, port, token), flush=True)
        stop.wait()
    finally:
        serve.shutdown()


def startup_line(settings: ServeSettings, host: str, port: int, token: Token | None) -> str:
    """The one line a user needs once the app answers: the tasks, the URL, where the token is, how to stop."""
    guard = (f"bearer token required on POST / and GET /tasks, token {token.where}" if token else
             "AUTHENTICATION OFF (--no-auth): anyone who reaches this address can run inference")
    follows = ", tasks given the alias later are added" if settings.all_tasks else ""
    return (f"Serving {', '.join(settings.tasks)} of {settings.model} (alias {settings.alias}, re-read every "
            f"{settings.poll_s:g} s{follows}) at http://{host}:{port}/ ; {guard}; Ctrl-C stops.")


def _log_listeners(port: int, serve_token: bool) -> None:
    """Every port the driver and its local Ray listen on, with its guard (`pipelines.serving.exposure`), at debug
    level (``--debug``): a dozen Ray ports would bury the start-up line. A port beyond loopback that nothing guards
    is a warning, since anyone on the network reaches it."""
    listeners = serving_listeners(port, serve_token)
    logger.debug("%s", describe(listeners, remote_cluster=bool(os.environ.get("RAY_ADDRESS"))))
    if open_ports := [str(item) for item in listeners if item.guard == OPEN]:
        logger.warning("%d port(s) listen beyond loopback with nothing guarding them: %s (set RAY_AUTH_MODE=token "
                       "for Ray's)", len(open_ports), ", ".join(open_ports))


def _positive(kind: type) -> Callable[[str], Any]:
    """A parser of a number of `kind` above 0; ValueError saying what is wrong with the text."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise ValueError(f"{text!r} must be {'an integer' if kind is int else 'a finite number'} above 0")
        return value
    return parse


def _port(text: str) -> int:
    value = _positive(int)(text)
    if value > 65535:
        raise ValueError(f"{text!r} is not a TCP port (1-65535)")
    return value


def _body_bytes(text: str) -> int:
    value = _positive(int)(text)
    if value < 1024:
        raise ValueError(f"{value} is below 1024 bytes, too small for one request")
    return value


NUMBERS: dict[str, Callable[[str], Any]] = {
    "port": _port, "poll_s": _positive(float), "max_rows": _positive(int), "max_body_bytes": _body_bytes,
    "max_chars": _positive(int), "max_batch": _positive(int), "replicas": _positive(int), "num_cpus": _positive(int)}
"""The numeric options and their checks: parsed after argparse, so that one refusal names every bad value."""


def command_line_problems(args: argparse.Namespace) -> list[str]:
    """Every bad value on the command line (each numeric option parsed in place, unknown --tasks); [] when none."""
    problems = []
    for dest, parse in NUMBERS.items():
        text = getattr(args, dest)
        if isinstance(text, str):  # a default is already a number
            try:
                setattr(args, dest, parse(text))
            except ValueError as err:
                problems.append(f"argument --{dest.replace('_', '-')}: {err}")
    unknown = [t for t in (args.tasks or "").split(",") if t.strip() and t.strip() not in TASK_NAMES]
    if unknown:
        problems.append(f"argument --tasks: unknown task(s) {', '.join(map(repr, unknown))} (tasks: "
                        f"{', '.join(TASK_NAMES)})")
    return problems


class _Parser(argparse.ArgumentParser):
    """argparse, with its refusal as the one ``error:`` paragraph every entry point prints (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see {self.prog} --help.\n")


def main(argv: list[str] | None = None) -> int:
    """CLI; exit 0 after a clean shutdown, 2 for bad input or an unreachable service. Numbers are checked by
    `command_line_problems`, before any service starts."""
    p = _Parser(prog="python -m pipelines.serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="base model name or slug (google-t5/t5-base, t5-base)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tasks", help="comma-separated tasks (rte,cb)")
    which.add_argument("--all", action="store_true", help="every task of the model with a version at --alias")
    p.add_argument("--alias", default="champion", help="registry alias to serve (default: champion)")
    p.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI, else the demo store")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", default=8000, help="HTTP port (default 8000)")
    p.add_argument("--poll-s", default=30.0, help="seconds between alias reads (default 30)")
    p.add_argument("--max-rows", default=64, help="most rows per request (default 64)")
    p.add_argument("--max-body-bytes", default=2**20,
                   help="most bytes per request body (default 1048576); more is 413")
    p.add_argument("--max-chars", default=None,
                   help="most characters per text field (default: 8 x the capsule's max_length)")
    p.add_argument("--max-batch", default=16, help="most requests per mixed batch (default 16)")
    p.add_argument("--replicas", default=1, help="replicas, one base model each (default 1)")
    p.add_argument("--num-cpus", default=None, help="CPUs of the local Ray (no RAY_ADDRESS)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--token-file", default=None,
                      help="file holding the bearer token (default: CAPT_SERVE_TOKEN, else a new 0600 file)")
    auth.add_argument("--no-auth", action="store_true", help="serve without a bearer token (says so at start)")
    add_debug_flag(p)
    args = p.parse_args(argv)
    if problems := command_line_problems(args):
        p.error("; ".join(problems))
    configure_logging()
    if args.debug:  # the ports the start-up line leaves out (`_log_listeners`)
        logging.getLogger("pipelines").setLevel(logging.DEBUG)
    from pipelines.services.reaper import reap_on_death

    with reap_on_death():  # a killed serve takes its MLflow server and its local Ray with it
        return run_cli(lambda: _serve_from_cli(args), args.debug, expected=(TrackingError,))


def _serve_from_cli(args: argparse.Namespace) -> int:
    from pipelines.services import port_is_free
    from pipelines.services.mlflow_server import tracking_store
    from pipelines.services.private import private_temp_dir
    from pipelines.services.ray_connect import ray_cluster
    from pipelines.serving.source import check_capsules

    if args.host in ("127.0.0.1", "localhost") and not port_is_free(args.host, args.port):
        raise ServeError(f"--port {args.port}: something already listens on {args.host}:{args.port}; "
                         "pick another port.")
    token = None if args.no_auth else cli_token(args.token_file, private_temp_dir("capt-serve"), args.port)
    try:
        with tracking_store(args.tracking_uri, check=True) as store:
            print(f"Tracking store: {store.origin}", file=sys.stderr)
            source = RegistrySource(store.uri, args.model, args.alias, root=".")
            tasks = chosen_tasks(source, args.tasks, args.all)
            versions = source.check(tasks)
            refuse_unservable(source, versions)
            check_capsules(source, versions)  # every capsule fetched and verified before Ray starts
            settings = ServeSettings.from_args({
                "model": args.model, "tasks": tasks, "tracking_uri": store.uri, "alias": args.alias,
                "all_tasks": args.all, "poll_s": args.poll_s, "max_rows_per_request": args.max_rows,
                "max_batch_requests": args.max_batch, "max_body_bytes": args.max_body_bytes,
                "max_text_chars": args.max_chars, "num_replicas": args.replicas, "auth": token is not None,
                "token_sha256": token.sha256 if token else None})
            with ray_cluster(args.num_cpus, node_env=node_env()):
                serve_until_stopped(settings, args.host, args.port, token)
        return 0
    finally:
        if token is not None:
            token.forget()  # a generated token lives as long as this serve, a refused start included


def cli_token(token_file: str | None, generated_dir: Path, port: int) -> Token:
    """The serve's bearer token (`find_token`), with CAPT_SERVE_TOKEN then removed from this process's environment:
    the local Ray, its Serve proxy and replicas, and the MLflow server this command starts inherit it otherwise,
    where only the token's SHA-256 belongs."""
    token = find_token(token_file, generated_dir, port)
    os.environ.pop(TOKEN_ENV, None)
    return token


if __name__ == "__main__":
    sys.exit(main())
