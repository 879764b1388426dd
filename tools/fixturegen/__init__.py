"""Generators for mlaserve's committed reference fixtures (tiny random MLA models).

Entry point: tools/make_fixtures.py. Every module here is deterministic given its seeds; the
exact settings used are recorded in tests/fixtures/models/<name>/manifest.json.
"""
