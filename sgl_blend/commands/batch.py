"""Submit and follow batches on a running server through its OpenAI Batch API (submit, status, cancel, download, list)."""  # noqa: E501 - the first line is the --help summary

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "batch"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sgl_blend.client.http import API_KEY_ENV, DEFAULT_URL, URL_ENV

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help=f"server URL (default ${URL_ENV} or {DEFAULT_URL})")
    common.add_argument("--api-key", default=None, help=f"the server's --api-key (default ${API_KEY_ENV})")
    actions = parser.add_subparsers(dest="batch_action", required=True, metavar="ACTION")

    submit = actions.add_parser("submit", parents=[common], help="upload a JSONL file and create a batch")
    submit.add_argument("file", type=Path, help="input JSONL, OpenAI batch format")
    submit.add_argument("--endpoint", default=None, help="the batch's endpoint (default: the first line's url)")
    submit.add_argument("--completion-window", default="24h", help="24h (OpenAI's), or e.g. 30m, 90s")
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    submit.add_argument("--wait", action="store_true", help="follow it with a progress bar until it finishes")
    submit.add_argument(
        "-o", "--output-dir", type=Path, default=None, help="with --wait: download the output and error files here"
    )

    status = actions.add_parser("status", parents=[common], help="print a batch as JSON")
    status.add_argument("batch_id")

    cancel = actions.add_parser("cancel", parents=[common], help="cancel a batch (finished lines are kept)")
    cancel.add_argument("batch_id")
    cancel.add_argument("--wait", action="store_true", help="wait until it is cancelled")

    download = actions.add_parser("download", parents=[common], help="download a batch's output and error files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output-dir", type=Path, default=Path("."))

    listing = actions.add_parser("list", parents=[common], help="list batches, newest first")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")


def run(args: argparse.Namespace) -> int:
    import openai

    from sgl_blend.client import batches as batch_client

    client = batch_client.connect(args.url, args.api_key)
    try:
        return _ACTIONS[args.batch_action](client, args)
    except openai.APIStatusError as error:
        print(f"error: {error.status_code}: {_message(error)}", file=sys.stderr)
        return 1
    except openai.APIConnectionError as error:
        print(f"error: cannot reach {client.base_url}: {error}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _submit(client, args: argparse.Namespace) -> int:
    from sgl_blend.client import batches as batch_client

    metadata = dict(_pair(item) for item in args.metadata) or None
    batch = batch_client.submit(
        client, args.file, endpoint=args.endpoint, completion_window=args.completion_window, metadata=metadata
    )
    print(batch.id, flush=True)
    if not args.wait:
        return 0
    batch = batch_client.wait(client, batch.id)
    _print_batch(batch)
    if args.output_dir is not None:
        for path in batch_client.download(client, batch, args.output_dir).values():
            print(path)
    return 0 if batch.status == "completed" else 1


def _status(client, args: argparse.Namespace) -> int:
    _print_batch(client.batches.retrieve(args.batch_id))
    return 0


def _cancel(client, args: argparse.Namespace) -> int:
    from sgl_blend.client import batches as batch_client

    batch = client.batches.cancel(args.batch_id)
    if args.wait:
        batch = batch_client.wait(client, batch.id, progress=False)
    _print_batch(batch)
    return 0


def _download(client, args: argparse.Namespace) -> int:
    from sgl_blend.client import batches as batch_client

    batch = client.batches.retrieve(args.batch_id)
    written = batch_client.download(client, batch, args.output_dir)
    if not written:
        print(f"error: batch {batch.id} ({batch.status}) has no output or error file yet", file=sys.stderr)
        return 1
    for path in written.values():
        print(path)
    return 0


def _list(client, args: argparse.Namespace) -> int:
    shown = 0
    for batch in client.batches.list(limit=min(args.limit, 100)):
        counts = batch.request_counts
        done = f"{counts.completed + counts.failed}/{counts.total}" if counts else "-"
        print(f"{batch.id}  {batch.status:<11} {done:>13}  {batch.endpoint}")
        shown += 1
        if shown >= args.limit:
            break
    return 0


def _print_batch(batch) -> None:
    print(json.dumps(batch.model_dump(), indent=2))


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--metadata takes KEY=VALUE, got {text!r}")
    return key, value


def _message(error) -> str:
    """The server's message: OpenAI's error shape, or SGLang's plain one (its 401)."""
    body = error.body
    if isinstance(body, dict):
        return str(body.get("message") or body)
    return str(body or error.message)


_ACTIONS = {"submit": _submit, "status": _status, "cancel": _cancel, "download": _download, "list": _list}
