"""The demo's embedded export targets (laminar_assets/deploy/embedded_targets.py), without Spark: a connection
the environment defines is used as it is, and the local receiver stores what it gets until it is stopped. The
embedded Postgres is exercised by the demo's test (tests/cli/test_cli.py), which reads back what it delivered."""

from __future__ import annotations

import json
import socket
import urllib.request

from laminar_assets.deploy.embedded_targets import embedded_folder, missing_connections, start_embedded_targets
from laminar_assets.flows import load_exports

EXPORTS = load_exports()


def test_a_connection_the_environment_defines_is_used_as_it_is(tmp_path):
    environ = {"LAMINAR_CONNECTION_ANALYTICS_URL": "postgresql://etl@db.internal/marts",
               "LAMINAR_CONNECTION_ALERTS_URL": "https://alerts.example.com/hook"}
    assert missing_connections(EXPORTS, environ) == {}
    with start_embedded_targets(EXPORTS, str(tmp_path / "embedded"), environ=environ) as targets:
        assert targets.targets == [] and not (tmp_path / "embedded").exists()
    assert environ == {"LAMINAR_CONNECTION_ANALYTICS_URL": "postgresql://etl@db.internal/marts",
                       "LAMINAR_CONNECTION_ALERTS_URL": "https://alerts.example.com/hook"}
    assert missing_connections(EXPORTS, {}) == {"analytics": "postgres", "alerts": "webhook"}


def test_the_receiver_stores_each_request_and_is_gone_after_stop(tmp_path):
    hooks = [e for e in EXPORTS if e.kind == "webhook"]
    environ: dict[str, str] = {}
    with start_embedded_targets(hooks, str(tmp_path / "embedded"), environ=environ, fresh=True) as targets:
        url = environ["LAMINAR_CONNECTION_ALERTS_URL"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/alerts")
        body = {"op": "insert", "row": {"trade_id": 7}}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Idempotency-Key": "k1", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        path = targets.received_file("alerts")
        assert path == str(tmp_path / "embedded" / "webhooks" / "alerts.jsonl")
        assert "embedded receiver" in targets.where("alerts") and path in targets.where("alerts")
    [line] = open(path).read().splitlines()
    assert {k: v for k, v in json.loads(line).items() if k != "received_at"} == {"idempotency_key": "k1", "body": body}
    assert environ == {}  # the variable it set is gone
    port = int(url.split(":")[2].split("/")[0])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # stopped: nothing listens there


def test_each_lake_has_its_own_folder_beside_it(tmp_path):
    assert embedded_folder(str(tmp_path / "lake")) == str(tmp_path / "embedded" / "lake")
    assert embedded_folder(str(tmp_path / "quality")) == str(tmp_path / "embedded" / "quality")
    # a lake in a bucket: in the folder the command keeps this machine's files in, named by bucket and prefix
    assert embedded_folder("s3://laminar-demo/lake", machine_folder=str(tmp_path)) == \
        str(tmp_path / "embedded" / "laminar-demo-lake")
