"""The ``radixlm`` command line: ``radixlm serve [server args]`` and
``radixlm tiny-model OUT_DIR --arch llama|mistral|qwen2|qwen3``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``radixlm`` console script. Exits with the subcommand's status."""
    from radixlm.runtime.server.config import add_cli_args, config_from_namespace
    from radixlm.runtime.tiny_model import ARCHS

    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP (native + OpenAI APIs)")
    add_cli_args(serve)
    tiny = sub.add_parser("tiny-model", help="write a tiny random-weight model with its tokenizer")
    tiny.add_argument("out_dir")
    tiny.add_argument("--arch", choices=ARCHS, default="llama")
    tiny.add_argument("--vocab-size", type=int, default=2048)
    tiny.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        from radixlm.runtime.server.launch import launch_server

        sys.exit(launch_server(config_from_namespace(args)))
    from radixlm.runtime.tiny_model import make_tiny_model

    print(make_tiny_model(args.out_dir, args.arch, vocab_size=args.vocab_size, seed=args.seed))


if __name__ == "__main__":
    main()
