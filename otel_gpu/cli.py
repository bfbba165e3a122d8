# SPDX-License-Identifier: Apache-2.0
"""The ``otel-gpu`` command.

    otel-gpu run [--duration S] [--output-dir DIR] [--otlp-endpoint URL] ...   start the agent
    otel-gpu config [...]                                   print the effective configuration
    otel-gpu inject [--overhead-budget P] -- COMMAND ...    run a CUDA workload with GPU-time profiling
    otel-gpu --version

Exit codes: 0 success, 1 runtime failure, 2 bad configuration (every problem listed, each naming its flag).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from otel_gpu import __version__, config

_EPILOG = """examples:
  otel-gpu run                                   local mode: files under ./otel-gpu-data and a terminal summary
  otel-gpu run --otlp-endpoint http://collector:4317
  OTEL_EXPORTER_OTLP_ENDPOINT=http://mimir:8080/otlp OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf otel-gpu run \\
      --pyroscope-url http://pyroscope:4040      metrics to Mimir (an endpoint with a path gets no profiles),
                                                 profiles to Pyroscope
  otel-gpu run --prometheus-port 9464            metrics scraped; profiles (no backend) to files and the terminal
  otel-gpu config --config agent.yaml            show what the agent would use
"""


def _budget_percent(text: str) -> float:
    """--overhead-budget: a percentage in 0.01..100, as the fraction the injected library reads."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (per cent, e.g. 2 or 0.5)") from None
    if not 0.01 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is outside 0.01..100 (per cent)")
    return value / 100


def _parser() -> argparse.ArgumentParser:
    """The top-level parser; ``parser.commands`` maps each command's name to its own parser."""
    parser = argparse.ArgumentParser(prog="otel-gpu", description="OpenTelemetry-native GPU profiler and metrics agent",
                                     epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"otel-gpu {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", help="run the agent until interrupted (or for --duration seconds)",
                              epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    config.add_arguments(run)
    show = commands.add_parser("config", help="print the effective configuration as YAML that --config loads back "
                                              "(secrets left out) and exit")
    config.add_arguments(show)
    from otel_gpu.cuda.inject import PACKAGED_LIBRARY, container_instructions

    inject = commands.add_parser("inject", help="run a CUDA workload with the GPU-time library injected",
                                 usage="otel-gpu inject [--overhead-budget PERCENT] -- COMMAND [ARGS ...]",
                                 epilog=container_instructions(PACKAGED_LIBRARY),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    inject.add_argument("--overhead-budget", type=_budget_percent, default=None, metavar="PERCENT",
                        help="how much slower the workload may run while GPU time is profiled, in per cent "
                             "(0.01-100; default 2); the library sets its sampling to stay within it")
    inject.add_argument("workload", nargs=argparse.REMAINDER, help="the command to run")
    parser.commands = {"run": run, "config": show, "inject": inject}  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's parser, so the usage shown is that command's (its flags), exit 2
            parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exc:  # argparse exits 2 on unknown flags already; keep --help / --version at 0
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return config.EXIT_CONFIG_ERROR
    if args.command == "inject":
        from otel_gpu.cuda.inject import run_injected

        return run_injected(args.workload, overhead_budget=args.overhead_budget)
    try:
        cfg = config.load(args)
    except config.ConfigError as exc:
        print("otel-gpu: bad configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return config.EXIT_CONFIG_ERROR
    if args.command == "config":
        for warning in cfg.warnings:
            print(f"otel-gpu: warning: {warning}", file=sys.stderr)
        sys.stdout.write(config.effective_yaml(cfg))
        return 0

    from otel_gpu import _log, procfs
    from otel_gpu.agent import Agent
    from otel_gpu.selfcost import tune_heap

    tune_heap()  # before the sources allocate: large buffers freed go back to the kernel
    _log.configure(cfg.log_level)
    for handler in logging.getLogger().handlers:  # a URL's token can reach any line, an exception's text included
        handler.addFilter(config.RedactingFilter())
    for warning in cfg.warnings:
        logging.getLogger("otel_gpu.config").warning("%s", warning)
    try:
        # --duration counts from the process's start: start-up is part of the time asked for
        return Agent(cfg, started_monotonic=time.monotonic() - procfs.process_age_s()).run()
    except KeyboardInterrupt:
        return 0
    except Exception:  # the one boundary where anything unexpected becomes exit code 1 with a traceback
        logging.getLogger("otel_gpu").exception("the agent failed")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
