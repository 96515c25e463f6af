"""What the results file keeps of a failure's message, and the facts a report carries beside it."""

import json

from opcheck.failure_facts import FAILURE_PROPERTY, FailureFacts, facts_of
from opcheck.report.failure import MESSAGE_LIMIT, kept_message


def test_kept_message_drops_a_one_line_message_and_cuts_a_huge_one():
    assert kept_message("AssertionError: boom\n") == ""
    assert kept_message("Error: first\nsecond\n") == "Error: first\nsecond"
    huge = "Error: first\n" + "x" * (2 * MESSAGE_LIMIT)
    kept = kept_message(huge)
    assert kept.startswith("Error: first\nxxx")
    assert kept.endswith(f"\n... ({len(huge) - MESSAGE_LIMIT:,} more characters)")
    assert len(kept) < MESSAGE_LIMIT + 100


def test_facts_travel_as_a_json_string_and_come_back_equal():
    facts = FailureFacts(worst="d output 0 / d input 1, d out[2] / d in[0]: ü", hints=("a", "b"), inputs=(1, 3))
    name, value = facts.to_property()
    assert name == FAILURE_PROPERTY and isinstance(value, str)
    json.loads(value)  # a plain string property: JUnit XML and xdist carry it
    assert FailureFacts.from_properties([("opcheck_margin", "0.5 x"), (name, value)]) == facts


def test_a_report_without_facts_or_with_broken_ones_has_empty_facts():
    assert not FailureFacts.from_properties([])
    assert not FailureFacts.from_properties(None)
    assert not FailureFacts.from_properties([(FAILURE_PROPERTY, "{not json")])
    assert not FailureFacts.from_properties([(FAILURE_PROPERTY, '{"inputs": ["x"]}')])


def test_adding_keeps_each_hint_and_input_once_in_order():
    facts = FailureFacts(hints=("a",), inputs=(2,)).adding(hints=("b", "a"), inputs=(0, 2))
    assert (facts.hints, facts.inputs) == (("a", "b"), (2, 0))


def test_an_exception_without_facts_has_empty_ones():
    assert facts_of(ValueError("hint: x")) == FailureFacts()
    assert facts_of(None) == FailureFacts()
    error = AssertionError("x")
    error.facts = "not facts"  # type: ignore[attr-defined]
    assert facts_of(error) == FailureFacts()
