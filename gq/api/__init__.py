"""gq api: the HTTP/JSON API (docs/API.md), a process of its own like Slurm's slurmrestd.

    HTTP client ──Bearer token──> gq api (Starlette on uvicorn) ──CURVE DEALERs──> gqd
                                  gq/api/app.py   gq/api/link.py   relay_endpoint, as an api relay

It holds no state: every request goes to gqd with the caller's token (`as_token`), and gqd
decides who that is (gq/head/tokens.py). Modules: app (endpoints), guard (tokens, rate limits,
errors as JSON), link (the sockets to gqd), stream (output and Server-Sent Events), openapi (the
document, its job schema made from gq/spec.py), main (the process).
"""
