"""The SGLang HTTP server process that `sgl-blend serve` supervises.

It is SGLang's own launcher with one difference: the CPU compatibility finder is installed
first, so the process imports even where no ``.pth`` start-up line put it in place.
"""

from __future__ import annotations

import os
import sys

from sgl_blend import cpu_compat


def main(argv: list[str] | None = None) -> None:
    cpu_compat.install()
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
