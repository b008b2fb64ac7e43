"""experiments profile: how `go tool pprof -traces` output is read into samples, how a sample is
given to a part (the first of PARTS with a function on its stack, else other) and how a part's
share of the sampled CPU becomes ms of the process's CPU per decision."""

import pytest

from experiments.run import profile

TRACES = """File: opa
Type: cpu
Duration: 30s, Total samples = 60ms ( 0.20%)
-----------+-------------------------------------------------------
      20ms   runtime.pcvalue
             runtime.copystack
             runtime.newstack
             github.com/open-policy-agent/opa/v1/topdown.builtinJWTEncodeSign
-----------+-------------------------------------------------------
      30ms   crypto/ecdsa.Sign
             github.com/open-policy-agent/opa/v1/topdown.builtinJWTEncodeSign
             github.com/open-policy-agent/opa/v1/topdown.(*eval).evalCall
-----------+-------------------------------------------------------
      10ms   runtime.futex
             runtime.findRunnable
-----------+-------------------------------------------------------
"""
SIGNING = "label token: io.jwt.encode_sign (key parsing, ES256)"
GROWTH = "goroutine stack growth (each check's goroutine grows its stack through the evaluation)"


def test_every_sample_is_read_with_its_value_and_stack():
    sampled = profile.samples(TRACES)
    assert [seconds for seconds, _ in sampled] == pytest.approx([0.02, 0.03, 0.01])
    assert sampled[1][1] == ["crypto/ecdsa.Sign", "github.com/open-policy-agent/opa/v1/topdown.builtinJWTEncodeSign",
                             "github.com/open-policy-agent/opa/v1/topdown.(*eval).evalCall"]


def test_a_sample_goes_to_the_first_part_on_its_stack():
    parts = profile.by_part(profile.samples(TRACES))
    # The stack that grew inside the signing is the stack's growth, the signing's own work the token's.
    assert parts[GROWTH] == pytest.approx(0.02) and parts[SIGNING] == pytest.approx(0.03)


def test_a_sample_of_no_part_is_other_denied_twin():
    parts = profile.by_part(profile.samples(TRACES))
    assert parts[profile.OTHER] == pytest.approx(0.01)
    assert "policy evaluation (topdown), but the token's signature" not in parts


def test_a_part_is_its_share_of_the_sampled_cpu_per_decision():
    window = profile.OpaWindow("central-entity", cpu_s=1.2, decisions=1000, sampled_s=0.06,
                               parts_s=profile.by_part(profile.samples(TRACES)))
    assert window.ms_per_decision == pytest.approx(1.2)
    assert window.part_ms(SIGNING) == pytest.approx(0.6)
    assert window.part_ms("garbage collection") == 0.0
    table = profile.table([window])
    assert f"| {SIGNING} | 0.600 | 50.0% |" in table
    assert "| **total (process CPU, psutil)** | **1.200** |  |" in table


CPU_ROWS = [  # loader.CpuSampler's cumulative seconds, one row a second
    {"t_ms": "1000", "service_s": "1.0", "envoy_s": "0.5", "opa_s": "0.2", "control_s": "0.01"},
    {"t_ms": "2000", "service_s": "1.3", "envoy_s": "0.7", "opa_s": "0.3", "control_s": "0.01"},
    {"t_ms": "3000", "service_s": "1.6", "envoy_s": "0.9", "opa_s": "0.4", "control_s": "0.02"},
]


def requests_at(*sends: tuple[float, str]) -> list[dict]:
    return [{"t_send_ms": str(t), "status": status} for t, status in sends]


def test_the_deployments_cpu_is_per_record_delivered_between_the_windows_samples_allowed():
    # 100 records delivered between the samples at 1,000 and 3,000 ms; one before, one after and a 503 do not count.
    sent = requests_at(*[(1000 + 20 * i, "200") for i in range(100)], (900, "200"), (3000, "200"), (1500, "503"))
    per_record, delivered = profile.cpu_by_kind(CPU_ROWS, sent, 950, 3050)
    assert delivered == 100
    assert per_record == pytest.approx({"services": 6.0, "Envoys": 4.0, "OPAs": 2.0, "control plane (bundle server)": 0.1})
    table = profile.kinds_table(per_record, delivered)
    assert "| Envoys | 4.000 |" in table and "| **the deployment** | **12.100** |" in table


def test_a_window_without_two_cpu_samples_is_an_error_denied():
    with pytest.raises(ValueError, match="fewer than two CPU samples"):
        profile.cpu_by_kind(CPU_ROWS, requests_at((1500, "200")), 1500, 2500)
