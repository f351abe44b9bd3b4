"""What dcgm-exporter adds to a reading: the Xid a GPU last reported (NVML keeps none) and its error
counters, from recorded scrapes in the exporter's own format; an exporter that cannot be read costs
a log line, never the health check; and the health agent, as a process against the real API server,
reports an Xid only the exporter saw."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from superkube.agents import gpu_probe
from superkube.agents import node_health as nh
from superkube.agents.kubeapi import Kube
from superkube.cli import app
from superkube.harness.apiserver import LocalApi
from superkube.model.spec import POOL_LABEL
from tests.agents.conftest import make_node, unique
from tests.agents.test_node_health import free_port, run_agent, verdict_of

READINGS = Path(__file__).parent / "readings"
HEALTHY = READINGS / "healthy.json"
SCRAPE = (READINGS / "dcgm-healthy.prom").read_text()


def with_value(field: str, gpu: int, value: float) -> str:
    """The healthy scrape with one GPU's field set to `value`."""
    lines = []
    for line in SCRAPE.splitlines():
        if line.startswith(f'{field}{{gpu="{gpu}",'):
            line = f"{line.rsplit(' ', 1)[0]} {value:g}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def merged(text: str) -> gpu_probe.Verdict:
    return gpu_probe.verdict(gpu_probe.merge_dcgm(gpu_probe.load_reading(HEALTHY), text))


def test_a_healthy_scrape_keeps_a_healthy_reading_healthy() -> None:
    assert merged(SCRAPE).level == "healthy"
    assert gpu_probe.merge_dcgm(gpu_probe.load_reading(HEALTHY), SCRAPE) == gpu_probe.load_reading(HEALTHY)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("DCGM_FI_DEV_XID_ERRORS", 79, "Xid 79"),
        ("DCGM_FI_DEV_XID_ERRORS", 48, "Xid 48"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2, "uncorrectable ECC"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, "remap"),
        ("DCGM_FI_DEV_RETIRED_PENDING", 1, "retire"),
    ],
)
def test_what_only_the_exporter_saw_makes_the_node_fatal(field: str, value: float, reason: str) -> None:
    result = merged(with_value(field, 3, value))
    assert result.level == "fatal"
    fatal = [f for f in result.findings if f.level == "fatal"]
    assert (
        fatal and all(f.gpu == 3 for f in fatal) and any(reason.lower() in f.reason.lower() for f in fatal)
    ), fatal


def test_an_application_xid_from_the_exporter_is_a_warning() -> None:
    assert merged(with_value("DCGM_FI_DEV_XID_ERRORS", 5, 13)).level == "warning"


def test_gpus_the_exporter_names_but_nvml_does_not_see_are_not_invented() -> None:
    extra = SCRAPE + 'DCGM_FI_DEV_XID_ERRORS{gpu="8",UUID="GPU-x",device="nvidia8"} 79\n'
    reading = gpu_probe.merge_dcgm(gpu_probe.load_reading(HEALTHY), extra)
    assert [g.index for g in reading.gpus] == list(range(8)) and merged(extra).level == "healthy"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('DCGM_FI_DEV_XID_ERRORS{gpu="zero"} 79\n', "gpu label 'zero' is not an index"),
        ("DCGM_FI_DEV_XID_ERRORS{gpu=0} 79\n", "not Prometheus text format"),
    ],
)
def test_a_malformed_scrape_is_one_line(text: str, words: str, tmp_path: Path) -> None:
    with pytest.raises(gpu_probe.ReadingError, match=words):
        merged(text)
    path = tmp_path / "scrape.prom"
    path.write_text(text)
    result = CliRunner().invoke(app, ["health", "explain", str(HEALTHY), "--dcgm", str(path)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert words in result.output


def test_explain_merges_a_saved_scrape() -> None:
    result = CliRunner().invoke(
        app, ["health", "explain", str(HEALTHY), "--dcgm", str(READINGS / "dcgm-xid-79-gpu3.prom")]
    )
    assert result.exit_code == 1 and "Xid 79" in result.output, result.output


# --- the health agent as a process, reading the exporter over HTTP --------------------------------


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[str]]]:
    """A loopback endpoint serving a scrape; the test sets what it serves."""
    served = [SCRAPE]

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = served[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", served
    server.shutdown()
    server.server_close()


def finish(proc: subprocess.Popen[str]) -> str:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def on_server(api: LocalApi, node: str) -> str:
    """The verdict the API server holds for `node`."""
    return str(
        Kube(str(api.kubeconfig)).node(node)["metadata"].get("annotations", {}).get(nh.VERDICT_ANNOTATION, "")
    )


def test_the_agent_reports_an_xid_only_the_exporter_saw(
    api: LocalApi, exporter: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, served = exporter
    served[0] = (READINGS / "dcgm-xid-79-gpu3.prom").read_text()
    node = unique("dcgm")
    make_node(api, node, {POOL_LABEL: "gpu"})
    proc, _ = run_agent(api.kubeconfig, HEALTHY, "--dcgm-url", url, node_name=node)
    finish(proc)
    assert on_server(api, node).startswith("fatal: GPU 3: Xid 79")


def test_an_exporter_that_cannot_be_read_costs_a_log_line_not_the_check(
    api: LocalApi, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    node = unique("dcgm")
    make_node(api, node, {POOL_LABEL: "gpu"})
    proc, _ = run_agent(api.kubeconfig, "xid-79-off-the-bus", "--dcgm-url", dead, node_name=node)
    err = finish(proc)
    assert "dcgm-exporter not read" in err
    assert on_server(api, node) == nh.note(
        verdict_of("xid-79-off-the-bus", node)
    )  # NVML's finding still reported
