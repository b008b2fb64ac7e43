"""make bench: how a part's row is judged against its floor and how the plugin's metric is read."""

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from complyroute.enforcement import Endpoint
from experiments import bench


def test_row_within_its_target_is_met_allowed():
    row = bench.Row("compiled engine", "envoy", 0.26, "bare Envoy", 0.20, 1.3)
    assert row.ratio == pytest.approx(1.3) and row.verdict == "met"
    assert row.to_csv()["ratio"] == 1.3


def test_row_over_its_target_is_not_met_denied():
    row = bench.Row("compiled engine", "envoy", 0.27, "bare Envoy", 0.20, 1.3)
    assert row.verdict == "NOT MET"
    assert "NOT MET" in bench.table([row])


def test_row_without_a_floor_has_no_ratio_or_verdict():
    row = bench.Row("bare Envoy", "envoy", 0.2)
    assert row.ratio is None and row.verdict == ""


def serving(text: str):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_plugin_handler_time_is_the_mean_of_its_histogram_allowed():
    server = serving('# HELP x\ngrpc_request_duration_seconds_bucket{handler="check",le="0.001"} 3\n'
                     'grpc_request_duration_seconds_sum{handler="check"} 0.0009\n'
                     'grpc_request_duration_seconds_count{handler="check"} 3\n')
    try:
        assert bench.plugin_handler_ms(f"{Endpoint('127.0.0.1', server.server_port).url}/metrics") == pytest.approx(0.3)
    finally:
        server.shutdown()


def test_plugin_without_performance_metrics_is_an_error_denied():
    server = serving("go_goroutines 12\n")
    try:
        with pytest.raises(RuntimeError, match="enable-performance-metrics"):
            bench.plugin_handler_ms(f"{Endpoint('127.0.0.1', server.server_port).url}/metrics")
    finally:
        server.shutdown()
