import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane import InvalidName, Scope
from meshplane.core.names import encode_key_segment, validate_name


def test_endpoint_scope_subject_and_keys_match_dynamo():
    scope = Scope.endpoint("probe", "worker", "generate")
    assert scope.subject("kv-events") == "namespace.probe.component.worker.endpoint.generate.kv-events"
    assert scope.subject_prefix == "namespace.probe.component.worker.endpoint.generate"
    assert scope.channel_key("forward-pass-metrics", 6638353960351422) == (
        "v1/event_channels/namespace/probe/component/worker/endpoint/generate/topic/forward-pass-metrics/"
        "17958c39b336be"
    )


def test_component_and_namespace_scopes_drop_their_missing_parts():
    assert Scope.component("ns", "c").subject("t") == "namespace.ns.component.c.t"
    assert Scope.namespace("ns").subject("t") == "namespace.ns.t"
    assert (
        Scope.component("ns", "c").channel_key("t", 255)
        == "v1/event_channels/namespace/ns/component/c/topic/t/ff"
    )
    assert Scope.namespace("ns").channel_key("t", 1) == "v1/event_channels/namespace/ns/topic/t/1"


def test_key_segments_are_percent_encoded_outside_the_safe_set():
    assert encode_key_segment("a_b-C9") == "a_b-C9"
    assert encode_key_segment("a:b~c") == "a%3Ab%7Ec"
    assert encode_key_segment("é") == "%C3%A9"


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "a*", "a>", "a/b", "tab\t", "nul\x00", "x" * 256, 5, None])
def test_invalid_names_are_rejected_with_a_reason(bad):
    with pytest.raises(InvalidName):
        validate_name("topic", bad)


def test_endpoint_without_component_is_rejected():
    with pytest.raises(InvalidName, match="needs a component"):
        Scope("ns", None, "ep")


def test_parse_cli_spelling():
    assert Scope.parse("a/b/c") == Scope.endpoint("a", "b", "c")
    assert Scope.parse("a/b") == Scope.component("a", "b")
    assert Scope.parse("a") == Scope.namespace("a")
    assert str(Scope.parse("a/b/c")) == "a/b/c"
    with pytest.raises(InvalidName):
        Scope.parse("a/b/c/d")


@given(st.text(min_size=1, max_size=50))
def test_every_name_is_either_rejected_or_safe_in_subjects_and_keys(name):
    try:
        validate_name("topic", name)
    except InvalidName:
        return
    subject = Scope.namespace("ns").subject(name)
    assert subject.count(".") == 2  # the name never adds a subject token
    assert "/" not in encode_key_segment(name)
