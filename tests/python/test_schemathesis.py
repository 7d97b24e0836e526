"""schemathesis against the running server with openapi.yaml: every response
must conform to the document (status, content type, body), and no generated
case may crash or hang the server."""

import json
import os
import subprocess
import sys
import urllib.request

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CASES_PER_OPERATION = os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40")


def call(server, method, path, body=None, key=True):
    request = urllib.request.Request(server.url + path, method=method, data=None if body is None else json.dumps(body).encode())
    if key:
        request.add_header("X-Service-API-Key", server.key)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_every_response_conforms_to_the_document(server, tmp_path):
    # An index the generated cases can hit, besides the names they make up.
    assert call(server, "PUT", "/api/v1/indexes/docs/create", {"dimensions": 3, "metric": "l2"})[0] == 200
    st = os.path.join(os.path.dirname(sys.executable), "st")
    report = subprocess.run(
        [
            st, "run", os.path.join(ROOT, "openapi.yaml"),
            "--url", server.url,
            "--header", f"X-Service-API-Key: {server.key}",
            "--checks", "status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples", CASES_PER_OPERATION,
            "--request-timeout", "10",
            "--seed", "1",
            "--no-color",
        ],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    print(report.stdout[-6000:])
    assert report.returncode == 0, report.stdout[-6000:] + report.stderr[-2000:]
    # The server lived through it and still answers.
    status, health = call(server, "GET", "/api/v1/health", key=False)
    assert (status, health["message"]) == (200, "healthy")
