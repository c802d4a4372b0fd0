"""The pure-Python copy of the Rust contracts (extproc.contracts) cannot drift from the extension."""

from __future__ import annotations

from pathlib import Path

from extproc import _native, contracts, envoy_bootstrap


def test_the_generated_block_is_what_the_extension_exports() -> None:
    source = Path(contracts.__file__).read_text()
    assert contracts.render(source, _native) == source, "run: python -m extproc.contracts --write"
    for name, value in contracts.exported(_native).items():
        assert getattr(contracts, name) == value, name


def test_envoy_strips_every_header_a_client_could_route_with() -> None:
    config = envoy_bootstrap.build_bootstrap(envoy_bootstrap.EnvoyOptions())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    removed = [m["remove"] for m in hcm["early_header_mutation_extensions"][0]["typed_config"]["mutations"]]
    assert removed == list(_native.CLIENT_HEADERS_REMOVED)
    assert _native.DESTINATION_HEADER in removed and _native.MAX_RETRIES_HEADER in removed
