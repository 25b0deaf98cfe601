"""gq api's OpenAPI document (issue 19, done-when 2): the served one is the one kept in the repo,
its job schema is gq/spec.py's declaration, and Schemathesis, reading it, finds no 5xx and no
response off the schema in the live API (real gqd, gqnode and gq api)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from gq import spec
from gq.api import openapi
from gq.model import JobSpec
from tests.apisite import ApiSite, api_cluster
from tests.conftest import prepare

KEPT = Path(__file__).parent.parent / "docs" / "openapi.json"
#: Examples per operation (GQ_API_EXAMPLES): eleven operations take seconds at 25 each.
EXAMPLES = int(os.environ.get("GQ_API_EXAMPLES", "25"))


def test_the_kept_document_is_the_generated_one() -> None:
    assert json.loads(KEPT.read_text()) == openapi.document(), \
        "docs/openapi.json is stale: python -m gq.api.openapi > docs/openapi.json"


def test_the_job_schema_is_gq_specs_declaration() -> None:
    schema = openapi.document()["components"]["schemas"]["JobSpec"]
    props = schema["properties"]
    declared = {f.name for f in spec.FIELDS} - openapi.CALLER_FIELDS
    assert set(props) == declared | {openapi.WRAP}
    assert set(JobSpec.__dataclass_fields__) - {"user", "uid", "gid"} == declared
    for field in spec.FIELDS:
        if field.name in openapi.CALLER_FIELDS:
            continue
        prop = props[field.name]
        if field.bounds is not None:
            assert (prop["minimum"], prop["maximum"]) == field.bounds, field.name
        assert prop.get("nullable", False) == (spec.NONE in field.types), field.name
        if not field.required:
            assert prop["default"] == field.default, field.name
    gpus = props["gpus"]
    assert gpus["type"] == "integer" and gpus["description"].startswith("GPUs per node")
    assert props["time_limit_s"]["description"].startswith("time limit")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiSite]:
    live = prepare(tmp_path_factory.mktemp("schema"))
    with api_cluster(live) as site:
        # Nothing Schemathesis submits may run (its scripts are random text): the only node is
        # drained, so its jobs stay queued.
        with site.live.client() as c:
            c.drain(["node1"], "schemathesis")
        yield site


@pytest.fixture(scope="module")
def token(site: ApiSite) -> str:
    return site.token(name="schemathesis")


CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance]


def test_the_live_api_keeps_to_its_document(site: ApiSite, token: str) -> None:
    """Each operation with EXAMPLES generated requests (Schemathesis' strategies, run by
    hypothesis here: its pytest plugin does not know this pytest)."""
    served = schemathesis.openapi.from_url(f"{site.url}/openapi.json")
    served.config.update(base_url=site.url)
    headers = {"Authorization": f"Bearer {token}"}
    operations = [result.ok() for result in served.get_all_operations()]
    assert len(operations) == 11

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            sent = dict(headers)
            if case.path == "/v1/events":
                sent["Accept"] = "application/json"  # a page, not a stream without end
            if case.query and "follow" in case.query:
                case.query["follow"] = "false"  # a queued job's output is followed for ever
            case.call_and_validate(headers=sent, checks=CHECKS, timeout=30)
        run()
