"""`plan models` and `plan clusters`: the built-in presets, as tables or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich import box
from rich.table import Table

from planner.cli.console import console
from planner.cli.output import write_json
from planner.vocabulary.evidence import UNCALIBRATED, prediction_band


def add_catalog_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the presets as JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _write_json(path: str | None, rows: Any) -> None:
    if path:
        write_json(path, json.dumps(rows, indent=2), "presets")


def run_models(args: argparse.Namespace) -> int:
    """`plan models`: the built-in model presets with their parameter counts."""
    from planner.models.presets import PRESETS

    table = Table(title="model presets", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for column in ("name", "params", "active", "layers", "hidden", "heads", "kv", "experts"):
        table.add_column(column, justify="left" if column == "name" else "right",
                         no_wrap=True)
    for name, config in PRESETS.items():
        table.add_row(
            name,
            f"{_without_mtp(config) / 1e9:,.2f}",
            f"{config.num_active_parameters() / 1e9:,.2f}" if config.is_moe else "-",
            str(config.num_layers),
            str(config.hidden_size),
            str(config.num_attention_heads),
            "MLA" if config.multi_latent_attention else str(config.num_kv_heads),
            _experts(config),
        )
    console.print(table)
    console.print("params: billions, without multi-token-prediction layers, as model cards "
                  "count them; active: those one token passes through (its top-k routed "
                  "experts); +sh: a shared expert")
    _write_json(args.json, {
        name: {**config.model_dump(), "num_parameters": config.num_parameters(),
               "num_parameters_without_mtp": _without_mtp(config),
               "num_active_parameters": int(config.num_active_parameters())}
        for name, config in PRESETS.items()
    })
    return 0


def _without_mtp(config: Any) -> int:
    return config.model_copy(update={"mtp_num_layers": 0}).num_parameters()


def _experts(config: Any) -> str:
    """'8 top-2', '256+sh top-8' or '-'."""
    if not config.is_moe:
        return "-"
    shared = "+sh" if config.moe_shared_expert_intermediate_size else ""
    return f"{config.num_experts}{shared} top-{config.moe_top_k}"


def _band(device: Any) -> str:
    """The band of a dense Megatron-LM run on a calibrated device: '-5/+5%'."""
    band = prediction_band("megatron", None, device.name, calibrated=True)
    return _span(band.low, band.high)


def _span(low: float, high: float) -> str:
    return f"{(low - 1) * 100:+.0f}/{(high - 1) * 100:+.0f}%"


def _figure(value: float | None) -> str:
    """A datasheet number for people: at most one decimal (15.78125 -> '15.8', 989.5 ->
    '989.5', 2000.0 -> '2000'), two significant figures below 1 (0.390625 -> '0.39');
    None -> '-'. A preset's file holds numbers as computed (16 GB in GiB, 3.125 Gbit/s in
    GB/s), which read as noise in a table; --json keeps them exact."""
    if value is None:
        return "-"
    if abs(value) < 1:
        return f"{value:.2g}"
    return f"{value:.1f}".removesuffix(".0")


def run_clusters(args: argparse.Namespace) -> int:
    """`plan clusters`: the built-in cluster presets with their datasheet numbers."""
    from planner.vocabulary.cluster import Cluster, calibration_of

    table = Table(
        title="cluster presets", box=box.SIMPLE_HEAD, pad_edge=False,
        caption="per node: devices in one scale-up domain. up: scale-up link (NVLink, "
        "Infinity Fabric, RoCE), out: scale-out network; GB/s per GPU per direction. "
        "Datasheet peaks: `description` in each preset names its sources.",
    )
    # Each preset's device under its name, and a light box: the table fits 80 columns.
    columns = ("preset\ndevice", "per\nnode", "memory\nGiB", "HBM\nGB/s", "bf16\nTFLOP/s",
               "fp8\nTFLOP/s", "up\nGB/s", "out\nGB/s")
    for column in columns:
        table.add_column(column, justify="left" if column == columns[0] else "right",
                         no_wrap=True)
    clusters = {name: Cluster.load(name) for name in Cluster.presets()}
    for name, cluster in clusters.items():
        device = cluster.device
        table.add_row(
            f"{name}\n[dim]{device.name}[/dim]",
            str(cluster.devices_per_node),
            _figure(device.memory_gib),
            _figure(device.memory_bandwidth_gbs),
            _figure(device.peak_tflops.get("bf16")),
            _figure(device.peak_tflops.get("fp8")),
            _figure(cluster.intra_node.bandwidth_gbs),
            _figure(cluster.inter_node.bandwidth_gbs),
        )
    console.print(table)
    console.print("sources (each preset's description; the preset file cites every number):")
    for name, cluster in clusters.items():
        console.print(f"  {name}: {' '.join(cluster.description.split())}", highlight=False)
    # Whether each preset's efficiency was fitted and to what; the band of a dense
    # Megatron-LM prediction on it (every kind's: `plan calibration`).
    console.print("calibration (band: measured / predicted step time of a dense Megatron-LM "
                  "run, from the published runs of its GPU generation; `plan calibration`):")
    for name, cluster in clusters.items():
        if cluster.device.calibration is not None:
            console.print(f"  {name} ({_band(cluster.device)}): "
                          f"{calibration_of(cluster.device)}")
    others = [name for name, cluster in clusters.items() if cluster.device.calibration is None]
    console.print(f"  uncalibrated (at least {_span(*UNCALIBRATED)}, typical efficiency): "
                  f"{', '.join(others)}")
    _write_json(args.json, {name: c.model_dump() for name, c in clusters.items()})
    return 0
