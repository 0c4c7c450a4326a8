"""GPU counts that do not fill a scale-up domain plan (issue 13).

A GB200 NVL72 rack is one 72-GPU NVLink domain of eighteen 4-GPU hosts (compute trays);
a job takes whole hosts, so 256 GB200s are 3 racks and 40 GPUs of a fourth. Ranks are
numbered domain-major: the domains are [0, 72), [72, 144), [144, 216) and [216, 256).
"""

from __future__ import annotations

import shlex

import pytest
import yaml
from torch.distributed.run import get_args_parser

from cost_models.comm import (
    all_to_all_across_time,
    collective_time,
    effective_link,
    group_collective_time,
    tree_all_reduce_time,
)
from planner.vocabulary.parallel import FixedKnobs
from planner import cli
from planner.vocabulary.cluster import Cluster, _fewest_members_per_domain
from planner.export.torchrun import devices_per_host, torchrun_command
from planner.search.knobs import check_knobs
from planner.models.presets import get_preset
from planner.vocabulary.parallel import ParallelConfig
from planner.search.megatron_space import tensor_degrees
from planner.plans.transformer_plan import training_plan

MB = 2**20


@pytest.fixture(scope="module")
def gb200_256() -> Cluster:
    return Cluster.load("gb200-nvl72").with_devices(256)


# ------------------------------------------------------------------ sizes and refusals


def test_a_gb200_rack_is_eighteen_hosts_of_four() -> None:
    rack = Cluster.load("gb200-nvl72")
    assert (rack.devices_per_node, rack.devices_per_host, rack.num_hosts) == (72, 4, 18)


def test_256_gb200s_are_three_racks_and_part_of_a_fourth(gb200_256: Cluster) -> None:
    assert gb200_256.num_devices == 256
    assert (gb200_256.num_nodes, gb200_256.num_hosts) == (4, 64)
    # Part of a rack past the first, and part of the only rack, plan too.
    assert Cluster.load("gb200-nvl72").with_devices(100).num_nodes == 2
    assert Cluster.load("gb200-nvl72").with_devices(36).num_hosts == 9


@pytest.mark.parametrize("gpus", [258, 6, 75])
def test_a_part_filled_host_is_refused_naming_the_host(gpus: int) -> None:
    with pytest.raises(ValueError) as err:
        Cluster.load("gb200-nvl72").with_devices(gpus)
    message = str(err.value)
    assert f"{gpus} devices would leave a host part-filled" in message
    assert "use a multiple of 4" in message and "72 per scale-up domain" in message


def test_a_dgx_node_is_one_host_and_still_refuses_12() -> None:
    dgx = Cluster.load("dgx-h100")
    assert dgx.devices_per_host == dgx.devices_per_node == 8
    with pytest.raises(ValueError, match="8 devices per node.*use a multiple of 8"):
        dgx.with_devices(12)
    assert dgx.with_devices(4).num_hosts == 1


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["gpt3-125m", "--cluster", "dgx-h100", "--gpus", "12", "--global-batch-size", "64"],
         ["--gpus 12", "use a multiple of 8"]),
        (["llama3-405b", "--cluster", "gb200-nvl72", "--gpus", "258",
          "--global-batch-size", "512"], ["--gpus 258", "use a multiple of 4"]),
    ],
)
def test_the_cli_names_the_flag_and_the_host(argv, fragments, capsys) -> None:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    for fragment in fragments:
        assert fragment in text


def test_a_cluster_file_without_hosts_keeps_one_host_per_domain(tmp_path) -> None:
    data = Cluster.load("dgx-a100-80g").model_dump()
    del data["devices_per_host"]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    assert Cluster.load(str(path)).devices_per_host == 8


def test_a_host_must_divide_the_domain(tmp_path) -> None:
    data = Cluster.load("gb200-nvl72").model_dump() | {"devices_per_host": 5, "num_devices": 70}
    path = tmp_path / "fives.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="devices_per_host 5 must divide devices_per_node 72"):
        Cluster.load(str(path))


# --------------------------------------------------------------- communication pricing


def test_a_block_crossing_into_the_part_filled_rack_pays_the_scale_out_link(
    gb200_256: Cluster,
) -> None:
    # 64 consecutive ranks: the block [192, 256) has 24 ranks in rack 3 and 40 in rack 4,
    # and the block [64, 128) only 8 in rack 1: that group is the slowest.
    assert gb200_256.spans_domains(group_stride=1, group_size=64)
    assert gb200_256.link_for_group(1, 64) == gb200_256.inter_node
    assert gb200_256.ranks_per_domain(1, 64) == 8
    link = effective_link(gb200_256, 1, 64)
    efficiency = gb200_256.device.efficiency
    scale_out = gb200_256.inter_node.bandwidth_gbs
    assert link.bandwidth_gbs == scale_out * efficiency.inter_node_bandwidth
    overhead = efficiency.collective_overhead_us * 1e-6 * 6  # log2(64) barrier steps
    assert group_collective_time("all_to_all", 64 * MB, 64, 1, gb200_256) == pytest.approx(
        overhead + all_to_all_across_time(64 * MB, 64, 8, link))
    # A ring: 8 network links carry the slowest group's crossing.
    rings = link.model_copy(update={"bandwidth_gbs": 8 * link.bandwidth_gbs})
    assert group_collective_time("all_gather", 64 * MB, 64, 1, gb200_256) == pytest.approx(
        overhead + collective_time("all_gather", 64 * MB, 64, rings))


def test_the_part_filled_rack_holds_the_fewest_members(gb200_256: Cluster) -> None:
    # One rank in 8 over all 256: 9 in each full rack, only 5 in the 40 GPUs of the fourth.
    assert gb200_256.ranks_per_domain(group_stride=8, group_size=32) == 5
    four_racks = Cluster.load("gb200-nvl72").with_devices(288)
    assert four_racks.ranks_per_domain(group_stride=8, group_size=36) == 9
    link = effective_link(gb200_256, 8, 32)
    rings = link.model_copy(update={"bandwidth_gbs": 5 * link.bandwidth_gbs})
    overhead = gb200_256.device.efficiency.collective_overhead_us * 1e-6 * 5
    expected = overhead + min(collective_time("all_reduce", 512 * MB, 32, rings),
                              tree_all_reduce_time(512 * MB, 32, rings))
    assert group_collective_time("all_reduce", 512 * MB, 32, 8, gb200_256) == pytest.approx(
        expected)


def test_groups_inside_a_domain_stay_on_nvlink(gb200_256: Cluster) -> None:
    # Tensor groups of 8 tile every rack, the part-filled one too (40 = 5 x 8).
    assert not gb200_256.spans_domains(group_stride=1, group_size=8)
    assert gb200_256.link_for_group(1, 8) == gb200_256.intra_node
    assert gb200_256.ranks_per_domain(1, 8) == 8


def _brute_fewest(devices: int, per_domain: int, stride: int, size: int) -> int:
    """Every group of every block, every domain it touches, counted."""
    fewest, span = size, stride * size
    for start in range(0, devices, span):
        for offset in range(stride):
            domains: dict[int, int] = {}
            for member in range(start + offset, min(start + span, devices), stride):
                domains[member // per_domain] = domains.get(member // per_domain, 0) + 1
            if len(domains) > 1:
                fewest = min(fewest, *domains.values())
    return fewest


def test_fewest_members_per_domain_counts_every_group() -> None:
    for per_domain in (4, 6, 8, 12):
        for devices in range(per_domain + 1, 3 * per_domain + 1):
            for stride in (s for s in range(1, devices + 1) if devices % s == 0):
                for size in range(2, devices // stride + 1):
                    if devices % (stride * size):
                        continue
                    shape = (devices, per_domain, stride, size)
                    assert _fewest_members_per_domain(*shape) == _brute_fewest(*shape), shape


def test_full_domains_keep_their_old_count() -> None:
    # Where a mesh tiles whole domains (the stride divides a domain and a block is whole
    # domains, or the stride is whole domains), the count is the one before issue 13.
    for per_domain in (8, 72):
        for devices in (per_domain * k for k in (2, 4, 8)):
            for stride in range(1, devices + 1):
                for size in range(2, devices // stride + 1):
                    span = stride * size
                    if devices % span or span <= per_domain:
                        continue
                    if stride % per_domain and (per_domain % stride or span % per_domain):
                        continue
                    old = max(1, min(size, per_domain // stride))
                    assert _fewest_members_per_domain(devices, per_domain, stride, size) == old


# --------------------------------------------------------------------------- the search


def test_tensor_degrees_keep_tensor_groups_in_a_rack(gb200_256: Cluster) -> None:
    gpt3 = get_preset("gpt3-175b")  # 96 heads: powers of two up to 32 divide them
    # 16 and 32 do not divide a 72-GPU rack: their groups would straddle racks.
    assert tensor_degrees(gpt3, gb200_256) == [1, 2, 4, 8]
    # Within one (part-filled) rack every link is NVLink, and they stay.
    assert tensor_degrees(gpt3, Cluster.load("gb200-nvl72").with_devices(64)) == [
        1, 2, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="the 72 GPUs of an NVLink domain"):
        check_knobs(FixedKnobs({"tensor": 16}), gpt3, gb200_256, 1024, "megatron")


@pytest.mark.timeout(120)
def test_llama3_405b_plans_on_256_gb200s(capsys) -> None:
    # NeMo's Llama 3 405B recipe runs on 256 GB200s, tensor-parallel 8 (fixed here to keep
    # the search short); the zoo's analytic search plans it.
    argv = ["llama3-405b", "--cluster", "gb200-nvl72", "--gpus", "256",
            "--global-batch-size", "512", "--tensor-model-parallel-size", "8"]
    assert cli.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "llama3-405b on 256 x gb200-nvl72" in out
    assert "torchrun --nnodes 64 --nproc-per-node 4 " in out


# ---------------------------------------------------------------------------- launching


def _parsed(command: str):
    words = shlex.split(command.replace("$MASTER_ADDR", "node0"))
    assert words[0] == "torchrun"
    return get_args_parser().parse_args(words[1:])


def test_torchrun_starts_four_processes_on_each_of_64_trays(gb200_256: Cluster) -> None:
    parallel = ParallelConfig.of(tensor=8, pipeline=8, micro_batch_size=1, global_batch_size=512,
                              sequence_parallel=True, recompute="full", zero_stage=1)
    plan = training_plan("llama3-70b", get_preset("llama3-70b"), gb200_256, parallel)
    assert devices_per_host(plan) == 4
    command = torchrun_command(plan)
    assert "--nnodes 64 --nproc-per-node 4 " in command
    args = _parsed(command)
    assert (args.nnodes, args.nproc_per_node) == ("64", "4")



def test_slurm_segments_keep_a_group_of_32_on_one_rack(gb200_256: Cluster) -> None:
    # Filled in order, the third group of 32 (ranks 64-95) straddles racks 0 and 1; in
    # segments of 16 trays (Slurm's --segment 16) each rack holds 64 and no group straddles.
    assert gb200_256.spans_domains(group_stride=1, group_size=32)
    segmented = Cluster.load("gb200-nvl72").with_segments(16).with_devices(256)
    assert (segmented.devices_per_node, segmented.num_nodes) == (64, 4)
    assert not segmented.spans_domains(group_stride=1, group_size=32)
    with pytest.raises(ValueError, match="more than the 72 of one gb200-nvl72 scale-up domain; "
                       "use at most 18 hosts"):
        Cluster.load("gb200-nvl72").with_segments(19)


def test_a_segment_larger_than_a_rack_is_one_line_naming_the_flag(capsys) -> None:
    argv = ["llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "256",
            "--global-batch-size", "512", "--segment", "19"]
    assert cli.main(argv) == 2
    said = capsys.readouterr()
    text = (said.out + said.err).strip()
    assert text.startswith("error: --segment 19: a segment of 19 hosts is 76 devices")
