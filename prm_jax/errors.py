"""Every error prm-jax raises for a caller to catch, in one module (as httpx keeps its own in
``httpx._exceptions``): ``except prm_jax.errors.PRMJaxError`` catches any of them, and each is also the
built-in exception it always was (a ``ConfigError`` is a ``ValueError``), so existing handlers still apply.

Each class says when it is raised (its docstring's first sentence) and what the ``prm-jax`` command does when
a run meets it (``command_line``; ``exit_status`` where it ends the run: 2 for input the user must fix, 1 when
nothing was left to train on). ``described()`` is the table the documentation renders from these
declarations. ``KeyboardInterrupt`` and the command's SIGTERM/SIGHUP end a run with 128 + the signal's number.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

__all__ = ["PRMJaxError", "ConfigError", "ConfigFileError", "InputError", "OutputFolderError", "ScoreError",
           "NoGroupAccepted", "NotScorableError", "RunnerClosedError", "PrefixRuleError", "RetryError",
           "ServiceError", "RequestFailed", "SandboxError", "NoTextError", "TemplateError", "described"]

SCORER_FAILURE = "a scorer's failure: the rows it was scoring fail (counted in the scorer's stats), the run goes on"


class PRMJaxError(Exception):
    """The base of every prm-jax error (catch it to catch any of them).

    Example:
        >>> from prm_jax.errors import ConfigError, PRMJaxError
        >>> try:
        ...     prm_jax.AdvantageConfig(discount=2.0)
        ... except PRMJaxError as err:
        ...     print(type(err).__name__, isinstance(err, ValueError), err.exit_status)
        ConfigError True 2
    """

    #: The ``prm-jax`` command's exit status when a run ends on this error; None where it does not end one.
    exit_status: ClassVar[int | None] = None
    #: What the ``prm-jax`` command does when a run meets this error.
    command_line: ClassVar[str] = "not raised by the command line"


# ---- configuration


class ConfigError(PRMJaxError, ValueError):
    """A bad setting, with the key path that names it (``actor.adv_norm.eps``) and what is wrong.

    Args:
        key: The setting's key path, as written (``actor.adv_norm.eps``); empty for none.
        problem: What is wrong with it, in words.

    Example:
        >>> try:
        ...     prm_jax.AdvantageConfig(discount=2.0)
        ... except prm_jax.errors.ConfigError as err:
        ...     print(err.key, "|", err.problem)
        ...
        discount | must be in [0.0, 1.0], got 2.0
    """

    exit_status = 2
    command_line = "exit 2, one line naming the file and the key; nothing written"

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key} {problem}" if key else problem)
        self.key, self.problem = key, problem

    def under(self, prefix: str) -> ConfigError:
        """The same error one level down: ``prefix.key``.

        Args:
            prefix: The key path of the section it came from (``actor``).
        """
        if not prefix:
            return self
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.problem)


class ConfigFileError(PRMJaxError, ValueError):
    """A config file that cannot be read or is not a valid config; the message starts with the file's name.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "broken.yaml"
        >>> _ = path.write_text("actor: [1, 2")
        >>> try:
        ...     prm_jax.load_config(path)
        ... except prm_jax.errors.ConfigFileError as err:
        ...     print(str(err).startswith(str(path)), err.exit_status)
        ...
        True 2
    """

    exit_status = 2
    command_line = "exit 2, one line starting with the file's name; nothing written"


# ---- the command line's input and outputs


class InputError(PRMJaxError, ValueError):
    """Bad input, located: which file, which line, which field.

    Args:
        path: The input file.
        line: The line, from 1.
        field: The field of that line (``interactions[2].reward``).
        message: What is wrong, in words.

    Example:
        >>> err = prm_jax.errors.InputError("sessions.jsonl", 3, "interactions[0].reward", "must be finite, got NaN")
        >>> print(err)
        sessions.jsonl:3: interactions[0].reward: must be finite, got NaN
        >>> err.exit_status, isinstance(err, ValueError)
        (2, True)
    """

    exit_status = 2
    command_line = "exit 2, one line: file, line and field; nothing written"

    def __init__(self, path: Path | str, line: int, field: str, message: str):
        super().__init__(f"{path}:{line}: {field}: {message}")
        self.path, self.line, self.field = str(path), line, field


class OutputFolderError(PRMJaxError, ValueError):
    """The output folder cannot take this run's outputs (said before any input is read).

    Example:
        >>> err = prm_jax.errors.OutputFolderError("--output out: already holds an output set")
        >>> err.exit_status, isinstance(err, ValueError)
        (2, True)
    """

    exit_status = 2
    command_line = "exit 2, one line naming `--output`; nothing written"


class ScoreError(PRMJaxError):
    """A run could not be scored (bad input, a scorer that cannot be built, advantages that cannot be
    computed): one line, what the user must fix.

    Example:
        >>> prm_jax.errors.ScoreError.exit_status, issubclass(prm_jax.errors.ScoreError, prm_jax.errors.PRMJaxError)
        (2, True)
    """

    exit_status = 2
    command_line = "exit 2, the one line; nothing written"


class NoGroupAccepted(PRMJaxError):
    """Every group was rejected or filtered: nothing to train on.

    Example:
        >>> prm_jax.errors.NoGroupAccepted.exit_status
        1
    """

    exit_status = 1
    command_line = "exit 1, one line with each cause once and the sessions it hit; nothing written"


# ---- the runner


class NotScorableError(PRMJaxError, ValueError):
    """A branch the runner cannot score (a message-only turn): the input's fault, not a scorer's.

    Example:
        >>> turn = prm_jax.Interaction("t0", None, None, output_messages=[{"role": "assistant", "content": "hi"}])
        >>> with prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer()]) as runner:
        ...     try:
        ...         runner.run([turn])
        ...     except prm_jax.errors.NotScorableError as err:
        ...         print(type(err).__name__)
        ...
        NotScorableError
    """

    command_line = "not raised by the command line (its session reader refuses a turn without tokens first)"


class RunnerClosedError(PRMJaxError, RuntimeError):
    """A call on a runner (or service) that is closing or closed: a lifecycle error, not a scorer's failure.

    Example:
        >>> runner = prm_jax.BlockingRunner(scorers=[prm_jax.scorers.LengthBudgetScorer()])
        >>> runner.close()
        >>> try:
        ...     runner.run([prm_jax.Interaction("t0", [1], [2])])
        ... except prm_jax.errors.RunnerClosedError as err:
        ...     print(type(err).__name__, isinstance(err, RuntimeError))
        ...
        RunnerClosedError True
    """


class PrefixRuleError(PRMJaxError, RuntimeError):
    """A ``prefix_determined`` scorer read ``ctx["messages"]``, the branch's conversation: its score of a shared
    turn would be given to every clone of the session although it depends on one branch.

    Example:
        >>> issubclass(prm_jax.errors.PrefixRuleError, RuntimeError), prm_jax.errors.PrefixRuleError.exit_status
        (True, None)
    """

    command_line = SCORER_FAILURE


# ---- scorers and the services they call


class RetryError(PRMJaxError, RuntimeError):
    """Every attempt failed; ``__cause__`` is the last failure and ``errors`` holds them all.

    Args:
        message: The error's message.
        errors: Every attempt's failure, in order.

    Example:
        >>> import anyio
        >>> async def flaky():
        ...     raise ConnectionError("refused")
        ...
        >>> async def main():
        ...     try:
        ...         await prm_jax.runtime.call_with_retry(flaky, timeout=1.0, attempts=2, backoff=0.0)
        ...     except prm_jax.errors.RetryError as err:
        ...         return len(err.errors), type(err.__cause__).__name__
        ...
        >>> anyio.run(main)
        (2, 'ConnectionError')
    """

    command_line = SCORER_FAILURE

    def __init__(self, message: str, errors: list[BaseException]):
        super().__init__(message)
        self.errors = errors


class ServiceError(PRMJaxError, RuntimeError):
    """A service answered, but not with a usable result: ``status`` (the HTTP status, None for a malformed
    200 answer) and its ``reason`` phrase, whether the answer is worth retrying, and the server's
    ``retry_after`` seconds.

    Args:
        message: The error's message (naming the scorer, the turn and the server).
        status: The HTTP status the server answered; ``None`` for a malformed 200 answer or no answer.
        retryable: Whether the answer is worth another attempt (429, 408, 5xx).
        retry_after: The seconds the server asked to wait (``Retry-After``); ``None``: it did not say.
        reason: The HTTP reason phrase.

    Example:
        >>> err = prm_jax.errors.ServiceError("scorer 'judge': answered 503", status=503, retryable=True)
        >>> err.status, err.retryable, isinstance(err, RuntimeError)
        (503, True, True)
    """

    command_line = SCORER_FAILURE

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False,
                 retry_after: float | None = None, reason: str = ""):
        super().__init__(message)
        self.status, self.retryable, self.retry_after, self.reason = status, retryable, retry_after, reason


class RequestFailed(RetryError):
    """A served scorer's request failed on every attempt: the message names the scorer, the URL (without
    secrets), the last attempt's HTTP status or connection error, and the attempts made; ``status`` is the
    last HTTP status (None: no answer), ``errors`` every attempt's failure (``RetryError``'s).

    Args:
        message: The error's message (the scorer, the URL, the last failure, the attempts).
        errors: Every attempt's failure, in order.
        url: The URL requested, without secrets.
        status: The last attempt's HTTP status; ``None``: no answer.

    Example:
        >>> errors = [TimeoutError()] * 3
        >>> err = prm_jax.errors.RequestFailed("POST failed 3 times", errors, url="http://127.0.0.1:8000", status=None)
        >>> len(err.errors), err.url, isinstance(err, prm_jax.errors.RetryError)
        (3, 'http://127.0.0.1:8000', True)
    """

    def __init__(self, message: str, errors: list[BaseException], *, url: str, status: int | None):
        super().__init__(message, errors)
        self.url, self.status = url, status


class SandboxError(PRMJaxError, RuntimeError):
    """The sandbox that runs an agent's code failed, not the code (``CodeExecutionScorer``: the tests' harness
    did not start): the branch fails, never a score of 0.

    Example:
        >>> err = prm_jax.errors.SandboxError("scorer 'code_execution': the tests' harness did not start")
        >>> isinstance(err, RuntimeError), err.command_line == prm_jax.errors.ServiceError.command_line
        (True, True)
    """

    command_line = SCORER_FAILURE


class NoTextError(PRMJaxError, ValueError):
    """A judge got a turn without the text it reads.

    Example:
        >>> judge = prm_jax.scorers.HTTPJudgeScorer("http://127.0.0.1:8000/judge")
        >>> try:
        ...     judge.request([(prm_jax.Interaction("t0", [1], [2]), {})])
        ... except prm_jax.errors.NoTextError as err:
        ...     print(type(err).__name__, isinstance(err, ValueError))
        ...
        NoTextError True
    """

    command_line = SCORER_FAILURE


class TemplateError(PRMJaxError, ValueError):
    """A judge's prompt template has a field without a value for this turn (``{ctx[task]}``, no ``task``).

    Example:
        >>> judge = prm_jax.scorers.OpenAIJudgeScorer("http://127.0.0.1:8000/v1", "m", prompt="Task {ctx[task]}: {response}")
        >>> turn = prm_jax.Interaction("t0", [1], [2], output_messages=[{"role": "assistant", "content": "4"}])
        >>> try:
        ...     judge.render(turn, {})
        ... except prm_jax.errors.TemplateError as err:
        ...     print("{ctx[task]}" in str(err))
        ...
        True
    """

    command_line = SCORER_FAILURE


def described() -> list[tuple[str, str, str, str]]:
    """The errors of ``__all__``, one row each: ``(name, what else it is (the built-in exception or the
    prm-jax error it extends), when it is raised (its docstring's first sentence), what the command line does
    with it)``; the site's Errors page renders it.

    Example:
        >>> from prm_jax.errors import described
        >>> [row for row in described() if row[0] == "NoGroupAccepted"]  # doctest: +NORMALIZE_WHITESPACE
        [('NoGroupAccepted', 'Exception', 'Every group was rejected or filtered: nothing to train on',
          'exit 1, one line with each cause once and the sessions it hit; nothing written')]
    """
    rows = []
    for name in __all__:
        error = globals()[name]
        if not (isinstance(error, type) and issubclass(error, PRMJaxError)):
            continue
        also = [base.__name__ for base in error.__bases__ if base is not PRMJaxError] or ["Exception"]
        when = " ".join((error.__doc__ or "").split()).split(". ")[0].rstrip(".")
        rows.append((name, ", ".join(also), when, error.command_line))
    return rows
