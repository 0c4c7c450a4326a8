"""cost_models.profiled_costs: interpolation on a hand-built database, a small real measurement,
and `plan profile` writing a database that a later `plan --profile` prices with."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cost_models.comm import COLLECTIVE_KINDS
from cost_models.compute import dtype_key, tensor_bytes
from runtime.measure import byte_sizes, matmul_shapes, measure_profile
from cost_models.profiled_costs import MatmulSample, ProfileDatabase, ProfileSettings
from passes.dtensor_rules import Collective, fake_mesh, parse_placements
from passes.strategies import node_flops, shard_factor, tensor_inputs
from passes.trace import trace
from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.search.move_prices import CommModel
from planner.models.sources import load_model
from planner.vocabulary.plan import Plan

# Square matmuls of 2 n^3 FLOPs: 2e6 FLOPs in 1e-5 s (200 GFLOP/s), 2e9 in 1e-2 s.
MATMUL = [(100, 1e-5), (1000, 1e-2)]
MEMORY = [(1e4, 2e-6), (1e6, 1e-4)]
ALL_REDUCE = [(4096.0, 2e-4), (4 * 4096.0, 3e-4), (1 << 20, 2e-3)]


def _database(**fields) -> ProfileDatabase:
    base = dict(
        device="cpu", backend="gloo", torch_version="2.13", created="2026-01-01T00:00:00",
        matmul=[MatmulSample(m=n, k=n, n=n, dtype="fp32", seconds=s) for n, s in MATMUL],
        memory=MEMORY,
        collectives={"all_reduce": {2: ALL_REDUCE}},
    )
    return ProfileDatabase(**(base | fields))


def test_times_are_exact_at_measured_points() -> None:
    db = _database()
    for n, seconds in MATMUL:
        assert db.op_time(2 * n**3, 0) == pytest.approx(seconds)
    for nbytes, seconds in MEMORY:
        assert db.op_time(0, nbytes) == pytest.approx(seconds)
    for nbytes, seconds in ALL_REDUCE:
        assert db.collective_time("all_reduce", nbytes, 2) == pytest.approx(seconds)


def test_interpolation_is_linear_in_log_log() -> None:
    db = _database()
    # Halfway in log(size) is the geometric mean in time.
    assert db.op_time(math.sqrt(2e6 * 2e9), 0) == pytest.approx(math.sqrt(1e-5 * 1e-2))
    assert db.op_time(0, 1e5) == pytest.approx(math.sqrt(2e-6 * 1e-4))
    assert db.collective_time("all_reduce", 8192, 2) == pytest.approx(math.sqrt(2e-4 * 3e-4))


def test_extrapolation_keeps_end_rates_and_latency_floors() -> None:
    db = _database()
    # Above the range: the largest measurement's rate.
    assert db.op_time(2e10, 0) == pytest.approx(1e-1)
    assert db.op_time(0, 1e7) == pytest.approx(1e-3)
    assert db.collective_time("all_reduce", 1 << 22, 2) == pytest.approx(8e-3)
    # Below: a matmul keeps its rate; an elementwise op and a collective cost at least
    # the smallest measurement (their fixed launch or latency cost).
    assert db.op_time(2e3, 0) == pytest.approx(1e-8)
    assert db.op_time(0, 10) == pytest.approx(2e-6)
    assert db.collective_time("all_reduce", 4, 2) == pytest.approx(2e-4)
    assert db.collective_time("all_reduce", 0, 2) == pytest.approx(2e-4)
    assert db.op_time(0, 0) == 0.0


def test_op_time_is_the_slower_of_compute_and_memory() -> None:
    db = _database()
    assert db.op_time(2e9, 1e4) == pytest.approx(1e-2)  # compute bound
    assert db.op_time(2e6, 1e6) == pytest.approx(1e-4)  # memory bound
    with pytest.raises(ValueError, match="must be >= 0"):
        db.op_time(-1, 0)


def test_noise_and_shapes_never_make_more_work_faster() -> None:
    matmul = [
        MatmulSample(m=100, k=100, n=100, dtype="fp32", seconds=1e-5),
        # The same FLOPs, skinny and slower: the square (fastest) time counts.
        MatmulSample(m=800, k=100, n=12, dtype="fp32", seconds=5e-5),
        # A noisy small measurement slower than a larger one is lowered to it.
        MatmulSample(m=50, k=50, n=50, dtype="fp32", seconds=2e-5),
        MatmulSample(m=100, k=100, n=100, dtype="bf16", seconds=5e-6),
    ]
    db = _database(matmul=matmul)
    assert db.op_time(2e6, 0) == pytest.approx(1e-5)
    assert db.op_time(2.5e5, 0) == pytest.approx(1e-5)
    # bf16 has its own curve; a dtype with none uses fp32's.
    assert db.op_time(2e6, 0, "bf16") == pytest.approx(5e-6)
    assert db.op_time(2e6, 0, "fp8") == pytest.approx(1e-5)


def test_unmeasured_collectives_fall_back_to_none() -> None:
    db = _database()
    assert db.collective_time("all_reduce", 4096, 4) is None
    assert db.collective_time("all_gather", 4096, 2) is None
    with pytest.raises(ValueError, match="Unknown collective kind 'allreduce'"):
        db.collective_time("allreduce", 4096, 2)


def test_comm_model_charges_measured_times_on_measured_groups() -> None:
    db = _database()
    cluster = Cluster.load("cpu")
    analytical = CommModel(fake_mesh((2, 2)), cluster)
    profiled = CommModel(fake_mesh((2, 2)), cluster, db)
    row = Collective("all_reduce", (1,), 8192)
    assert profiled.time(row) == pytest.approx(db.collective_time("all_reduce", 8192, 2))
    # A bucketed all-reduce shares one latency: charged beyond the smallest message's time.
    assert profiled.time(row, latency_shared=True) == pytest.approx(
        db.collective_time("all_reduce", 8192, 2) - 2e-4
    )
    # Four ranks, or another kind, were not measured: the analytical model prices them.
    whole = Collective("all_reduce", (0, 1), 8192)
    assert profiled.time(whole) == analytical.time(whole)
    gather = Collective("all_gather", (1,), 8192)
    assert profiled.time(gather) == analytical.time(gather)


def test_save_load_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    db = _database()
    assert db.cost_source == "profile:unsaved"
    db.save(path)
    loaded = ProfileDatabase.load(path)
    assert loaded == db and loaded.cost_source == f"profile:{path}"
    with pytest.raises(ValueError, match="does not exist; measure one with `plan profile"):
        ProfileDatabase.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(ValueError, match="is not a valid profile .*measure it again"):
        ProfileDatabase.load(tmp_path / "bad.json")


def test_sizes_and_shapes() -> None:
    assert byte_sizes(4096, 16 << 20) == [4096 * 4**i for i in range(7)]
    assert byte_sizes(4096, 20000) == [4096, 16384, 20000]
    assert matmul_shapes(64) == [(32, 32, 32), (256, 32, 4), (64, 64, 64), (512, 64, 8)]


SMALL = ProfileSettings(ranks=[2], min_bytes=4096, max_bytes=16384, max_dim=64, repetitions=2)


def test_a_small_measurement_gives_a_loadable_database(tmp_path: Path) -> None:
    calls = []
    db = measure_profile(SMALL, lambda what, done, total: calls.append((what, done, total)))
    assert calls[-1] == ("done", calls[-1][2], calls[-1][2]) and len(calls) > 5
    assert db.device == "cpu" and db.backend == "gloo"
    assert sorted(db.collectives) == sorted(COLLECTIVE_KINDS)
    assert all(len(db.collectives[k][2]) == 2 for k in COLLECTIVE_KINDS)
    assert len(db.matmul) == 4 and len(db.memory) == 2
    assert db.op_time(2 * 64**3, 0) > 0 and db.collective_time("send_recv", 4096, 2) > 0
    db.save(tmp_path / "db.json")
    assert ProfileDatabase.load(tmp_path / "db.json") == db


def _plan(tmp_path: Path, name: str, *extra: str) -> Plan:
    path = tmp_path / f"{name}.json"
    assert cli.main(["demo:mlp", "--mesh", "2", "--json", str(path), *extra]) == 0
    return Plan.from_json(path)


def _profiled_compute(plan: Plan, db: ProfileDatabase) -> float:
    """The plan's compute time recomputed from the database: each node's FLOPs and bytes,
    split as the placement the op computes (a partial sum, or else its output) splits them."""
    loaded = load_model("demo:mlp")
    program = trace(loaded.model, loaded.example_inputs, loaded.loss_fn)
    mesh = fake_mesh(tuple(plan.mesh_shape))
    total = 0.0
    for name, sharding in plan.operators.nodes.items():
        node = program.nodes[name]
        value = node.meta["val"]
        inputs = tensor_inputs(node)
        traffic = tensor_bytes(value) + sum(tensor_bytes(a.meta["val"]) for a in inputs)
        out = sharding.produced or sharding.outputs[0]
        split = shard_factor(parse_placements(out) if out else None, mesh)
        first = value[0] if isinstance(value, (tuple, list)) else value
        total += db.op_time(node_flops(node) / split, traffic / split, dtype_key(first.dtype))
    return total


def test_plan_profile_writes_a_database_that_plan_uses(tmp_path: Path) -> None:
    db_path = str(tmp_path / "profile.json")
    settings = ["--ranks", "2", "--max-bytes", "16KiB", "--max-dim", "64", "--repetitions", "2"]
    assert cli.main(["profile", "--output", db_path, *settings]) == 0
    db = ProfileDatabase.load(db_path)

    profiled = _plan(tmp_path, "profiled", "--profile", db_path)
    analytical = _plan(tmp_path, "analytical")
    assert profiled.cost_source == f"profile:{db_path}"
    assert analytical.cost_source == "analytical"
    assert profiled.predicted.compute_s != pytest.approx(analytical.predicted.compute_s)
    assert profiled.predicted.compute_s == pytest.approx(_profiled_compute(profiled, db))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["profile", "--max-bytes", "16XB"], "--max-bytes '16XB' is not a size"),
        (["profile", "--ranks", "1"], "--ranks 1: each group size must be from 2 to 64"),
        (["profile", "--ranks", "2;4"], "--ranks '2;4' is not a list of group sizes"),
        (["profile", "--min-bytes", "1MiB", "--max-bytes", "64KiB"], "raise --max-bytes"),
        (["profile", "--output", "/no/such/dir/p.json"], "folder '/no/such/dir' does not exist"),
        (["demo:mlp", "--profile", "/no/such.json"], "'/no/such.json' does not exist"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().out.replace("\n", "")


# --- Garbage refused (issue 10, family 6): bad databases and settings, named. ---


def _saved(tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "profile.json"
    _database().save(path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    "edit, entry",
    [
        (lambda d: d["memory"][0].__setitem__(1, "Infinity"), "memory[0] seconds: Input should "
         "be a finite number, got inf"),
        (lambda d: d["memory"][1].__setitem__(1, "NaN"), "memory[1] seconds: Input should be a "
         "finite number, got nan"),
        (lambda d: d["memory"][0].__setitem__(1, 0), "memory[0] seconds: Input should be "
         "greater than 0, got 0"),
        (lambda d: d["memory"][0].__setitem__(0, -4096), "memory[0] bytes: Input should be "
         "greater than 0, got -4096"),
        (lambda d: d["matmul"][1].__setitem__("seconds", "1e999"), "matmul[1].seconds: Input "
         "should be a finite number, got inf"),
        (lambda d: d["matmul"][0].__setitem__("seconds", -1e-5), "matmul[0].seconds: Input "
         "should be greater than 0, got -1e-05"),
        (lambda d: d["matmul"][0].__setitem__("m", 0), "matmul[0].m: Input should be greater "
         "than 0, got 0"),
        (lambda d: d["collectives"]["all_reduce"]["2"][2].__setitem__(1, "-Infinity"),
         "collectives.all_reduce.2[2] seconds: Input should be a finite number, got -inf"),
        (lambda d: d["collectives"]["all_reduce"]["2"][0].__setitem__(0, 0),
         "collectives.all_reduce.2[0] bytes: Input should be greater than 0, got 0"),
        (lambda d: d["settings"].__setitem__("repetitions", 0), "settings.repetitions: must be "
         "from 1 to 1000"),
        (lambda d: d.__setitem__("version", 7), "version: version 7 is not one this Tessel "
         "reads (1)"),
    ],
)
def test_bad_entries_are_named_with_their_value(tmp_path: Path, edit, entry: str) -> None:
    path, data = _saved(tmp_path)
    edit(data)
    # json.dumps cannot write Infinity or 1e999 from Python floats here: keep them literal.
    text = json.dumps(data)
    for literal in ("Infinity", "-Infinity", "NaN", "1e999"):
        text = text.replace(f'"{literal}"', literal)
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        ProfileDatabase.load(path)
    message = str(error.value)
    assert message.startswith(f"Profile database {str(path)!r} is not a valid profile (")
    assert entry in message
    assert message.endswith(f"measure it again with `plan profile --output {path}`.")
    assert "\n" not in message


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "is not JSON (EOF while parsing a value at line 1 column 0)"),
        (b"matmul: []", "is not JSON ("),
        (b"\xff\xfe\x00", "is not JSON ("),
        (b"[1, 2]", "is not a profile database: it holds a JSON array, not an object"),
        (b'"profile"', "is not a profile database: it holds a JSON string, not an object"),
        (b"{}", "is not a profile database (it has none of the keys device, backend"),
        # Another of Tessel's files (a cluster, a plan) is not a profile either.
        (b'{"name": "x", "devices_per_node": 8}', "is not a profile database (it has none"),
        (b'{"device": "cpu"}', "is not a valid profile (it lacks backend, torch_version, "
         "created, matmul, memory)"),
    ],
)
def test_a_file_that_is_not_a_profile_is_one_sentence(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        ProfileDatabase.load(path)
    message = str(error.value)
    assert message.startswith(f"Profile database {str(path)!r} {problem}")
    assert "\n" not in message


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("ranks", [1, 2], "each group size must be from 2 to 64"),
        ("ranks", [2, 65], "each group size must be from 2 to 64"),
        ("ranks", [0], "each group size must be from 2 to 64"),
        ("repetitions", 0, "must be from 1 to 1000"),
        ("repetitions", -5, "must be from 1 to 1000"),
        ("repetitions", 1001, "must be from 1 to 1000"),
        ("threads", 0, "must be from 1 to 1024"),
        ("threads", 1 << 20, "must be from 1 to 1024"),
        ("max_dim", 16, "must be from 32 to 16384"),
        ("max_dim", 1 << 20, "must be from 32 to 16384"),
        ("min_bytes", 0, "must be from 64 B to 16 GiB"),
        ("max_bytes", -1, "must be from 64 B to 16 GiB"),
        ("max_bytes", 1 << 40, "must be from 64 B to 16 GiB"),
        ("max_tensor_bytes", 1 << 40, "must be from 64 B to 16 GiB"),
    ],
)
def test_settings_are_bounded(field: str, value, message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as error:
        ProfileSettings(**{field: value})
    first = error.value.errors()[0]
    assert first["loc"][0] == field and message in first["msg"]


def test_settings_at_their_bounds_are_kept() -> None:
    from cost_models.profiled_costs import MAX_BYTES, MAX_DIM, MAX_RANKS

    settings = ProfileSettings(ranks=[2, MAX_RANKS], repetitions=1000, threads=1024,
                               max_dim=MAX_DIM, min_bytes=64, max_bytes=MAX_BYTES,
                               max_tensor_bytes=MAX_BYTES)
    assert settings.ranks == [2, 64] and settings.max_dim == 16384
    # No collectives at all is a choice, not garbage: matmuls and elementwise ops only.
    assert ProfileSettings(ranks=[]).ranks == []


def test_min_bytes_above_max_tensor_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="raise max_tensor_bytes or lower min_bytes"):
        ProfileSettings(min_bytes=1 << 20, max_tensor_bytes=1 << 16)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--ranks", "2,100"], "--ranks 2,100: each group size must be from 2 to 64."),
        (["--ranks", "0"], "--ranks 0: each group size must be from 2 to 64."),
        (["--repetitions", "0"], "--repetitions 0: must be from 1 to 1000."),
        (["--repetitions", "-3"], "--repetitions -3: must be from 1 to 1000."),
        (["--repetitions", "99999999"], "--repetitions 99999999: must be from 1 to 1000."),
        (["--threads", "0"], "--threads 0: must be from 1 to 1024."),
        (["--threads", "100000"], "--threads 100000: must be from 1 to 1024."),
        (["--max-dim", "0"], "--max-dim 0: must be from 32 to 16384."),
        (["--max-dim", "1000000"], "--max-dim 1000000: must be from 32 to 16384."),
        (["--min-bytes", "0"], "--min-bytes 0: must be from 64 B to 16 GiB."),
        (["--max-bytes", "64GiB"], "--max-bytes 64GiB: must be from 64 B to 16 GiB."),
        (["--max-tensor-bytes", "1000G"], "--max-tensor-bytes 1000G: must be from 64 B"),
        (["--min-bytes", "1MiB", "--max-tensor-bytes", "64KiB"],
         "--min-bytes (1 MiB) is larger than --max-tensor-bytes (64 KiB); raise "
         "--max-tensor-bytes or lower --min-bytes."),
    ],
)
def test_plan_profile_bounds_exit_2_in_one_line(
    flags: list[str], message: str, one_line_error, tmp_path, monkeypatch
) -> None:
    # Refused before anything is measured: the run would otherwise take seconds at least.
    import runtime.measure

    monkeypatch.setattr(runtime.measure, "measure_profile",
                        lambda *a: pytest.fail("measured"))
    output = one_line_error(["profile", "--output", str(tmp_path / "p.json"), *flags])
    assert message in output


def test_plan_with_a_garbage_profile_exits_2_in_one_line(
    tmp_path: Path, one_line_error
) -> None:
    path, data = _saved(tmp_path)
    data["memory"][0][1] = "Infinity"
    path.write_text(json.dumps(data).replace('"Infinity"', "Infinity"))
    output = one_line_error(["demo:mlp", "--mesh", "2", "--profile", str(path)])
    assert "memory[0] seconds" in output and "finite" in output
