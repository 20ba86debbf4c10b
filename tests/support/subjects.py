"""Hypothesis pools of subject words and patterns (wildcards included), small enough to collide."""

from __future__ import annotations

from hypothesis import strategies as st

WORDS = st.sampled_from(["a", "b", "c", "$g"])
PATTERN_TOKENS = st.sampled_from(["a", "b", "c", "$g", "*"])
# '#' and '>' only end a pattern.
PATTERNS = (
    st.tuples(st.lists(PATTERN_TOKENS, min_size=0, max_size=6), st.sampled_from(["", "", ">", "#"]))
    .filter(lambda p: p[0] or p[1])
    .map(lambda p: ".".join([*p[0], p[1]] if p[1] else p[0]))
)
