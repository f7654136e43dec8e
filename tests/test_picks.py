"""Measured GEMV kernel picks (lowbit.kernels.picks, ``lowbit tune --gemv-kernels``): the file format, the user file
laid over the shipped one shape by shape, the margin a pick must win by, and which calls take a pick."""

import json

import pytest
import torch

from lowbit import dispatch
from lowbit.bench import crossover
from lowbit.kernels import picks, tiled


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A shipped and a user crossover file of this test's own; the loaded tables forgotten before and after."""
    shipped, user = tmp_path / "shipped.json", tmp_path / "user.json"
    monkeypatch.setattr(picks, "CROSSOVERS", shipped)
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    picks.reload()
    yield shipped, user
    picks.reload()


def write(path, gpus):
    path.write_text(json.dumps({"version": 1, "gpus": gpus}))


def test_parse_accepts_entries_and_names_a_bad_one():
    entries = [["kbit3", 4096, 4096, "local"], ["kbit4", 28672, 4096, "bulk"], ["nvfp4", 4096, 14336, "tiled"]]
    assert picks.parse(entries, "w") == {("kbit3", 4096, 4096): "local", ("kbit4", 28672, 4096): "bulk",
                                         ("nvfp4", 4096, 14336): "tiled"}
    assert picks.parse([], "w") == {}
    for bad in ([["kbit6", 4096, 4096, "local"]], [["kbit3", 4096, 4112, "local"]], [["kbit3", 0, 4096, "split"]],
                [["kbit3", 4096, 4096, "gemm"]], [["nvfp4", 4096, 4096, "bulk"]], [["kbit3", 4096, 4096, "plain"]],
                [[3, 4096, 4096, "split"]], [["kbit3", True, 4096, "split"]], [["kbit3", 4096, 4096]],
                ["kbit3", 4096, 4096, "split"], {"kbit3": "split"}):
        with pytest.raises(ValueError, match="WHERE"):
            picks.parse(bad, "WHERE")


def test_user_picks_lay_over_the_shipped_ones_shape_by_shape(files):
    shipped, user = files
    write(shipped, {"GPU A": {"gemm_max_m": [[None, 64]], "gemv_kernels": [["kbit3", 4096, 4096, "local"],
                                                                           ["kbit4", 4096, 6144, "bulk"]]}})
    write(user, {"GPU A": {"gemv_kernels": [["kbit3", 4096, 4096, "split"]]}, "GPU B": {"gemv_kernels": []}})
    assert picks.pick("GPU A", "kbit3", 4096, 4096) == "split"  # the user's measurement wins
    assert picks.pick("GPU A", "kbit4", 4096, 6144) == "bulk"  # the shipped one stays where the user measured nothing
    assert picks.pick("GPU A", "kbit2", 4096, 4096) is None and picks.pick("GPU C", "kbit3", 4096, 4096) is None
    assert picks.pick("GPU A", "nvfp4", 4096, 4096) is None
    picks.USE = False
    try:
        assert picks.pick("GPU A", "kbit3", 4096, 4096) is None  # the tuner times the rules' own choice
    finally:
        picks.USE = True


def test_crossover_file_keys_are_each_optional_and_validated(tmp_path):
    p = tmp_path / "c.json"
    write(p, {"G": {"gemv_kernels": [["kbit2", 2048, 2048, "streamk"]]}, "H": {"grouped_gemm_min_rows": 2.0}})
    assert dispatch.load_crossovers(p) == {}  # no gemm_max_m: the GEMM's default crossover
    assert dispatch.load_grouped(p) == {"H": 2.0}
    write(p, {"G": {"gemm_max_m": [[None, 64]], "gemv_kernels": [["kbit2", 2048, 2048, "cublas"]]}})
    with pytest.raises(ValueError, match="gemv_kernels"):
        dispatch.load_crossovers(p)


@pytest.mark.parametrize("times, rules, expected", [
    ({"split": 10.0, "local": 9.0, "bulk": 9.5}, "split", "local"),  # 10% faster
    ({"split": 10.0, "local": 9.9}, "split", None),  # 1%: within the margin
    ({"split": 9.0, "local": 10.0}, "split", None),  # the rules' pick is the fastest
    ({"split": 10.0, "local": float("nan")}, "split", None),  # a NaN time never wins
    ({"local": float("nan"), "split": 10.0}, "split", None),  # wherever it stands
    ({"local": 5.0, "split": float("nan")}, "split", None),  # nor does anything beside a failed rules' time
])
def test_a_pick_must_beat_the_rules_by_the_margin(times, rules, expected):
    assert crossover.gemv_pick(times, rules) == expected


def test_saving_picks_replaces_measured_shapes_and_keeps_the_rest(tmp_path, files):
    _, user = files
    crossover.save(user, "GPU A", [(None, 64)], 1.5)
    crossover.save_gemv_kernels(user, "GPU A", {("kbit3", 4096, 4096): "local", ("kbit4", 4096, 6144): "bulk"})
    assert picks.pick("GPU A", "kbit3", 4096, 4096) == "local"  # saving reloads the table
    crossover.save_gemv_kernels(user, "GPU A", {("kbit3", 4096, 4096): None, ("nvfp4", 2048, 5120): "tiled"})
    entry = json.loads(user.read_text())["gpus"]["GPU A"]
    assert entry["gemv_kernels"] == [["kbit4", 4096, 6144, "bulk"], ["nvfp4", 2048, 5120, "tiled"]]
    assert entry["gemm_max_m"] == [[None, 64]] and entry["grouped_gemm_min_rows"] == 1.5
    assert dispatch.crossover_table()["GPU A"] == [(None, 64)]
    crossover.save_gemv_kernels(user, "GPU B", {("kbit4", 1024, 1024): "local"})  # a GPU with nothing else measured
    assert picks.pick("GPU B", "kbit4", 1024, 1024) == "local" and "GPU B" not in dispatch.crossover_table()
    user.write_text('{"version": 1, "gpus": {"G": {"gemv_kernels": [["kbit9", 1, 1, "x"]]}}}')
    with pytest.raises(ValueError):
        crossover.save_gemv_kernels(user, "GPU A", {("kbit3", 4096, 4096): "local"})  # never extends a broken file


def test_only_plain_one_token_kbit_calls_take_a_pick(monkeypatch):
    monkeypatch.setattr(tiled, "gpu_name", lambda device: "GPU A")
    monkeypatch.setattr(picks, "pick", lambda gpu, fmt, n, k_in: "local" if (gpu, fmt) == ("GPU A", "kbit3") else None)
    assert tiled.plain_pick("cuda:0", 3, 1, 4096, 4096) == "local"
    assert tiled.plain_pick("cuda:0", 4, 1, 4096, 4096) is None  # no entry: the rules
    assert tiled.plain_pick("cuda:0", 3, 2, 4096, 4096) is None  # measured at one token only
    assert tiled.plain_pick("cuda:0", 3, 1, 4096, 4096, tiled.FLAG_ROT32) is None  # rotated weights
    assert tiled.plain_pick("cuda:0", tiled.NVFP4, 1, 4096, 4096) is None
    monkeypatch.setattr(tiled, "DENSE_PATH", "split")
    assert tiled.plain_pick("cuda:0", 3, 1, 4096, 4096) is None  # a forced kernel wins over a pick
    assert tiled.dense_path(None, None, 3, None, 4096, 4096, "local") == "split"
    monkeypatch.setattr(tiled, "DENSE_PATH", "auto")
    assert tiled.dense_path(None, None, 3, None, 4096, 4096, "local") == "local"


def test_nvfp4_picks_choose_between_its_two_gemvs(files, monkeypatch):
    """NVFP4's one-token calls: a measured pick decides plain against tiled, at one row only; elsewhere the rule."""
    shipped, _ = files
    write(shipped, {"GPU A": {"gemv_kernels": [["nvfp4", 14336, 4096, "tiled"], ["nvfp4", 1024, 4096, "plain"]]}})
    monkeypatch.setattr(dispatch, "gpu_name", lambda device: "GPU A")
    dev = torch.device("cuda", 0)
    wins = dispatch.nvfp4_plain_wins
    assert wins(1, 14336, 4096) and not wins(1, 14336, 4096, dev)  # the rule says plain, the pick tiled
    assert not wins(1, 1024, 4096) and wins(1, 1024, 4096, dev)  # the rule says tiled (4M weights), the pick plain
    assert not wins(2, 1024, 4096, dev)  # measured at one row only
    assert wins(1, 8192, 4096, dev) == wins(1, 8192, 4096)  # no entry: the rule


def test_tuner_times_both_nvfp4_gemvs_on_copies_of_the_weight(monkeypatch):
    """``lowbit tune --gemv-kernels``'s NVFP4 calls, built without a GPU: the rules' pick, the checkpoint-layout GEMV
    and the tiled one (through launchers made fresh each time), each over its own copies of the weight."""
    from lowbit.bench import timing

    made = []

    class Launcher:
        def __init__(self, lib, qweight, qscales, codebook, scale_2, fmt, n, k_in):
            made.append((qweight.data_ptr(), fmt.name, n, k_in))

        def __call__(self, x, m, shape):
            raise AssertionError("built, not run")

    monkeypatch.setattr(timing, "l2_bytes", lambda: 4 << 20)  # a 4 MB L2: 7 copies of the 2.4 MB weight
    monkeypatch.setattr(tiled, "GemvLauncher", Launcher)
    w = torch.randn(1024, 4096, dtype=torch.float16)
    rules, calls = crossover._gemv_calls("nvfp4", w, torch.randn(1, 4096, dtype=torch.bfloat16), None, torch.bfloat16)
    assert rules == ("plain" if dispatch.nvfp4_plain_wins(1, 1024, 4096) else "tiled") == "tiled"  # 4M weights
    assert sorted(calls) == ["plain", "tiled"]
    plain, tiled_calls = calls["plain"](), calls["tiled"]()
    assert len(plain) == len(tiled_calls) == len(made) >= 2
    assert len({p for p, *_ in made}) == len(made)  # every launcher on a copy of its own
    assert {m[1:] for m in made} == {("nvfp4", 1024, 4096)}
    calls["tiled"]()
    assert len(made) == 2 * len(plain)  # new launchers each time: their plans follow DENSE_PATH


@pytest.mark.parametrize("bulk_fits", [True, False])
def test_tuner_times_every_kbit_gemv_under_its_own_dense_path(bulk_fits, monkeypatch):
    """The kbit side, built without a GPU: the rules' pick (bulk_ctas, else dense_path, under "auto"), then one set of
    calls per kernel that can take the call (bulk only where its ring fits), each made under that DENSE_PATH."""
    from lowbit.bench import timing

    made = []

    class Launcher:
        def __init__(self, lib, qweight, qabsmax, codebook, scale, fmt, n, k_in):
            made.append((tiled.DENSE_PATH, qweight.data_ptr(), fmt.name, n, k_in))

    def bulk_ctas(lib, dev, bits, dtype, m, n, k_in):
        return 132 if bulk_fits and (tiled.DENSE_PATH == "bulk" or bits == 4) else 0

    monkeypatch.setattr(timing, "l2_bytes", lambda: 4 << 20)
    monkeypatch.setattr(tiled, "GemvLauncher", Launcher)
    monkeypatch.setattr(tiled, "bulk_ctas", bulk_ctas)
    monkeypatch.setattr(tiled, "dense_path", lambda lib, dev, bits, dtype, n, k_in: "split")
    monkeypatch.setattr(tiled, "DENSE_PATH", "auto")
    w, x = torch.randn(1024, 4096, dtype=torch.float16), torch.randn(1, 4096, dtype=torch.bfloat16)
    for fmt, expected_rules in (("kbit4", "bulk" if bulk_fits else "split"), ("kbit3", "split")):
        made.clear()
        rules, calls = crossover._gemv_calls(fmt, w, x, None, torch.bfloat16)
        assert rules == expected_rules
        assert list(calls) == (["bulk"] if bulk_fits else []) + ["split", "local", "streamk"]
        for kernel, make in calls.items():
            before = len(made)
            assert len(make()) == len(made) - before >= 2
            assert {m[0] for m in made[before:]} == {kernel} and {m[2:] for m in made[before:]} == {("kbit", 1024, 4096)}
            assert len({m[1] for m in made[before:]}) == len(made) - before  # a copy each
