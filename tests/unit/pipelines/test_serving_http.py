"""The Serve app's HTTP surface without Ray: routes, the bearer token, limits enforced on the raw bytes before any
JSON is built, and every client error a 4xx naming the field and the rule; the CLI refuses bad values at once."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.asgi import respond

from pipelines import serve
from pipelines.capsule_predictor import validated_examples
from pipelines.serving import limits as limits_module
from pipelines.serving.auth import TOKEN_ENV, digest, find_token
from pipelines.serving.limits import ClientError, Limits, parse
from pipelines.serving.routes import Catalog
from pipelines.serving.source import ServeError

TOKEN = "s3cret-token-for-tests-0123456789"
LIMITS = Limits(max_body_bytes=4096, max_rows=4, max_depth=16, max_chars=100)
ROW = {"premise": "A cat sat.", "hypothesis": "A cat."}


class FakeServed:
    """Serves 'rte' and answers every row 'entailment'; asks for the token TOKEN."""

    token_sha256 = digest(TOKEN)

    def catalog(self) -> Catalog:
        return Catalog(["rte"], LIMITS)

    def max_chars(self, name: str) -> int:
        return 50

    def examples(self, name: str, rows: list[dict[str, Any]]) -> list[Any]:
        return validated_examples("rte", rows)

    async def answer(self, name: str, examples: list[Any]) -> dict[str, Any]:
        return {"task": name, "labels": ["entailment"] * len(examples), "version": 1}

    def describe(self) -> dict[str, Any]:
        return {"tasks": {"rte": {"version": 1, "digest": None}}}


class ManyServed(FakeServed):
    """Serves 1,000 names."""

    def catalog(self) -> Catalog:
        return Catalog([f"task{i:04d}" for i in range(1000)], LIMITS)


def _call(method: str, path: str, body: bytes = b"", token: str | None = TOKEN,
          headers: dict[str, str] | None = None, chunked: bool = False,
          served: FakeServed | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    given = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {}),
             **({} if chunked else {"content-length": str(len(body))}), **(headers or {})}
    pieces = [body[i:i + 1000] for i in range(0, len(body), 1000)]
    return respond(served or FakeServed(), method, path, given, pieces)


def _post(body: Any, **kw: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    return _call("POST", "/", body if isinstance(body, bytes) else json.dumps(body).encode(), **kw)


def test_the_routes_answer_and_everything_else_is_404_or_405() -> None:
    status, body, _ = _post({"task": "rte", "inputs": [ROW]})
    assert (status, body["labels"]) == (200, ["entailment"])
    assert _call("GET", "/health", token=None)[:2] == (200, {"status": "ok"})
    assert _call("GET", "/tasks")[1]["tasks"]["rte"] == {"version": 1, "digest": None}
    for method in ("GET", "PUT", "DELETE", "OPTIONS", "PATCH"):
        status, body, headers = _call(method, "/")
        assert (status, body["rule"], headers["allow"]) == (405, "method", "POST"), method
    assert _call("POST", "/tasks")[0] == 405 and _call("POST", "/health")[0] == 405
    for path in ("/nope", "/../../etc/passwd", "/tasks/rte", "//"):
        assert _call("GET", path)[:2][0] == 404 and _call("POST", path)[1]["rule"] == "route", path


def test_the_routes_answer_below_a_route_prefix_and_at_the_bare_prefix() -> None:
    """Serve leaves an application's route prefix in the path and names it in ``root_path``: ``POST /capt`` is
    ``POST /capt/`` (the benchmark posts there), and a refusal names the path below the prefix."""
    body = json.dumps({"task": "rte", "inputs": [ROW]}).encode()
    headers = {"authorization": f"Bearer {TOKEN}", "content-length": str(len(body))}
    for path in ("/capt", "/capt/"):
        assert respond(FakeServed(), "POST", path, headers, [body], "/capt")[:2][0] == 200, path
    assert respond(FakeServed(), "GET", "/capt/tasks", headers, [], "/capt")[0] == 200
    status, refused, _ = respond(FakeServed(), "GET", "/capt/nope", headers, [], "/capt")
    assert (status, refused["error"][:16]) == (404, "No route '/nope'")


def test_a_lone_surrogate_in_a_key_is_a_400_naming_it_escaped() -> None:
    status, body, _ = _post(b'{"task": "rte", "inputs": [{"\\ud800": "a", "hypothesis": "b"}]}')
    assert (status, body["field"], body["rule"]) == (400, "inputs[0].\\ud800", "unicode"), body


def test_every_route_but_health_needs_the_bearer_token() -> None:
    for token in (None, "wrong-token-0123456789", TOKEN + "x"):
        for method, path in (("POST", "/"), ("GET", "/tasks")):
            status, body, headers = _call(method, path, json.dumps({"task": "rte", "inputs": [ROW]}).encode(),
                                          token=token)
            assert (status, body["field"], headers["www-authenticate"]) == (401, "Authorization", "Bearer")
    assert _call("GET", "/tasks", headers={"authorization": f"Basic {TOKEN}"})[0] == 401
    assert _call("GET", "/tasks", headers={"authorization": f"bearer  {TOKEN} "})[0] == 200


@pytest.mark.parametrize(("body", "status", "field", "rule"), [
    (b"\xff\xfe{}", 400, "body", "utf-8"),
    (b'{"task": "rte", "inputs": [{"premise": "\\ud800", "hypothesis": "b"}]}', 400, "inputs[0].premise", "unicode"),
    (b'{"task": "rte", "inputs": [{"premise": NaN, "hypothesis": "b"}]}', 400, "body", "finite_numbers"),
    (b'{"task": "rte", "inputs": [{"premise": -Infinity, "hypothesis": "b"}]}', 400, "body", "finite_numbers"),
    (b'{"task": "rte", "inputs": [{"premise": "a", "hypothesis": "b", "idx": 1e999}]}', 400, "body",
     "finite_numbers"),
    (b'{"task": "rte", "inputs": [{"premise": "a", "hypothesis": "b", "idx": ' + b"9" * 4000 + b"}]}", 400, "body",
     "max_int_digits"),
    (b'{"task": "rte", "task": "cb", "inputs": [{"premise": "a", "hypothesis": "b"}]}', 400, "body", "unique_keys"),
    (b'{"task": "rte", "inputs": [{"premise": 5, "hypothesis": "b"}]}', 400, "inputs[0].premise",
     "expected a string, got int 5"),
    (b'{"task": "rte", "inputs": [{"premise": "", "hypothesis": "b"}]}', 400, "inputs[0].premise", "empty string"),
    (b'{"task": "rte", "inputs": [{"premise": "a"}]}', 400, "inputs[0].hypothesis", "missing field"),
    (b'{"task": "boolq", "inputs": [{"question": "q"}]}', 400, "task", "served_task"),
    (b'{"task": 3, "inputs": [{}]}', 400, "task", "served_task"),
    (b'{"task": "rte", "inputs": []}', 400, "inputs", "non_empty_list"),
    (b'{"task": "rte", "inputs": "premise"}', 400, "inputs", "non_empty_list"),
    (b'{"task": "rte", "inputs": [3]}', 400, "inputs[0]", "type"),
    (b'{"task": "rte"}', 400, "inputs", "required"),
    (b'{"task": "rte", "inputs": [{}], "extra": 1}', 400, "extra", "known_fields"),
    (b'[1, 2]', 400, "body", "type"),
    (b'', 400, "body", "json"),
    (b'{"task": "rte", "inputs": [', 400, "body", "json"),
    (b'{"task": "rte", "inputs": [{"premise": "' + b"x" * 60 + b'", "hypothesis": "b"}]}', 400,
     "inputs[0].premise", "max_chars"),
    (json.dumps({"task": "rte", "inputs": [ROW] * 5}).encode(), 413, "inputs", "max_rows"),
    (b'{"task": "rte", "inputs": [{"premise": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", 413, "body",
     "max_body_bytes"),
    (b'{"task": "rte", "inputs": [{"premise": ' + b"[" * 1000 + b"]" * 1000 + b"}]}", 400, "body", "max_depth"),
], ids=["bad-utf8", "lone-surrogate", "nan", "infinity", "overflowing-float", "4000-digit-int", "key-twice",
        "wrong-type", "empty-text", "missing-field", "unknown-task",
        "task-not-a-string", "no-rows", "rows-not-a-list", "row-not-an-object", "no-inputs", "unknown-field",
        "not-an-object", "empty-body", "truncated", "text-too-long", "too-many-rows", "too-big", "too-deep"])
def test_every_client_error_is_a_4xx_naming_the_field_and_the_rule(body: bytes, status: int, field: str,
                                                                   rule: str) -> None:
    got, answer, _ = _post(body)
    assert (got, answer["field"], answer["rule"]) == (status, field, rule), answer
    assert answer["error"] and set(answer) == {"error", "field", "rule"}


def test_the_readme_states_the_integer_limit_the_parser_holds() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    assert f"an integer of more than {limits_module.MAX_INT_DIGITS} digits" in " ".join(readme.split())
    with pytest.raises(ClientError, match="max_int_digits|digits"):
        parse(b'{"a": ' + b"1" * (limits_module.MAX_INT_DIGITS + 1) + b"}", LIMITS)
    assert parse(b'{"a": -' + b"1" * limits_module.MAX_INT_DIGITS + b"}", LIMITS) == {"a": -int("1" * 64)}


def test_a_refusal_lists_the_first_20_of_1000_names_and_where_to_find_them_all() -> None:
    status, body, _ = _post({"task": "nope", "inputs": [ROW]}, served=ManyServed())
    assert (status, body["rule"]) == (400, "served_task")
    assert body["error"].endswith("task0000, task0001, task0002, task0003, task0004, task0005, task0006, task0007, "
                                  "task0008, task0009, task0010, task0011, task0012, task0013, task0014, task0015, "
                                  "task0016, task0017, task0018, task0019 ... and 980 more (GET /tasks lists them "
                                  "all)."), body
    status, body, _ = _post({"task": "task0999"}, served=ManyServed())
    assert (status, body["rule"]) == (400, "required") and "'task0019'] ... and 980 more (GET /tasks" in body["error"]
    assert len(body["error"]) < 500 and "task0020" not in body["error"]
    assert _post({"task": "task0999", "inputs": [ROW]}, served=ManyServed())[0] == 200
    assert _post({"task": "nope", "inputs": [ROW]})[1]["error"].endswith("tasks served: rte.")  # 20 or fewer: all


def test_the_size_cap_holds_without_content_length_and_before_reading_with_one() -> None:
    big = json.dumps({"task": "rte", "inputs": [{"premise": "x" * 5000, "hypothesis": "b"}]}).encode()
    assert _post(big, chunked=True)[:2][0] == 413
    status, body, _ = _call("POST", "/", b"", headers={"content-length": str(50 * 2**20)})
    assert (status, body["rule"]) == (413, "max_body_bytes")
    assert _call("POST", "/", b"", headers={"content-length": "12x"})[1]["rule"] == "integer"


def test_the_scan_refuses_before_parsing_and_is_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module.json, "loads", lambda *a, **k: pytest.fail("parsed an over-limit body"))
    wide = Limits(max_body_bytes=2**21, max_rows=64, max_depth=16, max_chars=4096)
    for body, rule in [(b"[" * 2**20 + b"]" * 2**20, "max_depth"), (b'{"inputs": [' + b"{}," * 300_000 + b"{}]}",
                       "max_rows"), (b'{"a": "' + b"y" * 30_000 + b'"}', "max_chars")]:
        started = time.process_time()  # this process's CPU time: other processes' load does not count
        with pytest.raises(ClientError) as err:
            parse(body, wide)
        assert err.value.rule == rule and time.process_time() - started < 1.0
    monkeypatch.undo()
    text = '{"a": "br[ace\\" {\\\\", "b": [[1, 2], {"c": "]]]]"}]}'  # brackets and quotes inside strings
    assert parse(text.encode(), Limits(4096, 2, 3, 100)) == json.loads(text)  # "b" holds 2 items at depth 2


def test_the_token_comes_from_a_file_the_environment_or_a_new_private_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    made = find_token(None, tmp_path, 8123)
    path = tmp_path / "serve-8123.token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and str(path) in made.where
    assert made.sha256 == digest(path.read_text().strip()) and find_token(None, tmp_path, 8123) != made
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert find_token(None, tmp_path, 1).sha256 == digest(TOKEN)
    (tmp_path / "given").write_text(TOKEN + "\n")
    os.chmod(tmp_path / "given", 0o644)
    with pytest.raises(ServeError, match=r"can be read or written by other users \(mode 644\).*chmod 600"):
        find_token(str(tmp_path / "given"), tmp_path, 1)
    os.chmod(tmp_path / "given", 0o600)
    assert find_token(str(tmp_path / "given"), tmp_path, 1).sha256 == digest(TOKEN)
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ServeError, match="at least 16 characters"):
        find_token(None, tmp_path, 1)
    with pytest.raises(ServeError, match="cannot read it"):
        find_token(str(tmp_path / "missing"), tmp_path, 1)


@pytest.mark.parametrize(("args", "phrase"), [
    (["--port", "70000"], "argument --port: '70000' is not a TCP port"),
    (["--port", "http"], "argument --port: 'http' is not an integer"),
    (["--poll-s", "-1"], "argument --poll-s: '-1' must be a finite number above 0"),
    (["--poll-s", "inf"], "must be a finite number above 0"),
    (["--max-rows", "0"], "argument --max-rows"),
    (["--max-body-bytes", "100"], "below 1024 bytes"),
    (["--no-auth", "--token-file", "t"], "not allowed with argument"),
    (["--tasks", "rte,nope"], "argument --tasks: unknown task(s) 'nope' (tasks: boolq, cb, copa, multirc, rte"),
    (["--max-rows", "0", "--replicas", "x", "--port", "0", "--tasks", "rtx,cb"],
     "argument --port: '0' must be an integer above 0; argument --max-rows: '0' must be an integer above 0; "
     "argument --replicas: 'x' is not an integer; argument --tasks: unknown task(s) 'rtx'"),
], ids=["port-range", "port-text", "poll-negative", "poll-inf", "rows-zero", "body-tiny", "auth-both", "unknown-task",
          "all-at-once"])
def test_bad_cli_values_exit_2_in_one_paragraph_before_any_service(args: list[str], phrase: str,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "_serve_from_cli", lambda _: pytest.fail("started services on a bad command line"))
    with pytest.raises(SystemExit) as done:
        serve.main(["--model", "tiny-t5", "--tasks", "rte", *args])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("error: ") and phrase in err, err
    assert "Traceback" not in err and err.count("\n") == 1


def test_an_over_long_key_is_not_blamed_on_inputs() -> None:
    """The byte scan tells a key (followed by ':') from a value: a 200,000-character unknown key is the body's."""
    wide = Limits(max_body_bytes=2**21, max_rows=64, max_depth=16, max_chars=4096)
    for body, field in [(b'{"task": "rte", "' + b"k" * 200_000 + b'" : 1, "inputs": [{}]}', "body"),
                        (b'{"task": "rte", "inputs": [{"premise": "' + b"v" * 200_000 + b'"}]}', "inputs")]:
        with pytest.raises(ClientError) as err:
            parse(body, wide)
        assert (err.value.field, err.value.rule) == (field, "max_chars")


def test_the_serve_command_takes_the_token_out_of_its_environment(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes `python -m pipelines.serve` starts (local Ray, its proxy and replicas, MLflow) inherit its
    environment: once read, the plaintext token is no longer in it; only its SHA-256 goes on."""
    from pipelines.serve import cli_token

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert cli_token(None, tmp_path, 8123).sha256 == digest(TOKEN)
    assert TOKEN_ENV not in os.environ
