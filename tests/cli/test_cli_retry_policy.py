"""``dledger consumer retry-policy`` without a cluster: what it refuses before reaching one (each
refusal named), and how it prints each broker group's answer. Its live use is in
``tests/frontends/test_grpc_retry_policy.py``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import cli
from cli.consumers.retry_policy import policy_lines


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli.main, ["consumer", "retry-policy", "--namesrv", "127.0.0.1:1",
                                        *args])
    return res.exit_code, res.output


@pytest.mark.parametrize("value", ["0", "10001", "-3", "two"])
def test_a_bad_number_of_attempts_is_refused_before_any_request(value: str) -> None:
    code, out = run("g", "--max-delivery-attempts", value)
    assert code == 2 and "Invalid value for '--max-delivery-attempts'" in out


def test_setting_and_clearing_at_once_or_without_a_group_is_refused() -> None:
    code, out = run("g", "--max-delivery-attempts", "3", "--default")
    assert code == 2 and "give --max-delivery-attempts N or --default, not both" in out
    code, out = run("--default")
    assert code == 2 and "name the consumer GROUP whose retry policy to set" in out


def test_no_nameserver_answering_is_one_line_not_a_traceback() -> None:
    code, out = run("g")
    assert code == 1 and "Traceback" not in out and out.startswith("Error:")


def test_each_broker_groups_answer_is_one_line_per_consumer_group() -> None:
    set_ = {"default_max_delivery_attempts": 16,
            "groups": [{"group": "g", "max_delivery_attempts": 2}]}
    unset = {"default_max_delivery_attempts": 16, "groups": []}
    assert policy_lines("a", "g", set_) == ["a: g: max delivery attempts 2"]
    assert policy_lines("b", "g", unset) == ["b: g: max delivery attempts 16 (the broker's default)"]
    assert policy_lines("b", "", unset) == [
        "b: no consumer group has a setting (the broker's default: 16)"]
