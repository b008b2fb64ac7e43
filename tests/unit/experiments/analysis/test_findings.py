"""The findings a report opens with (experiments/analysis/findings.py), on samples whose answer is
known: the median's interval, ties where intervals overlap, saturated cases never ranked, Kendall's
tau against the paper's order, the price of enforcement against the baseline."""

import math

import numpy as np
import pandas as pd
import pytest

from experiments.analysis import findings

REFERENCE = {"w_avg_ms": {"CE": {"100": 37.1}, "DR_3": {"100": 9.0}, "DR_6": {"100": 5.3}, "SA": {"100": 5.2}}}


def test_the_interval_holds_the_median_and_is_the_same_each_time():
    sample = np.arange(1.0, 102.0)  # median 51
    median, low, high = findings.median_interval([sample])
    assert median == 51 and low < 51 < high and high - low < 30
    assert findings.median_interval([sample]) == (median, low, high)  # seeded: a rebuilt report is the same report


def test_repetitions_that_disagree_widen_the_interval_and_repetitions_that_agree_do_not():
    rng = np.random.default_rng(1)
    agreeing = [rng.normal(50, 5, 400), rng.normal(50, 5, 400)]
    disagreeing = [rng.normal(40, 5, 400), rng.normal(60, 5, 400)]
    _, low, high = findings.median_interval(agreeing)
    _, pooled_low, pooled_high = findings.median_interval([np.concatenate(agreeing)])
    assert high - low == pytest.approx(pooled_high - pooled_low, rel=0.5)
    _, low, high = findings.median_interval(disagreeing)
    assert low <= 41 and high >= 59  # over the repetitions, either one could be the case's


def test_one_request_has_no_interval_and_none_has_no_median():
    assert findings.median_interval([np.array([7.0])])[0] == 7 and math.isnan(findings.median_interval([np.array([7.0])])[1])
    assert all(math.isnan(v) for v in findings.median_interval([]))


def cases(*rows):
    return pd.DataFrame([{"topology": t, "engine": e, "rate": 100, "services": 5, "median": m, "low": lo, "high": hi, "saturated": s,
                          "achieved_rate": 100.0, "offered_rate": 100.0, "p99": 10.0, "error_rate": 0.0}
                         for t, e, m, lo, hi, s in rows])


def test_overlapping_intervals_share_a_rank_and_apart_ones_do_not():
    ranked = findings.ranking(cases(
        ("central-entity", "envoy-compiled", 2.0, 1.9, 2.1, False),
        ("dynamic-router-3", "envoy-compiled", 2.05, 2.0, 2.2, False),  # overlaps CE's
        ("sidecar", "envoy-compiled", 5.0, 4.8, 5.2, False),  # apart from both
        ("baseline", "none", 1.0, 0.9, 1.1, False),  # the floor, not ranked among the architectures
    )).set_index("topology")
    assert list(ranked["rank"]) == [1, 1, 3]
    assert ranked.loc["central-entity", "tied_with"] == [("dynamic-router-3", "envoy-compiled")]
    assert ranked.loc["sidecar", "tied_with"] == []


def test_an_overlap_across_ranks_is_named_in_the_report_and_one_within_a_rank_is_not():
    """Overlap is not transitive: CE overlaps SA, SA overlaps DR_3, DR_3 lies clear below CE."""
    from experiments.report.findings_report import ranking_items

    rows = cases(("dynamic-router-3", "envoy-compiled", 15.0, 14.2, 17.0, False),
                 ("sidecar", "envoy-compiled", 17.1, 15.9, 18.2, False),
                 ("central-entity", "envoy-compiled", 20.7, 18.0, 25.9, False))
    ranked = findings.ranking(rows)
    assert list(ranked.set_index("topology").loc[["dynamic-router-3", "sidecar", "central-entity"], "rank"]) == [1, 1, 2]
    line = ranking_items(ranked, rows)[0]
    assert "2. CE (compiled) 20.70 ms [18.00, 25.90] (overlaps SA (compiled))" in line
    assert "1=. DR_3 (compiled) 15.00 ms [14.20, 17.00];" in line  # its tie with SA is said by the shared rank


def test_a_saturated_case_is_never_ranked_but_its_held_twin_is():
    saturated = findings.ranking(cases(("sidecar", "envoy-opa", 1.0, 0.9, 1.1, True), ("central-entity", "envoy-opa", 3.0, 2.9, 3.1, False)))
    held = findings.ranking(cases(("sidecar", "envoy-opa", 1.0, 0.9, 1.1, False), ("central-entity", "envoy-opa", 3.0, 2.9, 3.1, False)))
    assert pd.isna(saturated.set_index("topology").loc["sidecar", "rank"]) and saturated.set_index("topology").loc["central-entity", "rank"] == 1
    assert list(held.set_index("topology").loc[["sidecar", "central-entity"], "rank"]) == [1, 2]


def w_avg(values, saturated=()):
    topologies = ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar"]
    return pd.DataFrame({"topology": topologies, "engine": "envoy-opa", "rate": 100, "w_avg": values,
                         "any_saturated": [t in saturated for t in topologies]})


def test_tau_is_one_for_the_papers_order_and_minus_one_for_its_reverse():
    same = findings.agreement(w_avg([40, 9, 6, 5]), REFERENCE).iloc[0]
    assert same["tau"] == pytest.approx(1) and same["ours"] == ["sidecar", "dynamic-router-6", "dynamic-router-3", "central-entity"]
    reversed_ = findings.agreement(w_avg([1.9, 2.2, 6.6, 28.4]), REFERENCE).iloc[0]
    assert reversed_["tau"] == pytest.approx(-1) and reversed_["architectures"] == 4


def test_a_saturated_architecture_ranks_last_whatever_its_median():
    """Its median is of the records it carried, not of the load it was offered."""
    row = findings.agreement(w_avg([40, 9, 6, 0.1], saturated=("sidecar",)), REFERENCE).iloc[0]
    assert row["ours"] == ["dynamic-router-6", "dynamic-router-3", "central-entity"] and row["saturated"] == ["sidecar"]
    assert row["tau"] == pytest.approx(0)  # SA first in the paper, last here; the other three in its order


def test_a_rate_the_paper_did_not_run_has_no_agreement():
    assert findings.agreement(w_avg([40, 9, 6, 5]).assign(rate=10), REFERENCE).empty


def test_the_price_per_engine_against_the_baseline():
    cpu = pd.DataFrame({
        "topology": ["central-entity", "sidecar", "central-entity", "sidecar", "baseline"],
        "engine": ["envoy-opa", "envoy-opa", "envoy-compiled", "envoy-compiled", "none"],
        "rate": 100, "services": 5, "total_ms": [3.0, 6.0, 2.0, 2.5, 1.0], "baseline_total_ms": [1.0, 1.0, 1.0, 1.0, 1.0],
        "enforcement_per_hop_ms": [0.4, 1.0, 0.2, 0.3, math.nan]})
    opa, compiled = findings.price(cpu)
    assert (opa.engine, opa.ratio_median, opa.ratio_low, opa.ratio_high, opa.lowest, opa.highest) == (
        "envoy-opa", 4.5, 3.0, 6.0, ("central-entity", 100, 5), ("sidecar", 100, 5))
    assert (compiled.ratio_median, compiled.extra_ms_median, compiled.capacity_share) == (2.25, 1.25, None)
    capacity = pd.DataFrame({"topology": ["sidecar", "central-entity", "baseline"], "engine": ["envoy-compiled", "envoy-compiled", "none"],
                             "services": 5, "capacity": [100, 160, 200], "capped": False, "share_of_baseline": [0.5, 0.8, 1.0]})
    priced = findings.price(cpu, capacity)[1]
    assert (priced.capacity_share, priced.capacity_at, priced.baseline_capped) == ((0.5, 0.8), (("sidecar", 5), ("central-entity", 5)), False)
    assert priced.held_nothing == ()
    # a search that held no step has no share: named apart, below the lowest
    nothing = pd.concat([capacity, pd.DataFrame({"topology": ["dynamic-router-3"], "engine": ["envoy-compiled"], "services": [5],
                                                 "capacity": [None], "capped": [False], "share_of_baseline": [None]})], ignore_index=True)
    assert findings.price(cpu, nothing)[1].held_nothing == (("dynamic-router-3", 5),)
    assert findings.price(cpu, nothing)[1].capacity_share == (0.5, 0.8)
    # a baseline that held every step it was offered: its capacity is a floor, so the shares are at most
    capped = capacity.assign(capped=[False, False, True])
    assert findings.price(cpu, capped)[1].baseline_capped and findings.price(cpu, capped)[0].capacity_share is None


LOADS = {"sidecar": ((0.9, "node machine"), (0.05, "sidecar-svc-01/envoy")), "central-entity": ((0.3, "central-entity/opa"), (0.2, "node gateway"))}


BENCH_HEADER = "part,process,value,unit,floor,floor_value,ratio,target,verdict\n"
EVIDENCE_ROWS = (
    '"access log and hop counters (decision through ext_authz): the hop\'s enforcement CPU, Envoy + OPA",envoy-opa/envoy + envoy-opa/opa,'
    '0.75,ms CPU/request,"the same, its Envoy alternately without them",0.6833,1.098,1.05,NOT MET\n'
    '"access log and hop counters (compiled engine): the hop\'s enforcement CPU, Envoy",envoy-compiled/envoy,0.2,ms CPU/request,'
    '"the same, its Envoy alternately without them",0.1333,1.5,1.05,NOT MET\n'
    '"the entry\'s decision and label token, with its decision log: OPA",entry-logged/opa,0.9,ms CPU/request,'
    '"the entry\'s decision and label token through ext_authz (envoy-compiled): OPA",0.6,1.5,,\n')


def test_the_evidence_costs_are_the_benchs_rows_with_and_without_it(tmp_path):
    from experiments.report.findings_report import evidence_text

    bench = tmp_path / "bench.csv"
    bench.write_text(BENCH_HEADER + '"Envoy, router filter only",bare-envoy,0.2,ms CPU/request,,,,,\n' + EVIDENCE_ROWS)
    costs = findings.evidence_costs(bench)
    assert [(cost.ratio, cost.target) for cost in costs] == [(1.098, 1.05), (1.5, 1.05), (1.5, None)]
    text = evidence_text(costs)
    assert ("a deciding hop's access log and hop counters: 1.10× its enforcement CPU without them (decision through ext_authz), "
            "1.50× its enforcement CPU without them (compiled engine), against a target of at most 1.05×") in text
    assert "the entry's decision log: 1.50× its OPA's CPU" in text
    # a bench from before those rows, or none: no sentence
    bench.write_text(BENCH_HEADER + '"Envoy, router filter only",bare-envoy,0.2,ms CPU/request,,,,,\n')
    assert findings.evidence_costs(bench) == [] and evidence_text([]) == ""
    assert findings.evidence_costs(tmp_path / "none.csv") == []


def test_the_models_reason_names_the_machine_when_the_papers_nodes_bring_the_papers_order():
    text = findings.reason(-1.0, 0.67, LOADS, cores=2, longest=10)
    assert text.startswith("the machine: on the paper's nodes the model's order comes near the paper's (τ +0.67, τ -1.00 with ours)")
    assert "SA at 10 services, uses 90% of what this machine's 2 cores can carry" in text and "5% of sidecar-svc-01/envoy" in text


def test_the_models_reason_names_our_costs_when_the_papers_nodes_keep_an_order_unlike_the_papers():
    text = findings.reason(1.0, -0.67, LOADS, cores=2, longest=10)
    assert text.startswith("our parts' costs, not the machine: even on the paper's nodes the model orders the architectures unlike the paper")


def test_the_models_reason_without_enough_ranked_architectures_says_so():
    assert findings.reason(math.nan, math.nan, LOADS, cores=2, longest=10).startswith("too few architectures ranked")


def test_the_models_reason_at_a_rate_the_paper_did_not_run_compares_with_ours_alone():
    assert findings.reason(0.33, math.nan, LOADS, cores=2, longest=5).startswith(
        "the paper has no order here to compare; τ between the model's order and ours +0.33")


def test_an_undefined_tau_says_why_when_every_architecture_saturated_and_only_then():
    from experiments.report.findings_report import agreement_items

    all_saturated = findings.agreement(w_avg([40, 9, 6, 5], saturated=("central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar")),
                                       REFERENCE)
    assert "Kendall's τ = undefined (every architecture saturated, so ours has no order" in agreement_items(all_saturated)[0]
    one = findings.agreement(w_avg([40, 9, 6, 5]).head(1), REFERENCE)  # one architecture: no order to compare, none saturated
    assert "Kendall's τ = undefined over 1 architectures" in agreement_items(one)[0]
