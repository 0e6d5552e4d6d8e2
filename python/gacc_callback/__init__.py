"""Write gacc/1 callbacks in Python: a decorator, and `serve()`.

    from gacc_callback import compressor, serve

    @compressor
    def compress(context, goal, token_budget, **_):
        return context[: token_budget * 4]      # or {"memory": ..., "usage": usage(...)}

    if __name__ == "__main__":
        serve()

`serve()` speaks the protocol in the mode gacc asks for (`GACC_MODE`: one request on stdin,
or one per line), calls the decorated function with the request's fields as keyword arguments
(it takes those it names; `**_` takes the rest), and writes its reply. A function may return
the role's one field (the memory, the answer, the verdict) or a whole response object.

- The reply channel is protected at the file-descriptor level: before anything runs, fd 1 is
  moved to stderr and a private copy kept for replies, so `print()`, `os.write(1, ...)` and C
  libraries that write to stdout land in the callback's log, never in the protocol.
- What a call prints (`print()`, `sys.stderr`, its traceback) is captured while it is served and
  sent with its reply as `log`, so gacc files each call's log with exactly that call, even where
  one persistent worker serves many (what C libraries write to the file descriptors goes to
  stderr as before).
- An exception becomes `{"error": "Type: message", "retryable": false}` (its traceback goes to
  stderr); raise `Retryable` for a transient failure that gacc should retry.
- `@setup` functions run once per process, before the first request (load a model once).
- `@compressor(ladder=True)`: a budget ladder (the manifest entry says `ladder = true`). The
  function receives `token_budgets`, every budget gacc needs of this source, goal and seed,
  ascending, and returns a list of memories, one per budget (or `{"memories": [...]}`): rank or
  score the source once, cut it for each budget. A single-budget request reaches it as a ladder
  of one.
- `@compressor(batch_size=32)` (any role): the function receives a list of requests (dicts of
  their fields) and returns a list of replies; under `mode = "persistent"` with
  `max_inflight = N`, each batch is the requests that arrive within `batch_wait` (default
  5 ms) of its first, up to `batch_size` — one forward pass per batch. Replies echo each
  request's `id`.
- `count_tokens(text)` and `fit(text, budget)` count and cut cl100k_base tokens exactly as gacc
  does (`fit`: the longest prefix of whole tokens within the budget, decoded as gacc cuts a
  memory), by asking gacc itself (`GACC_EXE`, which gacc sets for its callbacks, else `gacc` on
  PATH): nothing more to install, and it works inside the sandbox.
- `python -m gacc_callback try script.py --role compressor --context FILE --goal "..."
  --budget 200` calls a script's function by hand and prints the reply.

Standard library only. `pip install ./` from gacc's repository installs it with gacc (the wheel
holds both); otherwise copy this file beside your script as `gacc_callback.py` (`gacc init`
does that when the Python it runs cannot import the module).
"""

import argparse
import inspect
import json
import os
import queue
import runpy
import shutil
import subprocess
import sys
import threading
import time
import traceback

__all__ = [
    "PROTOCOL",
    "Retryable",
    "compressor",
    "reader",
    "judge",
    "tokenizer",
    "setup",
    "usage",
    "serve",
    "count_tokens",
    "fit",
]

PROTOCOL = "gacc/1"

# The field a role's function may return alone.
_FIELD = {"compressor": "memory", "reader": "answer", "judge": "correct"}

_handlers = {}
_batch_sizes = {}
_batch_waits = {}
_ladders = set()

# How long a batch waits, after its first request, for more to arrive (seconds).
BATCH_WAIT = 0.005
_setups = []
_ready = False


class _Tokenizer:
    """gacc's own cl100k_base (`gacc callback cl100k_base`), one process, asked in turn."""

    def __init__(self):
        exe = os.environ.get("GACC_EXE") or shutil.which("gacc")
        if not exe:
            raise RuntimeError(
                "count_tokens and fit ask gacc: run under gacc (which sets GACC_EXE), or put gacc on PATH"
            )
        self._process = subprocess.Popen(
            [exe, "callback", "cl100k_base"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "GACC_MODE": "persistent"},
        )
        self._lock = threading.Lock()

    def ask(self, request):
        with self._lock:
            self._process.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("gacc's tokenizer ended without answering")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError("gacc's tokenizer: " + str(reply["error"]))
        return reply


_tokenizer = None
_tokenizer_lock = threading.Lock()


def _tokens():
    global _tokenizer
    with _tokenizer_lock:
        if _tokenizer is None:
            _tokenizer = _Tokenizer()
        return _tokenizer


def count_tokens(text):
    """The cl100k_base tokens of `text`, as gacc counts them."""
    return len(_tokens().ask({"op": "encode", "text": text})["tokens"])


def fit(text, budget):
    """The longest prefix of `text`'s whole cl100k_base tokens within `budget`, decoded as gacc
    cuts a memory (a character cut in two becomes U+FFFD): what gacc keeps of a memory of
    `budget` tokens. A text within the budget comes back unchanged."""
    if budget < 0:
        raise ValueError("a budget is at least 0 tokens")
    tokens = _tokens().ask({"op": "encode", "text": text})["tokens"]
    if len(tokens) <= budget:
        return text
    return _tokens().ask({"op": "decode", "tokens": tokens[:budget]})["text"]


class Retryable(Exception):
    """A transient failure (a busy server, a lost connection): gacc retries the call."""


def _register(role):
    def decorate(function=None, *, batch_size=1, batch_wait=BATCH_WAIT, ladder=False):
        """`@compressor`, or `@compressor(batch_size=32)`: the function then receives a list of
        requests (each a dict of the fields) and returns a list of replies, one per request.
        `@compressor(ladder=True)`: the function receives `token_budgets` (every budget gacc needs
        of this source and goal, ascending) and returns one memory per budget, in order."""

        def register(function):
            if batch_size < 1:
                raise ValueError("batch_size must be at least 1")
            if ladder and role != "compressor":
                raise ValueError("only a compressor serves a budget ladder")
            _handlers[role] = function
            _batch_sizes[role] = batch_size
            _batch_waits[role] = batch_wait
            if ladder:
                _ladders.add(role)
            else:
                _ladders.discard(role)
            return function

        return register(function) if function is not None else register

    return decorate


compressor = _register("compressor")
reader = _register("reader")
judge = _register("judge")
tokenizer = _register("tokenizer")


def setup(function):
    """Runs `function()` once per process, before its first request."""
    _setups.append(function)
    return function


def usage(input_tokens=0, output_tokens=0, cost_usd=0.0):
    """A response's `usage`: what the call cost, summed in gacc's report."""
    return {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens), "cost_usd": float(cost_usd)}


def _role():
    role = os.environ.get("GACC_ROLE")
    if role in _handlers:
        return role
    if role is None and len(_handlers) == 1:
        return next(iter(_handlers))
    known = ", ".join(sorted(_handlers)) or "none"
    raise RuntimeError(f"no function for role {role!r} (decorated: {known})")


def _arguments(function, request):
    """The request's fields the function takes (all of them when it has **kwargs)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(request)
    names = {p.name for p in parameters}
    return {name: value for name, value in request.items() if name in names}


def _as_reply(role, result):
    if isinstance(result, dict):
        return result
    if role in _ladders and isinstance(result, (list, tuple)):
        return {"memories": list(result)}
    if role in _FIELD:
        return {_FIELD[role]: result}
    raise TypeError(f"a {role} function returns a response object, not {type(result).__name__}")


def _failure(error):
    traceback.print_exc(file=sys.stderr)
    if isinstance(error, Retryable):
        return {"error": f"{error}", "retryable": True}
    return {"error": f"{type(error).__name__}: {error}", "retryable": False}


def _set_up():
    global _ready
    if not _ready:
        for function in _setups:
            function()
        _ready = True


def _as_ladder(role, request):
    """The request as its function takes it: a ladder function gets a single budget as a ladder
    of one; a single-budget function refuses a ladder (its manifest entry says `ladder = true`)."""
    if not isinstance(request, dict):
        return request, False
    if role in _ladders and "token_budgets" not in request and "token_budget" in request:
        request = dict(request)
        request["token_budgets"] = [request.pop("token_budget")]
        return request, True
    if role not in _ladders and "token_budgets" in request:
        raise TypeError("this compressor serves one budget a call: decorate it @compressor(ladder=True), or drop `ladder = true` from its manifest entry")
    return request, False


def _single(reply):
    """A ladder's reply to a single budget: its one memory."""
    memories = reply.get("memories") if isinstance(reply, dict) else None
    if isinstance(memories, list) and len(memories) == 1:
        reply = {key: value for key, value in reply.items() if key != "memories"}
        reply["memory"] = memories[0]
    return reply


def _respond(role, request):
    """The reply to one request: the function's answer, or the error it raised."""
    try:
        _set_up()
        function = _handlers[role]
        if _batch_sizes.get(role, 1) > 1:
            return _respond_batch(role, [request])[0]
        request, single = _as_ladder(role, request)
        reply = _as_reply(role, function(**_arguments(function, request)))
        return _single(reply) if single else reply
    except Exception as error:  # every failure is explained, never a broken reply
        return _failure(error)


def _respond_batch(role, requests):
    """The replies to a batch: the function takes the list of requests, returns a list."""
    try:
        _set_up()
        asked = [_as_ladder(role, request) for request in requests]
        results = _handlers[role]([request for request, _ in asked])
        if not isinstance(results, (list, tuple)) or len(results) != len(requests):
            raise TypeError(f"a batch function returns a list of {len(requests)} replies, not {type(results).__name__}")
        replies = [_as_reply(role, result) for result in results]
        return [_single(reply) if single else reply for reply, (_, single) in zip(replies, asked)]
    except Exception as error:  # the whole batch failed: each request says why
        reply = _failure(error)
        return [dict(reply) for _ in requests]


# The most of a call's log sent with its reply (its end is kept).
LOG_BYTES = 32 * 1024


class _CallLog:
    """Python's stdout and stderr while one call (or batch) is served, captured for its reply."""

    def __enter__(self):
        import io

        self._saved = (sys.stdout, sys.stderr)
        self._buffer = io.StringIO()
        sys.stdout = sys.stderr = self._buffer
        return self

    def __exit__(self, *_):
        sys.stdout, sys.stderr = self._saved
        return False

    def text(self):
        text = self._buffer.getvalue()
        return text[-LOG_BYTES:]


def _with_log(reply, log):
    if log and isinstance(reply, dict):
        reply = dict(reply)
        reply["log"] = log
    return reply


def _encoded(reply):
    """One reply line, and whether it is an error: strict JSON (no NaN or Infinity, which gacc
    cannot read), or an error reply saying why the function's reply could not be sent."""
    try:
        return json.dumps(reply, ensure_ascii=False, allow_nan=False), "error" in reply
    except (TypeError, ValueError) as error:
        refused = {"error": f"the reply is not JSON: {error}", "retryable": False}
        if isinstance(reply, dict) and "id" in reply:
            refused["id"] = reply["id"]
        return json.dumps(refused, ensure_ascii=False, allow_nan=False, default=str), True


def _parsed(text):
    """A request line as a dict, or the error reply it gets."""
    try:
        request = json.loads(text)
    except ValueError as error:
        return None, {"error": f"the request is not JSON: {error}", "retryable": False}
    if not isinstance(request, dict):
        return None, {"error": f"the request is not a JSON object: {text.strip()[:80]}", "retryable": False}
    return request, None


def _reply_channel():
    """Moves fd 1 to stderr and keeps a private copy of it for replies."""
    sys.stdout.flush()
    private = os.dup(1)
    os.dup2(2, 1)
    # A print now goes to stderr, line by line: a persistent worker's log reaches gacc with the
    # call it belongs to, not when the buffer fills or the worker exits.
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    return os.fdopen(private, "w", encoding="utf-8")


def serve():
    """Answers gacc's requests on stdin, in the mode gacc asks for; returns the exit status."""
    replies = _reply_channel()
    role = _role()
    status = 0

    def send(reply):
        nonlocal status
        line, failed = _encoded(reply)
        status = 1 if failed else status
        replies.write(line + "\n")

    def answer(text):
        request, refused = _parsed(text)
        with _CallLog() as log:
            reply = refused or _respond(role, request)
        reply = _with_log(reply, log.text())
        # With max_inflight > 1 each request carries an id its reply echoes.
        if request is not None and "id" in request:
            reply["id"] = request["id"]
        # What the call logged goes out before its reply, so gacc files it with this call.
        sys.stdout.flush()
        sys.stderr.flush()
        send(reply)
        replies.flush()

    if os.environ.get("GACC_MODE") != "persistent":
        answer(sys.stdin.read())
        return status
    size = _batch_sizes.get(role, 1)
    if size == 1:
        for line in sys.stdin:
            if line.strip():
                answer(line)
        return status
    # Batches: a thread reads requests as they come; each batch is what has arrived (up to
    # batch_size), answered together, each reply carrying its request's id.
    lines = queue.Queue()

    def read():
        for line in sys.stdin:
            if line.strip():
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    ended = False
    while not ended:
        batch = [lines.get()]
        # What arrives within the gather window after the batch's first request joins it.
        until = time.monotonic() + _batch_waits.get(role, BATCH_WAIT)
        while len(batch) < size and batch[-1] is not None:
            try:
                batch.append(lines.get(timeout=max(0.0, until - time.monotonic())))
            except queue.Empty:
                break
        if None in batch:
            ended = True
            batch = [line for line in batch if line is not None]
        # Every line read gets a reply, in the order read: a malformed one its error.
        parsed = [_parsed(line) for line in batch]
        requests = [request for request, _ in parsed if request is not None]
        with _CallLog() as log:
            answers = iter(_respond_batch(role, requests) if requests else [])
        # A batch is served as one: its log is each of its calls'.
        logged = log.text()
        sys.stdout.flush()
        sys.stderr.flush()
        for request, refused in parsed:
            reply = refused or _with_log(next(answers), logged)
            if request is not None and "id" in request:
                reply["id"] = request["id"]
            send(reply)
        replies.flush()
    return status


USAGE = """usage: python -m gacc_callback COMMAND ...

Commands:
  try SCRIPT [--role ROLE] [FIELDS ...]
      Calls the function SCRIPT decorates for ROLE (compressor, reader, judge; compressor by
      default) with one request built from the options, as gacc would, and prints its reply.
      Exit status 0 for a reply, 1 for an error reply, 2 for a call that could not be made.
      `try --help` lists the fields.
  --help
      This text.

A callback script itself is run by gacc (`command = ["python3", "compress.py"]`), which calls
`serve()` at its end; see the module's documentation: python3 -c 'import gacc_callback; help(gacc_callback)'
"""


class _TryError(Exception):
    """A `try` that cannot be made: said on one line."""


def _text_of(path):
    """The text of a file an option names ("" when none)."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise _TryError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def _try_request(options):
    """The request `try` sends, from its options."""
    try:
        params = json.loads(options.params)
    except ValueError as error:
        raise _TryError(f"--params is not JSON: {error}") from None
    request = {"protocol": PROTOCOL, "role": options.role, "seed": options.seed, "params": params}
    if options.role == "compressor":
        request.update(context=_text_of(options.context), goal=options.goal, token_budget=options.budget)
    elif options.role == "reader":
        request.update(memory=_text_of(options.memory), question=options.question or "")
    elif options.role == "judge":
        request.update(
            source=_text_of(options.source),
            question=options.question or "",
            reference=options.reference or "",
            answer=options.answer or "",
        )
    return request


def _try(argv):
    """`python -m gacc_callback try SCRIPT ...`: one request to a script's function, by hand."""
    parser = argparse.ArgumentParser(prog="python -m gacc_callback try")
    parser.add_argument("script")
    parser.add_argument("--role", default="compressor", choices=sorted(_FIELD) + ["tokenizer"])
    parser.add_argument("--context", help="a file whose text is the compressor's context")
    parser.add_argument("--goal")
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--memory", help="a file whose text is the reader's memory")
    parser.add_argument("--question")
    parser.add_argument("--reference")
    parser.add_argument("--answer")
    parser.add_argument("--source", help="a file whose text is the judge's source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params", default="{}", help="params as JSON")
    options = parser.parse_args(argv)
    try:
        request = _try_request(options)
        if not os.path.isfile(options.script):
            raise _TryError(f"no script at {options.script}")
    except _TryError as error:
        print(f"python -m gacc_callback try: {error}", file=sys.stderr)
        return 2
    replies = _reply_channel()  # what the script prints goes to stderr, as under gacc
    # The script's `import gacc_callback` is this module, so its decorators register here; its
    # folder is importable, as when gacc runs it.
    sys.modules["gacc_callback"] = sys.modules[__name__]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    try:
        runpy.run_path(options.script, run_name="gacc_callback_try")
    except Exception as error:  # the script's own failure: where it is, in one line
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{frame.filename}:{frame.lineno}"
        print(f"python -m gacc_callback try: {options.script} failed to load at {where}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    if options.role not in _handlers:
        print(f"python -m gacc_callback try: {options.script} decorates no {options.role} function", file=sys.stderr)
        return 2
    line, failed = _encoded(_respond(options.role, request))
    replies.write(json.dumps(json.loads(line), ensure_ascii=False, indent=2) + "\n")
    replies.flush()
    return 1 if failed else 0


def main(arguments):
    """`python -m gacc_callback COMMAND ...`: the exit status."""
    if arguments[:1] == ["try"]:
        return _try(arguments[1:])
    if arguments[:1] in (["--help"], ["-h"], ["help"]):
        print(USAGE, end="")
        return 0
    print(USAGE, end="", file=sys.stderr)
    return 2


# Run as a copied file (`python -m gacc_callback` beside a script); the installed package runs
# `__main__.py`, which calls `main` too.
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
