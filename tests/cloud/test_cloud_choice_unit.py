"""Any GPU that fits, the pure half: which instance types a launch tries and in what order (`--gpu`, several
`--type`, `--max-price`, a --from template's expect.gpu), the next (type, region), the wait between capacity re-reads,
the line that says what it waits for, and the profile's expect: for the type launched. On the API's own shapes
(GET /instance-types parsed by the client) with the emulator's catalog of Lambda's types and prices."""
from __future__ import annotations

import pytest

from gpuops.cloud import api, decisions as d
from gpuops.cloud.emulator import catalog
from gpuops.errors import ExitCode, GpuopsError, UsageError
from gpuops.verify import gpus


def types_map(capacity: dict, extra: dict | None = None) -> dict:
    """GET /instance-types as Lambda answers it (every catalog type), `capacity`: type -> regions with capacity."""
    data = {t: {"instance_type": catalog.instance_type(t),
                "regions_with_capacity_available": [{"name": r, "description": catalog.REGIONS[r]}
                                                    for r in capacity.get(t, [])]} for t in catalog.TYPES}
    data.update(extra or {})
    return api.TypeAvailability.parse_map(data)


ALL_EAST = {t: ["us-east-1", "us-west-1"] for t in catalog.TYPES}


# -- --gpu NAME[:COUNT] through the GPU table --------------------------------------------------------------------------
def test_gpu_names_cover_every_row_of_that_gpu_and_whole_words_only():
    h100 = d.parse_gpu("H100:8")
    assert h100.count == 8 and set(h100.rows) == {"h100-sxm5", "h100-pcie"}
    assert d.parse_gpu("h100").count == 1  # COUNT defaults to one GPU
    assert d.parse_gpu("H100 SXM:8").rows == ("h100-sxm5",)  # a name of one row: that row
    assert set(d.parse_gpu("A100:8").rows) == {"a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb"}
    assert set(d.parse_gpu("A100 80GB:8").rows) == {"a100-sxm4-80gb", "a100-pcie-80gb"}
    assert d.parse_gpu("A10").rows == ("a10",)  # never the A100s
    assert d.parse_gpu("NVIDIA H200:8").rows == ("h200",)


@pytest.mark.parametrize("bad,words", [("H100:0", "above 0"), ("H100:x", "above 0"), ("H100:", "above 0"),
                                       ("Z9000:8", "no GPU named 'Z9000'"), (":8", "no GPU named ''"),
                                       ("H10:8", "did you mean")])
def test_a_gpu_the_table_does_not_know_or_a_bad_count_is_a_usage_error(bad, words):
    with pytest.raises(UsageError) as e:
        d.parse_gpu(bad)
    assert words in e.value.message and e.value.code == ExitCode.USAGE


def test_types_are_identified_by_the_apis_gpu_description_then_their_name():
    row, n = gpus.for_lambda_type("A100 (80 GB SXM4)", "gpu_1x_a100_sxm4", 1)
    assert row.id == "a100-sxm4-80gb" and n == 1  # the API's description wins over the name's 40 GB row
    row, n = gpus.for_lambda_type("", "gpu_8x_h100_sxm5", 0)
    assert row.id == "h100-sxm5" and n == 8  # no description: the name (and its count)
    assert gpus.for_lambda_type("Quantum QPU (1 TB)", "gpu_1x_qpu", 1) is None


# -- the order: cheapest first, or the order given -----------------------------------------------------------------
def test_gpu_candidates_are_the_fitting_types_cheapest_first():
    ch = d.choose(types_map(ALL_EAST), d.want_from(gpu="H100:8"))
    assert [c.name for c in ch.candidates] == ["gpu_8x_h100_sxm5", "gpu_8x_h100_sxm5gdr"]  # $23.92, then $35.92
    assert all(c.gpus == 8 and c.gpu == "h100-sxm5" for c in ch.candidates) and not ch.excluded
    one = d.choose(types_map(ALL_EAST), d.want_from(gpu="H100"))
    assert [c.name for c in one.candidates] == ["gpu_1x_h100_pcie", "gpu_1x_h100_sxm5"]  # $2.49, $3.29; no 2x or 8x


def test_types_given_are_tried_in_the_order_given_whatever_their_price_and_case():
    ch = d.choose(types_map(ALL_EAST), d.want_from(types=["GPU_1X_H100_SXM5", "gpu_1x_h100_pcie", "gpu_1x_h100_sxm5"]))
    assert [c.name for c in ch.candidates] == ["gpu_1x_h100_sxm5", "gpu_1x_h100_pcie"]  # listed twice: tried once


def test_an_unknown_type_among_several_is_a_usage_error_with_a_suggestion():
    with pytest.raises(UsageError) as e:
        d.choose(types_map(ALL_EAST), d.want_from(types=["gpu_1x_h100_pcie", "gpu_1x_h100_sxm"]))
    assert "unknown instance type 'gpu_1x_h100_sxm'" in e.value.message and "gpu_1x_h100_sxm5" in e.value.message


def test_regions_per_type_follow_the_requested_order_and_the_listing():
    ch = d.choose(types_map({"gpu_1x_h100_pcie": ["us-west-1", "us-east-1"], "gpu_1x_h100_sxm5": ["us-south-1"]}),
                  d.want_from(gpu="H100", regions=["us-east-1", "us-south-1", "us-west-1"]))
    assert [(c.name, c.regions) for c in ch.candidates] == [("gpu_1x_h100_pcie", ("us-east-1", "us-west-1")),
                                                          ("gpu_1x_h100_sxm5", ("us-south-1",))]


def test_next_attempt_walks_types_in_order_across_their_regions():
    ch = d.choose(types_map({"gpu_1x_h100_pcie": ["us-east-1", "us-west-1"], "gpu_1x_h100_sxm5": ["us-west-1"]}),
                  d.want_from(gpu="H100"))
    cold: set = set()
    seen = []
    while (nxt := d.next_attempt(ch.candidates, cold)) is not None:
        seen.append((nxt[0].name, nxt[1]))
        cold.add(seen[-1])
    assert seen == [("gpu_1x_h100_pcie", "us-east-1"), ("gpu_1x_h100_pcie", "us-west-1"),
                    ("gpu_1x_h100_sxm5", "us-west-1")]


# -- what is left out: price, no price, the template's GPU ---------------------------------------------------------
def test_max_price_leaves_out_the_dearer_types_and_says_why():
    ch = d.choose(types_map(ALL_EAST), d.want_from(gpu="H100:8", max_price=30))
    assert [c.name for c in ch.candidates] == ["gpu_8x_h100_sxm5"]
    assert ch.excluded == (("gpu_8x_h100_sxm5gdr", 35.92, "$35.92/h is over --max-price $30.00"),)
    assert d.choose(types_map(ALL_EAST), d.want_from(gpu="H100:8", max_price=23.92)).candidates  # at the price: in


def test_nothing_under_the_price_is_a_usage_error_before_any_launch():
    want = d.want_from(gpu="H100:8", max_price=10)
    err = d.no_candidate(d.choose(types_map(ALL_EAST), want), want)
    assert isinstance(err, UsageError) and "no instance type fits H100:8 at most $10.00/h" in err.message
    assert "gpu_8x_h100_sxm5: $23.92/h is over --max-price $10.00" in err.message


def test_a_gpu_count_no_type_has_is_a_usage_error():
    want = d.want_from(gpu="H100:3")
    err = d.no_candidate(d.choose(types_map(ALL_EAST), want), want)
    assert isinstance(err, UsageError) and "no instance type has 3 x H100" in err.message
    assert "gpuops cloud types --gpu H100" in err.hint


def test_a_type_without_a_price_is_never_a_candidate_and_alone_it_fails_as_before():
    tmap = types_map(ALL_EAST)
    raw = catalog.instance_type("gpu_1x_h100_pcie")
    del raw["price_cents_per_hour"]  # the emulator's `no-price` fault, as a live answer may be
    tmap.update(api.TypeAvailability.parse_map({"gpu_1x_h100_pcie": {"instance_type": raw,
                                                                     "regions_with_capacity_available": []}}))
    ch = d.choose(tmap, d.want_from(gpu="H100"))
    assert [c.name for c in ch.candidates] == ["gpu_1x_h100_sxm5"]
    want = d.want_from(types=["gpu_1x_h100_pcie"])
    err = d.no_candidate(d.choose(tmap, want), want)
    assert type(err) is GpuopsError and err.code == ExitCode.FAILED
    assert "gives no price for gpu_1x_h100_pcie" in err.message


def test_a_templates_expect_gpu_filters_the_candidates_instead_of_failing_verify():
    sxm = d.want_from(gpu="H100", template={"expect": {"gpu": "H100 SXM", "gpu_count": 8}})
    ch = d.choose(types_map(ALL_EAST), sxm)
    assert [c.name for c in ch.candidates] == ["gpu_1x_h100_sxm5"]  # the cheaper PCIe one is not the template's GPU
    assert ch.excluded[0][0] == "gpu_1x_h100_pcie" and "expect.gpu 'H100 SXM'" in ch.excluded[0][2]
    words = d.want_from(gpu="H100", template={"expect": {"gpu": "H100"}})  # a substring, as verify reads it
    assert len(d.choose(types_map(ALL_EAST), words).candidates) == 2
    a100 = d.want_from(types=["gpu_1x_h100_pcie"], template={"expect": {"gpu": "A100"}})
    err = d.no_candidate(d.choose(types_map(ALL_EAST), a100), a100)
    assert isinstance(err, UsageError) and "not the template's expect.gpu 'A100'" in err.message


def test_a_templates_gpu_memory_is_a_minimum():
    want = d.want_from(gpu="H100", template={"expect": {"gpu_memory_mib": 100_000}})
    ch = d.choose(types_map(ALL_EAST), want)
    assert not ch.candidates and all("under the template's expect.gpu_memory_mib" in why for _, _, why in ch.excluded)


@pytest.mark.parametrize("kw,words", [({"types": ["gpu_1x_a10"], "gpu": "A10"}, "give one of them"),
                                      ({}, "give --type TYPE"), ({"gpu": "H100", "max_price": 0}, "above 0")])
def test_what_to_launch_is_checked_before_anything(kw, words):
    with pytest.raises(UsageError) as e:
        d.want_from(**kw)
    assert words in e.value.message


def test_without_options_every_type_is_listed_cheapest_first():
    ch = d.choose(types_map({}), d.want_from(need_one=False))
    prices = [c.price_cents_per_hour for c in ch.candidates]
    assert prices == sorted(prices) and len(ch.candidates) == len(catalog.TYPES)


# -- waiting ---------------------------------------------------------------------------------------------------
def test_capacity_backoff_is_jittered_grows_and_is_capped():
    low, high = (lambda: 0.0), (lambda: 1.0)
    assert d.capacity_backoff(0, low) == 30 and d.capacity_backoff(0, high) == 60
    assert d.capacity_backoff(1, low) == 45 and d.capacity_backoff(2, low) == 67.5
    assert d.capacity_backoff(10, high) == 240  # at most 4 minutes between reads against Lambda
    assert d.capacity_backoff(3, low, (0.5, 0.5)) == pytest.approx(1.6875)


def test_the_waiting_line_says_what_since_when_and_what_next():
    cands = d.choose(types_map({}), d.want_from(gpu="H100:8", max_price=40)).candidates
    line = d.waiting_line(d.want_from(gpu="H100:8", max_price=40, regions=["us-east-1"]), cands, "14:02:11",
                          150, 45, 3 * 3600)
    assert line == ("waiting for capacity since 14:02:11 (2m30s): H100:8 at most $40.00/h: gpu_8x_h100_sxm5 "
                    "($23.92/h), gpu_8x_h100_sxm5gdr ($35.92/h) in us-east-1; checking again in 45s (3h00m left)")
    one = d.choose(types_map({}), d.want_from(types=["gpu_1x_h100_pcie"])).candidates
    assert d.waiting_line(d.want_from(types=["gpu_1x_h100_pcie"]), one, "09:00:00", 5, 30, 60).startswith(
        "waiting for capacity since 09:00:00 (5s): gpu_1x_h100_pcie in any region;")
    assert "\n" not in line


def test_no_capacity_says_what_was_tried_and_what_was_left_out():
    want = d.want_from(gpu="H100:8", max_price=30)
    ch = d.choose(types_map({}), want)
    text = d.no_capacity_text(want, ch.candidates, ch.excluded, [("gpu_8x_h100_sxm5", "us-east-1")])
    assert text == ("no capacity for H100:8 at most $30.00/h (gpu_8x_h100_sxm5) in any region (tried "
                    "gpu_8x_h100_sxm5 in us-east-1); not tried: gpu_8x_h100_sxm5gdr ($35.92/h is over --max-price "
                    "$30.00)")
    one = d.want_from(types=["gpu_1x_h100_pcie"])
    assert d.no_capacity_text(one, d.choose(types_map({}), one).candidates, (), []) == \
        "no capacity for gpu_1x_h100_pcie in any region (none listed)"


# -- the profile's expect: follows the type launched ------------------------------------------------------------
def test_expect_follows_the_type_launched_over_the_templates_other_expectations():
    itype = api.InstanceType.parse(catalog.instance_type("gpu_8x_h100_sxm5"))
    got = d.launched_expect(itype, {"gpu": "H100", "gpu_count": 1, "driver": "550", "packages": {"torch": "2.5"}})
    assert got == {"gpu": "H100 80GB HBM3", "gpu_count": 8, "driver": "550", "packages": {"torch": "2.5"},
                   "gpu_memory_mib": 79112}
    odd = api.InstanceType.parse({"name": "gpu_2x_qpu", "gpu_description": "QPU", "specs": {"gpus": 2}})
    assert d.launched_expect(odd, {"gpu": "QPU"}) == {"gpu": "QPU", "gpu_count": 2}


@pytest.mark.parametrize("type_name", catalog.available_types())
def test_the_expect_written_for_each_emulated_type_passes_on_its_gpu(type_name):
    """What up writes must hold on the host it launched: the GPU table's words for the type against the name and
    memory the instance's nvidia-smi reports (the sandbox's emulation of that type)."""
    from gpuops.sandbox.nvidia_smi import CATALOG

    model, count = catalog.gpu_of(type_name)
    exp = d.launched_expect(api.InstanceType.parse(catalog.instance_type(type_name)))
    smi = CATALOG[model]
    assert exp["gpu_count"] == count
    assert exp["gpu"].lower() in smi["name"].lower() or gpus.match(exp["gpu"]) == gpus.match(smi["name"])
    assert exp["gpu_memory_mib"] <= smi["memory"]


def test_a_run_is_billed_from_its_launch_not_from_the_wait_for_capacity():
    from gpuops.pipeline import stages as pl

    rec = pl.Record(id="r", profile="run-r", instance_type="", script="train.py", gpu="H100:8", price_per_hour=24.0)
    rec.stage("up").started = 1000.0  # `up` began waiting for capacity here
    assert pl.spend(rec, 1000.0 + 3600) == pytest.approx(24.0)  # launched at once (a record from before the field)
    rec.billed_from = 1000.0 + 1800  # capacity came after half an hour: the instance exists from then
    assert pl.spend(rec, 1000.0 + 3600) == pytest.approx(12.0)
    rec.stage("up").ended = 1000.0 + 2700  # booted a quarter of an hour after the launch
    row = pl.summary(rec, 1000.0 + 3600)[0]
    assert row["seconds"] == 2700 and row["cost"] == pytest.approx(6.0)  # the wait shown, not billed
    assert pl.launch_ask(rec) == {"types": [], "gpu": "H100:8", "max_price": None, "wait_for_capacity_s": 0.0,
                                  "file_systems": []}
    old = pl.Record.from_json({"id": "o", "profile": "run-o", "instance_type": "gpu_1x_a10", "script": "t.py"})
    assert pl.launch_ask(old)["types"] == ["gpu_1x_a10"]  # a record written before --gpu: its one type
