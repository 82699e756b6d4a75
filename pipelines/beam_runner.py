"""How every Beam stage runs a pipeline: its options, the portable path's checks, one-line errors.

The same pipeline runs in-process (FnApiRunner, the default) or through Beam's portability layer
(`PortableRunner` with a job service; Dataflow, Flink and Spark run Python pipelines that way).
On the portable path DoFns run in SDK worker processes that share nothing with the driver but
what is pickled into them and the files they can reach, so stages pass absolute paths and carry
what they resolved on the driver (converter functions, filter factories) inside their DoFns.

`--job_endpoint=embed` runs the job service inside the driver; its workers come from
`--environment_type=EXTERNAL --environment_config=HOST:PORT`, an SDK worker pool started with
`python -m apache_beam.runners.worker.worker_pool_main --service_port=PORT`. Those settings are
checked before the pipeline starts, so a missing pool is one clear line, not a gRPC traceback.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, _BeamArgumentParser

from schemas.store import TEMP_PREFIX, Dataset, StoreError

DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
POOL_COMMAND = "python -m apache_beam.runners.worker.worker_pool_main --service_port={port}"


class PipelineError(Exception):
    """A fatal problem with a pipeline run (bad config, counts that do not add up, a failed runner)."""


def stray_words(beam_args: Sequence[str]) -> list[str]:
    """The words among a command's extra arguments that are no option's value: Beam would drop them
    silently (`--input a.json b.json` leaves `b.json` here). Beam's own parser knows which of its
    options take a value; an option it does not know takes the word after it, as Beam reads it."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # what PipelineOptions.get_all_options does
    _, unknown = parser.parse_known_args(list(beam_args))
    stray, i = [], 0
    while i < len(unknown) and unknown[i] != "--":
        word = unknown[i]
        if not word.startswith("-"):
            stray.append(word)
        elif "=" not in word and i + 1 < len(unknown) and not unknown[i + 1].startswith("-"):
            i += 1  # an unknown option's value
        i += 1
    return stray


def check_portable(runner: str | Any, beam_args: Sequence[str], error: type[Exception] = PipelineError) -> None:
    """Refuse extra arguments and portable-runner settings that cannot work, naming the fix; stages
    call it before they touch their output. `runner` is a name or class path (a runner object is not
    checked)."""
    if stray := stray_words(beam_args):
        raise error(f"unexpected argument {stray[0]!r}: an option takes one value (repeat it for more, e.g. "
                    "--input a.json --input b.json)")
    portable = PipelineOptions(list(beam_args)).view_as(PortableOptions)
    env_type = (portable.environment_type or "").upper()
    if isinstance(runner, str) and runner.rsplit(".", 1)[-1] == "PortableRunner" and not portable.job_endpoint:
        raise error("PortableRunner needs --job_endpoint: 'embed' (a job service in this process) or the "
                    "address of a Flink or Spark job service")
    if env_type == "EXTERNAL" and not portable.environment_config:
        raise error("--environment_type=EXTERNAL needs --environment_config=HOST:PORT of an SDK worker pool")
    if portable.job_endpoint != "embed":
        return  # a remote job service's workers may reach addresses this machine cannot
    if env_type == "PROCESS":
        raise error("the embedded job service (--job_endpoint=embed) cannot start PROCESS workers; use "
                    "--environment_type=EXTERNAL --environment_config=localhost:PORT with an SDK worker pool "
                    f"({POOL_COMMAND.format(port='PORT')}), or a Flink or Spark job service")
    if env_type == "EXTERNAL":
        host, _, port = str(portable.environment_config).rpartition(":")
        if not port.isdigit():
            raise error(f"--environment_config={portable.environment_config}: expected HOST:PORT of an SDK worker pool")
        try:
            socket.create_connection((host or "localhost", int(port)), timeout=5).close()
        except OSError as exc:
            raise error(f"no SDK worker pool answers at {portable.environment_config} ({exc.strerror or exc}); "
                        f"start one with: {POOL_COMMAND.format(port=port)}") from None


def staging_dir(ds: Dataset, stage: str) -> Path:
    """A fresh hidden dir in the output for a run's temp files, as an absolute path: workers do not
    share the driver's working directory. Leftovers of a killed run are removed first."""
    for stale in ds.path.glob(f"{TEMP_PREFIX}{stage}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{stage}-", dir=ds.path.resolve()))


def run_beam(
    build: Callable[[beam.Pipeline], None],
    *,
    runner: str | Any,
    beam_args: Sequence[str],
    temp_location: Path,
    error: type[Exception] = PipelineError,
    passthrough: tuple[type[Exception], ...] = (),
) -> None:
    """Build and run one pipeline; a failure becomes `error` with one line (the worker's own error).

    `temp_location` (Beam's temp files, unless the arguments name one) must be a directory every
    worker sees, like the stage's output; the caller removes it. `passthrough` errors are raised
    as they are (the in-process runner re-raises a DoFn's own exception).
    """
    args = list(beam_args)
    if not any(a.startswith("--temp_location") for a in args):
        args.append(f"--temp_location={Path(temp_location).resolve()}")
    options = PipelineOptions(args)
    check_portable(runner, args, error)
    try:
        with _quiet_job_service(), beam.Pipeline(runner=runner, options=options) as p:
            build(p)
    except (StoreError, *passthrough):
        raise
    except Exception as exc:
        # Finished units stay committed, so a re-run after the fix resumes.
        raise error(f"pipeline failed: {one_line(exc)}") from exc


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit)\b|details = )")


def one_line(exc: BaseException) -> str:
    """The line of a runner's multi-line error that says what went wrong (usually the last error line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines if _ERROR_LINE.match(line)]
    line = telling[-1] if telling else (lines[-1] if lines else "")
    return f"{type(exc).__name__}: {line}"


class _DropJobServiceErrors(logging.Filter):
    """The embedded job service logs a failed pipeline's traceback, then the runner raises it again."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        return not (record.name.startswith("apache_beam") or "apache_beam" in record.pathname)


@contextlib.contextmanager
def _quiet_job_service() -> Iterator[None]:
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    drop = _DropJobServiceErrors()
    for h in handlers:
        if h is not None:
            h.addFilter(drop)
    try:
        yield
    finally:
        for h in handlers:
            if h is not None:
                h.removeFilter(drop)
