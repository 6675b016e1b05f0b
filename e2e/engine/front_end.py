"""vLLM's OpenAI front end with the venv's plugins, up to where it would
start the engine. Run in an engine venv whose vLLM sets up its logging after
it loads the plugins (0.32.0):

    <venv>/bin/python front_end.py MODEL OUT.json CONTROL_LINE NEXT_LINE

It runs vLLM's own main() of ``python -m vllm.entrypoints.openai.api_server``
(vllm/entrypoints/launchers/api_server/entry.py, the same steps as ``vllm
serve``'s vllm/entrypoints/cli/main.py): cli_env_setup(), the argument
parser, whose making loads the general plugins
(AsyncEngineArgs.add_cli_args), parse_args, configure_logging_from_args
(vLLM sets up its logging here), validate_parsed_serve_args. The arguments
have ``--enable-log-outputs`` without ``--enable-log-requests``, which that
check refuses (TypeError), so no engine starts. Then NEXT_LINE, from vLLM's
own logger, as the server's next line would be.

The negative control: right after vLLM has loaded the plugins, the plugin's
line as the plugin logged it before say.py, to its logger at once
(CONTROL_LINE). Nothing else of vLLM's is changed: vllm.plugins'
load_general_plugins is wrapped (before vLLM imports it) only to log that
line after it returns.

OUT.json: {pid, refused (the check's message), control_logged, the
handlers of vLLM's logger when the plugins were loaded and at the end}.
"""

import json
import logging
import os
import sys
from pathlib import Path


def main(model: str, out: str, control_line: str, next_line: str) -> int:
    import vllm.plugins

    loaded = vllm.plugins.load_general_plugins
    seen: dict = {}

    def load_general_plugins():
        first = not vllm.plugins.plugins_loaded
        loaded()
        if first:
            seen["handlers"] = [repr(h) for h in logging.getLogger("vllm").handlers]
            logging.getLogger("vllm.vllm_xpu_fakes").info(control_line)
            seen["control_logged"] = True

    vllm.plugins.load_general_plugins = load_general_plugins

    from vllm.entrypoints.launchers.api_server import entry
    from vllm.logger import init_logger

    sys.argv = [
        "vllm.entrypoints.openai.api_server",
        "--model", model, "--skip-tokenizer-init",
        "--enable-log-outputs",  # without --enable-log-requests: refused
    ]  # fmt: skip
    refused = ""
    try:
        entry.main()
    except TypeError as e:
        refused = str(e)
    init_logger("vllm.entrypoints.launchers.api_server.entry").info(next_line)
    Path(out).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "refused": refused,
                "control_logged": seen.get("control_logged", False),
                "handlers_when_plugins_loaded": seen.get("handlers"),
                "handlers_after": [repr(h) for h in logging.getLogger("vllm").handlers],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
