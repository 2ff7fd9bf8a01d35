"""The ``fedapp`` command line: inspect the model space before running anything.

Every subcommand is a function ``run(args) -> Output`` registered with ``@command(...)`` together
with a function that declares its arguments; ``main`` builds the argparse tree from the registry
(multi-word names such as ``("cache", "build")`` become nested subcommands), prints text or, with
``--json``, the same facts as JSON, and turns bad input into a one-line error with exit code 2.
To add a subcommand, register it the same way in this module or in one imported by it.

Only the subcommand on the command line declares its arguments, and a subcommand that needs
Flower or torch imports them inside its functions: ``fedapp --help`` and the model-space
subcommands then import neither (seconds on a board; ``compare`` also needs the simulation extra).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedapp.data.extras import MissingExtraError
from fedapp.models.arch import CACHES_DIR, SupernetConfig, load_supernet, parse_arch
from fedapp.models.cache import (
    Segment,
    VariantCache,
    build_cache,
    import_cache,
    load_cache,
    resolve_cache_path,
    save_cache,
)
from fedapp.models.counter import count
from fedapp.models.ga import GAParams
from fedapp.tools.device_speed import PROFILE_HELP
from fedapp.tools.device_speed import add_arguments as add_profile_arguments
from fedapp.tools.device_speed import profile as profile_device

EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Output:
    """What a subcommand found: a JSON-able mapping and its human-readable rendering."""

    data: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Subcommand:
    path: tuple[str, ...]
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Output]


REGISTRY: list[Subcommand] = []


def command(
    *path: str, help: str, configure: Callable[[argparse.ArgumentParser], None]
) -> Callable[[Callable[[argparse.Namespace], Output]], Callable[[argparse.Namespace], Output]]:
    """Register ``run`` as the subcommand ``fedapp <path...>``."""

    def register(
        run: Callable[[argparse.Namespace], Output],
    ) -> Callable[[argparse.Namespace], Output]:
        REGISTRY.append(Subcommand(tuple(path), help, configure, run))
        return run

    return register


# ---- shared argument helpers -------------------------------------------------------------------

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_macs(text: str) -> float:
    """A MAC count such as ``228846432``, ``25e6``, ``228.8M`` or ``1.5G``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmg]?)\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"not a MAC count: {text!r} (e.g. 25e6, 228.8M, 1.5G)")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


DEFAULT_SUPERNET = "feast-cifar100"


def _supernet_args(parser: argparse.ArgumentParser, cache_option: bool = False) -> None:
    parser.add_argument(
        "--supernet",
        help=f"name in conf/supernets or a YAML path (default: {DEFAULT_SUPERNET}"
        + (", or the supernet the cache names)" if cache_option else ")"),
    )
    parser.add_argument("--classes", type=int, help="override the number of classes")
    parser.add_argument("--image-size", type=int, help="override the input size (pixels)")
    parser.add_argument("--in-channels", type=int, help="override the input channels")
    if cache_option:
        parser.add_argument(
            "--cache", help="cache name in conf/caches or a YAML path (default: the supernet's)"
        )


def _overrides(args: argparse.Namespace) -> dict[str, int]:
    pairs = (
        ("num_classes", args.classes),
        ("image_size", args.image_size),
        ("in_channels", args.in_channels),
    )
    return {key: value for key, value in pairs if value is not None}


def _supernet(args: argparse.Namespace) -> SupernetConfig:
    return load_supernet(args.supernet or DEFAULT_SUPERNET, **_overrides(args))


def _cache(args: argparse.Namespace, required: bool) -> VariantCache | None:
    """``--cache`` counted on ``--supernet`` if given, else on the supernet the cache names;
    without ``--cache``, the cache named like the supernet (``conf/caches/<supernet>.yaml``)."""
    if args.cache:
        if args.supernet:
            return load_cache(args.cache, _supernet(args))
        return load_cache(args.cache, **_overrides(args))
    config = _supernet(args)
    default = CACHES_DIR / f"{config.name}.yaml"
    if default.is_file():
        return load_cache(default, config)
    if required:
        raise ValueError(f"no cache for {config.name}: pass --cache")
    return None


def _millions(n: float) -> str:
    return f"{n / 1e6:,.2f}M"


# ---- model-space subcommands --------------------------------------------------------------------


@command(
    "supernet",
    help="size of a supernet and MAC range of its cache",
    configure=lambda p: _supernet_args(p, cache_option=True),
)
def supernet_command(args: argparse.Namespace) -> Output:
    cache = _cache(args, required=False)
    config = _supernet(args) if cache is None else cache.config
    full = count(config, config.max_arch())
    data: dict[str, Any] = {
        "supernet": config.name,
        "classes": config.num_classes,
        "input": [config.in_channels, config.image_size, config.image_size],
        "params": full.params,
        "macs": full.macs,
        "depth_choices": list(range(config.max_extra_blocks + 1)),
        "expand_ratios": list(config.expand_ratios),
        "width_multipliers": list(config.width_multipliers),
        "cache": None,
    }
    lines = [
        f"supernet     {config.name} ({config.description})"
        if config.description
        else f"supernet     {config.name}",
        f"input        {config.in_channels}x{config.image_size}x{config.image_size}, "
        f"{config.num_classes} classes",
        f"parameters   {full.params:,} ({_millions(full.params)})",
        f"MACs (full)  {full.macs:,}",
        f"choices      d 0..{config.max_extra_blocks}, "
        f"e {', '.join(f'{x:g}' for x in config.expand_ratios)}, "
        f"w {', '.join(f'{x:g}' for x in config.width_multipliers)}",
    ]
    if cache is not None:
        data["cache"] = {
            "variants": len(cache),
            "min_macs": cache.min_macs,
            "max_macs": cache.max_macs,
        }
        lines.append(
            f"cache        {len(cache)} variants, {cache.min_macs:,} - {cache.max_macs:,} MACs"
        )
    return Output(data, "\n".join(lines))


def _configure_macs(parser: argparse.ArgumentParser) -> None:
    _supernet_args(parser)
    parser.add_argument(
        "--arch",
        required=True,
        help='architecture, e.g. "d=3,7,6,7 e=0.18,0.18,0.1,0.1 w=2,0,0,0,0"',
    )


@command("macs", help="MACs and parameters of one architecture", configure=_configure_macs)
def macs_command(args: argparse.Namespace) -> Output:
    config = _supernet(args)
    arch = config.validate(parse_arch(args.arch))
    cost = count(config, arch)
    nominal = count(config.nominal(), arch)
    stem, outs, mids = config.channels(arch)
    data = {
        "supernet": config.name,
        "arch": arch.as_dict(),
        "macs": cost.macs,
        "nominal_macs": nominal.macs,
        "params": cost.params,
        "channels": {"stem": stem, "stages": list(outs), "mids": list(mids)},
        "nominal_mids": list(config.nominal().channels(arch)[2]),
    }
    lines = [
        f"arch         {arch}",
        f"MACs         {cost.macs:,} ({_millions(cost.macs)}) as built",
        f"parameters   {cost.params:,} ({_millions(cost.params)})",
        f"channels     stem {stem}, stages {list(outs)}, mids {list(mids)}",
    ]
    if nominal.macs != cost.macs:
        lines.insert(
            2,
            f"nominal      {nominal.macs:,} ({_millions(nominal.macs)}) by the published counter "
            f"(mids {data['nominal_mids']})",
        )
    text = "\n".join(lines)
    return Output(data, text)


def _configure_route(parser: argparse.ArgumentParser) -> None:
    _supernet_args(parser, cache_option=True)
    parser.add_argument("--budget", required=True, type=parse_macs, help="client budget in MACs")


@command(
    "route", help="affordable set and routed envelope for a budget", configure=_configure_route
)
def route_command(args: argparse.Namespace) -> Output:
    from fedapp.models.routing import route  # imports torch: only this command pays for it

    cache = _cache(args, required=True)
    config = cache.config
    r = route(cache, args.budget)
    largest = cache.variants[r.largest]
    data = {
        "supernet": config.name,
        "budget": args.budget,
        "affordable": len(r.affordable),
        "affordable_indices": list(r.affordable),
        "largest": {
            "index": r.largest,
            "macs": largest.macs,
            "nominal_macs": largest.nominal_macs,
            "arch": largest.arch.as_dict(),
        },
        "envelope": {"d": list(r.envelope.d), "w": list(r.envelope.w), "e": list(r.envelope.e)},
        "params": r.params,
    }
    text = "\n".join(
        [
            f"budget       {args.budget:,.0f} MACs",
            f"affordable   {len(r.affordable)} of {len(cache)} variants "
            f"(largest: #{r.largest}, {largest.nominal_macs:,} nominal MACs, "
            f"{largest.macs:,} as built)",
            f"envelope     d={list(r.envelope.d)} w={list(r.envelope.w)} "
            f"(mids at e={r.envelope.e[0]:g})",
            f"parameters   {r.params:,} ({_millions(r.params)})",
        ]
    )
    return Output(data, text)


# ---- cache files -------------------------------------------------------------------------------


def _cache_summary(cache: VariantCache, path: Path) -> dict[str, Any]:
    return {
        "file": str(path),
        "supernet": cache.config.name,
        "classes": cache.config.num_classes,
        "variants": len(cache),
        "min_macs": cache.min_macs,
        "max_macs": cache.max_macs,
        "source": cache.source,
    }


def _configure_cache_build(parser: argparse.ArgumentParser) -> None:
    _supernet_args(parser)
    parser.add_argument(
        "--segment",
        action="append",
        required=True,
        metavar="START:STOP:COUNT:RHO0:SEED",
        help="GA targets linearly spaced in MACs with seeds SEED.. (repeatable), "
        "e.g. 50e6:600e6:50:0.31:42",
    )
    parser.add_argument("--population", type=int, default=256)
    parser.add_argument("--generations", type=int, default=512)
    parser.add_argument("--mutation", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=1, help="parallel processes")
    parser.add_argument("--out", required=True, type=Path, help="cache file to write")


@command(
    "cache", "build", help="build a variant cache with the GA", configure=_configure_cache_build
)
def cache_build_command(args: argparse.Namespace) -> Output:
    config = _supernet(args)
    segments = [Segment.parse(s) for s in args.segment]
    params = GAParams(
        population=args.population, generations=args.generations, mutation=args.mutation
    )
    started = time.perf_counter()
    cache = build_cache(
        config, segments, params, workers=args.workers, supernet_overrides=_overrides(args)
    )
    seconds = time.perf_counter() - started
    path = save_cache(cache, args.out)
    data = {**_cache_summary(cache, path), "seconds": round(seconds, 2)}
    text = (
        f"wrote {path}: {len(cache)} variants, {cache.min_macs:,} - {cache.max_macs:,} MACs "
        f"({cache.source['searches']} searches, {seconds:.1f} s)"
    )
    return Output(data, text)


def _configure_cache_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cache", help="cache name in conf/caches or a YAML path")
    _supernet_args(parser)


@command("cache", "show", help="list the variants of a cache", configure=_configure_cache_show)
def cache_show_command(args: argparse.Namespace) -> Output:
    path = resolve_cache_path(args.cache)
    cache = _cache(args, required=True)
    rows = [
        {
            "index": i,
            "macs": v.macs,
            "nominal_macs": v.nominal_macs,
            "params": v.params,
            **v.arch.as_dict(),
        }
        for i, v in enumerate(cache.variants)
    ]
    lines = [
        f"{path}: {len(cache)} variants of {cache.config.name} ({cache.config.num_classes} "
        f"classes), {cache.min_macs:,} - {cache.max_macs:,} nominal MACs",
        f"{'#':>3} {'MACs built':>13} {'nominal':>13} {'params':>11}  architecture",
    ]
    lines += [
        f"{i:>3} {v.macs:>13,} {v.nominal_macs:>13,} {v.params:>11,}  {v.arch}"
        for i, v in enumerate(cache.variants)
    ]
    return Output({**_cache_summary(cache, path), "rows": rows}, "\n".join(lines))


def _configure_cache_import(parser: argparse.ArgumentParser) -> None:
    _supernet_args(parser)
    parser.add_argument(
        "source", type=Path, help="reference CSV (columns d, e, w_indices) or a cache YAML"
    )
    parser.add_argument("--out", required=True, type=Path, help="cache file to write")


@command(
    "cache",
    "import",
    help="take a reference CSV's or another cache's variants onto a supernet",
    configure=_configure_cache_import,
)
def cache_import_command(args: argparse.Namespace) -> Output:
    config = _supernet(args)
    if not args.source.is_file():
        raise ValueError(f"no such file: {args.source}")
    cache = import_cache(args.source, config, supernet_overrides=_overrides(args))
    path = save_cache(cache, args.out)
    text = (
        f"wrote {path}: {len(cache)} variants, {cache.min_macs:,} - {cache.max_macs:,} MACs "
        f"at {config.num_classes} classes"
    )
    return Output(_cache_summary(cache, path), text)


# ---- budget populations -------------------------------------------------------------------------


def _configure_budgets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-config",
        required=True,
        type=Path,
        help="a run config TOML, e.g. conf/quickstart.toml",
    )
    parser.add_argument(
        "--below",
        action="append",
        type=parse_macs,
        help="also count the clients with a budget below this many MACs (repeatable; "
        "default 35M, ScaleFL's smallest level in the FEAST paper)",
    )


@command(
    "budgets",
    help="a run config's budget population, passes and routed traffic (no training)",
    configure=_configure_budgets,
)
def budgets_command(args: argparse.Namespace) -> Output:
    from fedapp.tools import budget_plan  # imports torch: only this command pays for it

    data = budget_plan.report(budget_plan.load_run_config(args.run_config), args.below or [35e6])
    return Output(data, budget_plan.render(data))


# ---- results -----------------------------------------------------------------------------------


def _configure_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a run's folder, <out-dir>/<run-name>")


@command(
    "show",
    help="a finished run's test accuracy, its 95 percent interval and its operating points",
    configure=_configure_show,
)
def show_command(args: argparse.Namespace) -> Output:
    from fedapp.results import describe, load_run  # pandas and torch: only for this subcommand

    return Output(*describe(load_run(args.run_dir)))


# ---- entry point --------------------------------------------------------------------------------


@command("profile", help=PROFILE_HELP, configure=add_profile_arguments)
def _profile(args: argparse.Namespace) -> Output:
    return Output(*profile_device(args))


def _configure_extract(parser: argparse.ArgumentParser) -> None:
    from fedapp.tools import extraction  # Flower and torch: only for this subcommand

    extraction.add_arguments(parser)


@command(
    "extract",
    help="cut a variant at a new MAC limit from a finished FEAST run, recalibrate, test it",
    configure=_configure_extract,
)
def _extract(args: argparse.Namespace) -> Output:
    from fedapp.tools.extraction import extract

    return Output(*extract(args))


def _configure_export(parser: argparse.ArgumentParser) -> None:
    from fedapp.tools import export  # Flower and torch: only for this subcommand

    export.add_arguments(parser)


@command(
    "export",
    help="write a finished run's operating points as verified ONNX or TorchScript files",
    configure=_configure_export,
)
def _export(args: argparse.Namespace) -> Output:
    from fedapp.tools.export import export

    return Output(*export(args))


def _configure_compare(parser: argparse.ArgumentParser) -> None:
    from fedapp.tools import compare  # Flower and torch; its runs need the simulation extra (Ray)

    compare.add_arguments(parser)


@command(
    "compare",
    help="run several strategies on identical data, budgets and seeds; one table and plot",
    configure=_configure_compare,
)
def _compare(args: argparse.Namespace) -> Output:
    from fedapp.tools import compare

    result = compare.run(args)
    return Output(result, result["report"] + f"\nfiles in {result['out_dir']}")


def _named(path: tuple[str, ...], argv: Sequence[str] | None) -> bool:
    """Whether the command line ``argv`` (None: build every subcommand) names ``path``."""
    return argv is None or tuple(argv[: len(path)]) == path


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argparse tree of every registered subcommand (each also takes ``--json``); given the
    command line ``argv``, only the subcommand it names declares its arguments, so that the
    other subcommands' modules are not imported."""
    parser = argparse.ArgumentParser(prog="fedapp", description=__doc__.splitlines()[0])
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {
        (): parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    }
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for sub in REGISTRY:
        for depth in range(1, len(sub.path)):
            prefix = sub.path[:depth]
            if prefix not in groups:
                parents[prefix] = groups[prefix[:-1]].add_parser(
                    prefix[-1], help=f"{prefix[-1]} files"
                )
                groups[prefix] = parents[prefix].add_subparsers(
                    dest="_".join(prefix), required=True, metavar="COMMAND"
                )
        leaf = groups[sub.path[:-1]].add_parser(sub.path[-1], help=sub.help, description=sub.help)
        if _named(sub.path, argv):
            sub.configure(leaf)
            leaf.add_argument("--json", action="store_true", help="print the result as JSON")
        leaf.set_defaults(run=sub.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; bad input gives a one-line error and exit code 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        out = args.run(args)
    except (ValueError, KeyError, OSError, MissingExtraError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"fedapp: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(out.data, indent=2) if args.json else out.text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
