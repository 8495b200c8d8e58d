"""``tiercache-bench serve --kv-transfer-params``: the run's per-request connector control reaches every
request's body, and a bad value is refused naming the flag."""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from tiercache.bench.serve.client import _request
from tiercache.bench.serve.command import config_from_args, configure_parser


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    configure_parser(parser)
    return parser.parse_args(list(argv))


def _bodies(params: dict[str, object]) -> list[dict[str, object]]:
    """The bodies one streamed completion sends (the answer: two tokens, the usage chunk, DONE)."""
    sent: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        lines = [
            {"choices": [{"token_ids": [5, 6]}]},
            {"choices": [], "usage": {"prompt_tokens_details": None}},
        ]
        text = "".join(f"data: {json.dumps(x)}\n\n" for x in lines) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text)

    async def one() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            *_, ids, _cached = await _request(client, "http://engine", "m", [1, 2, 3], 2, params)
            assert ids == [5, 6]

    asyncio.run(one())
    return sent


def test_the_params_reach_every_request_and_none_are_sent_by_default() -> None:
    (body,) = _bodies({"tiercache_skip_save": True})
    assert body["kv_transfer_params"] == {"tiercache_skip_save": True} and body["prompt"] == [1, 2, 3]
    (plain,) = _bodies({})
    assert "kv_transfer_params" not in plain


def test_the_flag_is_a_json_object_or_refused() -> None:
    config = config_from_args(_parse("--kv-transfer-params", '{"tiercache_skip_load": true}'))
    assert dict(config.kv_transfer_params) == {"tiercache_skip_load": True}
    assert dict(config_from_args(_parse()).kv_transfer_params) == {}
    for bad in ("[1]", "{skip"):
        with pytest.raises(argparse.ArgumentError, match="kv-transfer-params"):
            _parse("--kv-transfer-params", bad)
